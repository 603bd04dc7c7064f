"""A stateless gateway in front of two workers on the real Redis, through the official async openai client."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from actors.http.backends import RemoteBackend
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.tool_templates import HERMES
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis


@pytest.fixture
def gateway_backend(default_model_path: Path, prefix: str) -> RemoteBackend:
    return RemoteBackend(REDIS_URL, prefix, default_model_path.name, load_tokenizer(default_model_path))


async def test_gateway_in_front_of_two_workers(default_model_path: Path, prefix: str,
                                               gateway_backend: RemoteBackend) -> None:
    model = gateway_backend.model_name
    async with running_workers(default_model_path, prefix, count=2):
        with serving(gateway_backend, GatewayOptions(api_key=API_KEY, worker_timeout_s=30)) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            completions = await asyncio.gather(*(client.completions.create(
                model=model, prompt=f"Prompt {i}", max_tokens=8, temperature=0.8, seed=i, n=2, logprobs=1)
                for i in range(4)))
            for completion in completions:
                assert [c.finish_reason for c in completion.choices] == ["length", "length"]
                assert completion.usage.completion_tokens == 16
                assert all(len(c.logprobs.tokens) == 8 for c in completion.choices)
            again = await client.completions.create(model=model, prompt="Prompt 0", max_tokens=8, temperature=0.8,
                                                    seed=0, n=2, logprobs=1)
            assert [c.text for c in again.choices] == [c.text for c in completions[0].choices]

            messages = [{"role": "user", "content": "Hello"}]
            whole = await client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
            stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                                          temperature=0, stream=True,
                                                          stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
                whole.choices[0].message.content
            assert chunks[-1].usage.completion_tokens == 8

            with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the worker's refusal, as a 400
                await client.completions.create(model=model, prompt="x", max_tokens=100_000)
            with pytest.raises(openai.NotFoundError):
                await client.completions.create(model="other-model", prompt="x")
            tokens = httpx.post(f"{base_url[:-3]}/tokenize", json={"prompt": "Hello"},
                                headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"]
            assert tokens == load_tokenizer(default_model_path).encode("Hello")
            await client.close()


async def test_gateway_retry_attaches_and_disconnect_cancels(default_model_path: Path, prefix: str,
                                                            gateway_backend: RemoteBackend) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with running_workers(default_model_path, prefix, count=1) as (_, engines):
        scheduler = engines[0].scheduler
        with serving(gateway_backend, GatewayOptions(api_key=API_KEY)) as base_url:
            async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as http:
                body = {"prompt": "Twice", "max_tokens": 6}
                first = await http.post("/completions", json=body, headers={"X-Request-Id": "twice-1"})
                generated = scheduler.num_generated_tokens
                second = await http.post("/completions", json=body, headers={"X-Request-Id": "twice-1"})
                assert second.json()["choices"] == first.json()["choices"]
                assert scheduler.num_generated_tokens == generated

                long_body = {"prompt": "Run long", "max_tokens": 1500, "ignore_eos": True, "stream": True}
                async with http.stream("POST", "/completions", json=long_body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            break
                deadline = time.monotonic() + 15
                while (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert not scheduler.running and not scheduler.waiting
                assert scheduler.num_generated_tokens - generated < 1500
                assert scheduler.kv_cache.pool.num_used_blocks == 0


async def test_with_no_worker_alive_the_gateway_answers_503_after_the_worker_timeout(
        gateway_backend: RemoteBackend) -> None:
    with serving(gateway_backend, GatewayOptions(worker_timeout_s=0.3)) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            await client.completions.create(model=gateway_backend.model_name, prompt="anyone?", max_tokens=2)
        assert raised.value.status_code == 503
        await client.close()


async def test_tools_travel_to_the_worker_that_renders_them(default_model_path: Path, prefix: str,
                                                          gateway_backend: RemoteBackend) -> None:
    """Tools and tool-call messages cross Redis on the wire; the worker's template renders them (the
    prompt's token count is transformers' own), and the gateway parses the answer into tool_calls."""
    weather = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                {"role": "user", "content": "And in Lima?"}]
    call = '<tool_call>{"name": "weather", "arguments": {"city": "Lima"}}</tool_call>'
    hf_call = {**messages[1]["tool_calls"][0], "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    hf_messages = [messages[0], {**messages[1], "tool_calls": [hf_call]}, *messages[2:]]
    expected = AutoTokenizer.from_pretrained(str(default_model_path)).apply_chat_template(
        hf_messages, tools=[weather], chat_template=HERMES, add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"]
    async with running_workers(default_model_path, prefix, count=1, chat_template=HERMES):
        options = GatewayOptions(api_key=API_KEY, tool_call_parser="hermes")
        with serving(gateway_backend, options) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            answer = await client.chat.completions.create(
                model=gateway_backend.model_name, messages=messages, tools=[weather], max_tokens=64,
                extra_body={"guided_regex": re.escape(call)})
            await client.close()
    [tool_call] = answer.choices[0].message.tool_calls
    assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == ("weather", {"city": "Lima"})
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.usage.prompt_tokens == len(expected)


@pytest.mark.parametrize("body, field", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, -1, 3]}, "prompt_token_ids[1]"),
    ({"prompt": ["fine", ""]}, "prompt"),
])
async def test_what_the_wire_codec_refuses_is_a_400_at_the_gateway(gateway_backend: RemoteBackend, body: dict,
                                                                    field: str) -> None:
    """The gateway runs the codec's checks on the requests it builds, before it encodes them (no worker
    needed: nothing is queued)."""
    with serving(gateway_backend, GatewayOptions()) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            answer = await client.post("/completions", json={"max_tokens": 2, **body})
            kobold = await client.post(base_url.removesuffix("/v1") + "/api/v1/generate",
                                       json={"prompt": "", "max_length": 2})
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["error"]["message"]
    assert kobold.status_code == 400, kobold.text
