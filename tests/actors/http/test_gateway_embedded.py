"""`aqueduct serve` embedded (the actor graph in-process, built-in model) through the official openai client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from tqdm import tqdm

from actors.cli.batch import read_batch_file, run_offline, write_results
from actors.http.backends import EmbeddedBackend
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY

PROMPTS = ["The quick brown fox", "Once upon a time", "1, 2, 3,"]


def test_models_lists_the_served_model(client: openai.OpenAI, model: str) -> None:
    assert [entry.id for entry in client.models.list()] == [model]


def test_completion_with_n_logprobs_and_usage(model: str, client: openai.OpenAI) -> None:
    completion = client.completions.create(model=model, prompt="Hello there", max_tokens=6, n=2,
                                           temperature=1.0, seed=7, logprobs=2)
    assert [choice.index for choice in completion.choices] == [0, 1]
    for choice in completion.choices:
        assert choice.finish_reason == "length"
        assert len(choice.logprobs.tokens) == 6 and len(choice.logprobs.token_logprobs) == 6
        assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs)
    assert completion.usage.completion_tokens == 12 and completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12


def test_seed_reproduces_and_streaming_concatenates_to_the_same_text(model: str, client: openai.OpenAI) -> None:
    kwargs = {"model": model, "prompt": "Seeded", "max_tokens": 12, "temperature": 0.9, "seed": 1234}
    first, second = (client.completions.create(**kwargs).choices[0].text for _ in range(2))
    assert first == second
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == first
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_stream_and_non_stream_agree_with_stop_strings(model: str, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Say something"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and text
    streamed = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10,
                                              temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == text
    stop = text[len(text) // 2:][:2]
    stopped = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0,
                                             stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[:text.index(stop)]


def test_streamed_completion_logprobs_cover_every_token(model: str, client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=model, prompt="Log", max_tokens=5, logprobs=1, stream=True))
    tokens = [token for chunk in chunks for token in chunk.choices[0].logprobs.tokens]
    assert len(tokens) == 5
    offsets = [offset for chunk in chunks for offset in chunk.choices[0].logprobs.text_offset]
    assert offsets == sorted(offsets) and offsets[0] == 0  # offsets continue across chunks


def test_chat_logprobs(model: str, client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(entry.top_logprobs) == 2 for entry in content)


def test_errors_map_to_the_openai_exceptions(model: str, embedded: tuple[str, EmbeddedBackend],
                                             client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=model, prompt="x", temperature=-1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # more than the context: the engine says so
        client.completions.create(model=model, prompt="x", max_tokens=100_000)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=embedded[0], api_key="wrong", max_retries=0).models.list()


async def test_async_client_streams_chat(model: str, embedded: tuple[str, EmbeddedBackend]) -> None:
    client = openai.AsyncOpenAI(base_url=embedded[0], api_key=API_KEY, max_retries=0)
    stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hey"}],
                                                  max_tokens=5, temperature=0, stream=True)
    finishes = [chunk.choices[0].finish_reason async for chunk in stream if chunk.choices]
    assert finishes[-1] == "length"
    await client.close()


def test_a_retried_request_id_attaches_instead_of_generating_again(model: str, embedded: tuple[str, EmbeddedBackend],
                                                                   client: openai.OpenAI) -> None:
    scheduler = embedded[1].engine.scheduler
    kwargs = {"model": model, "prompt": "Retry me", "max_tokens": 8, "extra_headers": {"X-Request-Id": "retry-1"}}
    first = client.completions.create(**kwargs)
    generated = scheduler.num_generated_tokens
    again = client.completions.create(**kwargs)
    assert again.choices[0].text == first.choices[0].text
    assert scheduler.num_generated_tokens == generated


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_cancels_its_request(model: str, embedded: tuple[str, EmbeddedBackend],
                                                       stream: bool) -> None:
    base_url, backend = embedded
    scheduler = backend.engine.scheduler
    body = {"model": model, "prompt": "Run long", "max_tokens": 1500, "ignore_eos": True, "stream": stream}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    generated_before = scheduler.num_generated_tokens
    if stream:
        with httpx.stream("POST", f"{base_url}/completions", json=body, headers=headers) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base_url}/completions", json=body, headers=headers, timeout=1.0)
    deadline = time.monotonic() + 10
    while (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scheduler.running and not scheduler.waiting
    assert scheduler.kv_cache.pool.num_used_blocks == 0
    assert scheduler.num_generated_tokens - generated_before < 1500  # cancelled, not run to the end
    metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert "aqueduct_gateway_in_flight 0.0" in metrics  # the slot is given back too


def test_greedy_text_equals_aqueduct_batch(model: str, client: openai.OpenAI, default_model_path: Path,
                                           tmp_path: Path) -> None:
    lines = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": prompt, "max_tokens": 10, "temperature": 0}} for i, prompt in enumerate(PROMPTS)]
    batch_in, batch_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    batch_in.write_text("".join(json.dumps(line) + "\n" for line in lines))
    engine = make_engine(default_model_path)
    batch_lines = read_batch_file(batch_in)
    results = run_offline(engine, [line.request for line in batch_lines], tqdm(disable=True))
    write_results(batch_lines, results, batch_out, engine.model_name, engine.tokenizer)
    expected = [json.loads(line)["response"]["body"]["choices"][0]["text"]
                for line in batch_out.read_text().splitlines()]
    served = [client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0)
              .choices[0].text for prompt in PROMPTS]
    assert served == expected


def test_metrics_show_the_gateway_and_the_embedded_engine(embedded: tuple[str, EmbeddedBackend]) -> None:
    text = httpx.get(embedded[0].removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert "aqueduct_gateway_requests_total" in text
    assert "aqueduct_gateway_time_to_first_token_seconds_bucket" in text
    assert "aqueduct_" in text.replace("aqueduct_gateway_", "")  # the worker's own series


def test_completion_top_logprobs_always_hold_the_chosen_token(model: str, client: openai.OpenAI) -> None:
    none_asked = client.completions.create(model=model, prompt="The river", max_tokens=6, logprobs=0, temperature=0)
    logprobs = none_asked.choices[0].logprobs
    assert [list(top) for top in logprobs.top_logprobs] == [[token] for token in logprobs.tokens]
    hot = client.completions.create(model=model, prompt="The river", max_tokens=12, logprobs=2, temperature=1.5,
                                    seed=3)
    logprobs = hot.choices[0].logprobs
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top[token] == logprob and 1 <= len(top) <= 3
