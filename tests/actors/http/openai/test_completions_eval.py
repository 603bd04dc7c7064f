"""/v1/completions as evaluation harnesses use it: echo with prompt logprobs (against HF's log-softmax),
max_tokens 0, lists of prompts (strings and token-id lists) in OpenAI's choice order, streaming, and
hostile prompt shapes. The embedded server runs the built-in model, an HF Llama directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.cli.batch import read_batch_file, run_offline, write_results
from actors.http.backends import EmbeddedBackend, RemoteBackend
from actors.http.openai.completion_request import MAX_PROMPTS
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.worker_helpers import running_workers

PROMPTS = ["The river runs", "Once upon a time there was", "1, 2, 3,"]
TOLERANCE = 1e-4  # float32 on both sides


@pytest.fixture(scope="module")
def hf(default_model_path: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(default_model_path)


def post(embedded: tuple[str, EmbeddedBackend], body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{embedded[0]}/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"})


def hf_log_softmax(model: Any, token_ids: list[int]) -> torch.Tensor:
    """[positions, vocab]: row i is the distribution of the token after token_ids[: i + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([token_ids])).logits[0].float(), dim=-1)


def assert_scored_like_hf(logprobs: dict[str, Any], token_ids: list[int], expected: torch.Tensor) -> None:
    """`logprobs` (an echoed choice's) scores `token_ids` as HF does: null first, then each token's
    log-softmax under its prefix, and the top alternatives with theirs."""
    assert logprobs["token_ids"][:len(token_ids)] == token_ids
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(token_ids)):
        token_id = token_ids[position]
        assert abs(logprobs["token_logprobs"][position] - float(expected[position - 1, token_id])) < TOLERANCE
        top = logprobs["top_logprobs"][position]
        assert logprobs["tokens"][position] in top  # the prompt's own token is always named
        best = int(expected[position - 1].argmax())
        assert any(abs(value - float(expected[position - 1, best])) < TOLERANCE for value in top.values())


def test_echo_with_logprobs_scores_the_prompt_as_hf_does(embedded, hf) -> None:
    model, tokenizer = hf
    response = post(embedded, {"prompt": PROMPTS, "echo": True, "logprobs": 3, "max_tokens": 2,
                               "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert "prompt_logprobs" not in body  # per choice, as vLLM answers
    for index, (prompt, choice) in enumerate(zip(PROMPTS, body["choices"], strict=True)):
        assert choice["index"] == index
        prompt_ids = tokenizer(prompt).input_ids
        generated = choice["token_ids"]
        assert len(generated) == 2 and choice["text"].startswith(prompt)
        assert choice["text"] == prompt + tokenizer.decode(generated)
        all_ids = prompt_ids + generated
        expected = hf_log_softmax(model, all_ids)
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(all_ids) and logprobs["token_ids"] == all_ids
        assert_scored_like_hf(logprobs, all_ids, expected)  # generated tokens continue the same scoring
        assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])
        # vLLM's prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}, ...], the prompt token first
        prompt_logprobs = choice["prompt_logprobs"]
        assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(prompt_ids)
        for position in range(1, len(prompt_ids)):
            entry = prompt_logprobs[position]
            own = entry[str(prompt_ids[position])]
            assert next(iter(entry)) == str(prompt_ids[position])
            assert abs(own["logprob"] - float(expected[position - 1, prompt_ids[position]])) < TOLERANCE
            assert own["decoded_token"] == tokenizer.decode([prompt_ids[position]])
            assert own["rank"] == 1 + int((expected[position - 1] > expected[position - 1, prompt_ids[position]])
                                          .sum())
    assert body["usage"]["prompt_tokens"] == sum(len(tokenizer(p).input_ids) for p in PROMPTS)
    assert body["usage"]["completion_tokens"] == 2 * len(PROMPTS)


def test_max_tokens_zero_with_echo_scores_token_id_prompts_only(embedded, hf) -> None:
    model, tokenizer = hf
    prompts = [tokenizer(text).input_ids for text in PROMPTS]  # lm-eval's tokenized requests
    response = post(embedded, {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    for prompt_ids, choice in zip(prompts, body["choices"], strict=True):
        assert choice["finish_reason"] == "length" and choice["token_ids"] == []
        assert choice["text"] == tokenizer.decode(prompt_ids)
        assert len(choice["logprobs"]["tokens"]) == len(prompt_ids)
        assert_scored_like_hf(choice["logprobs"], prompt_ids, hf_log_softmax(model, prompt_ids))
        assert all(len(top) <= 2 for top in choice["logprobs"]["top_logprobs"][1:])  # logprobs + 1
    assert body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_echo_without_logprobs_prepends_the_prompt(embedded, model: str, client: openai.OpenAI) -> None:
    plain = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    echoed = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + plain.choices[0].text
    assert echoed.choices[0].logprobs is None
    only = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=0, echo=True)
    assert only.choices[0].text == PROMPTS[0] and only.choices[0].finish_reason == "length"
    assert only.usage.completion_tokens == 0


def test_max_tokens_zero_without_echo_is_refused_as_vllm_does(embedded) -> None:
    response = post(embedded, {"prompt": "x", "max_tokens": 0})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and "echo" in error["message"]


def test_prompt_list_with_n_gives_openai_choice_order(embedded, model: str, client: openai.OpenAI) -> None:
    alone = [client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0).choices[0].text
             for prompt in PROMPTS]
    assert len(set(alone)) == len(alone)  # distinct, so a wrong order shows
    together = client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0, n=2)
    assert [choice.index for choice in together.choices] == list(range(2 * len(PROMPTS)))
    assert [choice.text for choice in together.choices] == [text for text in alone for _ in range(2)]
    assert together.usage.completion_tokens == 6 * 2 * len(PROMPTS)
    sampled = client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=1.0, n=2, seed=3)
    again = client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=1.0, n=2, seed=3)
    assert [c.text for c in sampled.choices] == [c.text for c in again.choices]


def test_streaming_several_prompts_tags_each_chunk_with_its_choice(embedded, model: str,
                                                                  client: openai.OpenAI) -> None:
    kwargs = {"model": model, "prompt": PROMPTS, "max_tokens": 5, "temperature": 0, "n": 2, "echo": True,
              "logprobs": 1}
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            tokens.setdefault(choice.index, []).extend(choice.logprobs.tokens)
    assert sorted(texts) == list(range(2 * len(PROMPTS)))
    for choice in whole.choices:
        assert texts[choice.index] == choice.text and choice.text.startswith(PROMPTS[choice.index // 2])
        assert tokens[choice.index] == choice.logprobs.tokens
    usage = chunks[-1].usage  # one usage chunk, summed over the prompts
    assert chunks[-1].choices == [] and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert sum(1 for chunk in chunks if chunk.usage is not None) == 1


@pytest.mark.parametrize(("prompt", "param", "words"), [
    ([], "prompt", "an empty list"),
    ([[1, 2], "text", []], "prompt", "prompt[2]"),
    ([[1, [2]]], "prompt", "prompt[0][1]"),
    ([[1, 2], {"a": 1}], "prompt", "prompt[1]"),
    ([True, False], "prompt", "prompt[0]"),
    (None, "prompt", "null"),
    ([[5, 6], [7, 10**9]], "prompt", "prompt[1][1]"),  # outside the vocabulary: the worker's refusal
    ([5, 10**9], "prompt", "prompt[1]"),
    ([[1]] * (MAX_PROMPTS + 1), "prompt", f"at most {MAX_PROMPTS}"),
])
def test_hostile_prompts_are_400_naming_the_field(embedded, prompt: Any, param: str, words: str) -> None:
    response = post(embedded, {"prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_hostile_echo_values_are_400(embedded) -> None:
    for echo in ("yes", 1, [True]):
        response = post(embedded, {"prompt": "x", "echo": echo, "max_tokens": 1})
        assert response.status_code == 400 and response.json()["error"]["param"] == "echo", response.text


def test_a_prompt_too_long_names_its_index(embedded) -> None:
    too_long = list(range(5, 5 + embedded[1].max_model_len + 1))
    response = post(embedded, {"prompt": [[5, 6], too_long], "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["message"].startswith("prompt[1]"), error


def test_streamed_echo_chunk_shape_is_sse(embedded) -> None:
    body = {"prompt": ["ab", "cd"], "max_tokens": 0, "echo": True, "stream": True}
    with httpx.stream("POST", f"{embedded[0]}/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    choices = [choice for text in events[:-1] for choice in json.loads(text)["choices"]]
    assert sorted((c["index"], c["text"], c["finish_reason"]) for c in choices) == [(0, "ab", "length"),
                                                                                    (1, "cd", "length")]


@pytest.mark.redis
async def test_echo_max_tokens_zero_and_prompt_lists_through_redis_workers(default_model_path: Path, prefix: str,
                                                                          embedded, hf) -> None:
    """The gateway in front of two workers answers as the embedded server does (the same engine)."""
    model, tokenizer = hf
    backend = RemoteBackend(REDIS_URL, prefix, default_model_path.name, load_tokenizer(default_model_path))
    bodies = [{"prompt": PROMPTS, "echo": True, "logprobs": 2, "max_tokens": 0},
              {"prompt": [tokenizer(p).input_ids for p in PROMPTS], "max_tokens": 3, "n": 2, "temperature": 0,
               "echo": True, "logprobs": 1}]
    async with running_workers(default_model_path, prefix, count=2):
        with serving(backend, GatewayOptions(api_key=API_KEY, worker_timeout_s=30)) as base_url:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
                answers = [await client.post(f"{base_url}/completions", json=body) for body in bodies]
                refused = await client.post(f"{base_url}/completions", json={"prompt": [[5], [5, 10**9]]})
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("prompt[1]")
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.status_code == 200, answer.text
        embedded_answer = post(embedded, body).json()
        ours = answer.json()["choices"]
        assert [c["text"] for c in ours] == [c["text"] for c in embedded_answer["choices"]]
        assert [c["index"] for c in ours] == list(range(len(ours)))
        for choice in ours:
            ids = choice["logprobs"]["token_ids"]
            assert_scored_like_hf(choice["logprobs"], ids, hf_log_softmax(model, ids))
    assert all(c["finish_reason"] == "length" and c["token_ids"] == [] for c in answers[0].json()["choices"])
    assert answers[0].json()["usage"]["completion_tokens"] == 0


def test_batch_lines_take_echo_and_refuse_prompt_lists(default_model_path: Path, tmp_path: Path) -> None:
    def line(custom_id: str, body: dict[str, Any]) -> str:
        return json.dumps({"custom_id": custom_id, "url": "/v1/completions", "body": body}) + "\n"

    batch_in, batch_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    batch_in.write_text(line("echo", {"prompt": PROMPTS[0], "echo": True, "logprobs": 1, "max_tokens": 0})
                        + line("list", {"prompt": PROMPTS, "max_tokens": 2}))
    engine = make_engine(default_model_path)
    lines = read_batch_file(batch_in)
    results = run_offline(engine, [entry.request for entry in lines if entry.request is not None], tqdm(disable=True))
    write_results(lines, results, batch_out, engine.model_name, engine.tokenizer)
    echo, listed = (json.loads(text) for text in batch_out.read_text().splitlines())
    choice = echo["response"]["body"]["choices"][0]
    assert choice["text"] == PROMPTS[0] and choice["logprobs"]["token_logprobs"][0] is None
    assert choice["prompt_logprobs"][0] is None and len(choice["prompt_logprobs"]) > 1
    assert listed["response"]["status_code"] == 400 and "one prompt per batch line" in listed["error"]["message"]
