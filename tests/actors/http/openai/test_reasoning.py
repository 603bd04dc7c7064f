"""Reasoning through the front door, with the official openai SDK: `--reasoning-parser qwen3` splits
the answer into `reasoning` (and `reasoning_content`) and `content`, streamed and not, and
`chat_template_kwargs` reach the chat template, embedded and across Redis to a worker. The model's
text is forced with a regex constraint (random weights write nothing of the kind by themselves)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from actors.http.backends import EmbeddedBackend, RemoteBackend
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.reasoning_templates import THINKING
from tests.support.worker_helpers import running_workers

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
ANSWER = "<think>Two and two.</think>\n\nIt is 4."


@pytest.fixture(scope="module")
def client(default_model_path: Path) -> Iterator[openai.OpenAI]:
    backend = EmbeddedBackend(make_engine(default_model_path, chat_template=THINKING, num_kv_blocks=64))
    with serving(backend, GatewayOptions(api_key=API_KEY, reasoning_parser="qwen3")) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)


def forced(text: str, **extra: Any) -> dict[str, Any]:
    """A request whose answer is exactly `text` (a regex constraint), plus `extra` fields."""
    return {"model": "default-model-v1", "messages": QUESTION, "max_tokens": 48, "temperature": 0,
            "extra_body": {"guided_regex": re.escape(text), **extra}}


def streamed(client: openai.OpenAI, request: dict[str, Any]) -> dict[str, str | None]:
    parts: dict[str, str | None] = {"reasoning": None, "reasoning_content": None, "content": None}
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            for key in parts:
                piece = getattr(choice.delta, key, None)
                if piece:
                    parts[key] = (parts[key] or "") + piece
    return parts


def test_the_answer_s_reasoning_and_content_split(client: openai.OpenAI) -> None:
    message = client.chat.completions.create(**forced(ANSWER)).choices[0].message
    assert (message.reasoning, message.reasoning_content, message.content) == (
        "Two and two.", "Two and two.", "\n\nIt is 4.")
    assert streamed(client, forced(ANSWER)) == {"reasoning": "Two and two.", "reasoning_content": "Two and two.",
                                                "content": "\n\nIt is 4."}


def test_thinking_off_reaches_the_template_and_leaves_all_content(client: openai.OpenAI) -> None:
    on = client.chat.completions.create(**forced(ANSWER))
    off = client.chat.completions.create(**forced(ANSWER, chat_template_kwargs={"enable_thinking": False}))
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the template closed a think block in the prompt
    assert (off.choices[0].message.content, off.choices[0].message.reasoning) == (ANSWER, None)
    assert on.choices[0].message.reasoning == "Two and two."
    # A constrained answer that does not open with <think> is content, whatever the parser (docs: Reasoning).
    assert client.chat.completions.create(**forced("It is 4.")).choices[0].message.content == "It is 4."
    with pytest.raises(openai.BadRequestError, match="reserved"):
        client.chat.completions.create(**forced("x", chat_template_kwargs={"add_generation_prompt": False}))


@pytest.mark.redis
async def test_template_variables_cross_redis_to_the_worker(default_model_path: Path, prefix: str) -> None:
    expected = AutoTokenizer.from_pretrained(str(default_model_path)).apply_chat_template(
        QUESTION, chat_template=THINKING, add_generation_prompt=True, tokenize=True, return_dict=True,
        enable_thinking=False, reasoning_effort="low")["input_ids"]
    gateway = RemoteBackend(REDIS_URL, prefix, "default-model-v1", load_tokenizer(default_model_path))
    options = GatewayOptions(api_key=API_KEY, reasoning_parser="qwen3",
                             default_chat_template_kwargs={"enable_thinking": True})
    async with running_workers(default_model_path, prefix, count=1, chat_template=THINKING, num_kv_blocks=64):
        with serving(gateway, options) as base_url:
            async_client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            request = forced(ANSWER, chat_template_kwargs={"enable_thinking": False})
            answer = await async_client.chat.completions.create(**request, reasoning_effort="low")
            await async_client.close()
    assert answer.usage.prompt_tokens == len(expected)  # rendered with both variables, as transformers does
    assert answer.choices[0].message.content == ANSWER and answer.choices[0].message.reasoning is None
