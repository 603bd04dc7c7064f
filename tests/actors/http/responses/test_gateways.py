"""Stateless gateways in front of a worker on the real Redis: a conversation started on one gateway continues
on another with previous_response_id (the record is in Redis under the deployment's prefix, with its TTL),
and the same prompt at temperature 0 gets the same text through chat completions and Responses."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from actors.http.backends import RemoteBackend
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.actors.http.responses.conftest import forced, without_ids
from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis


def _gateway(model_dir: Path, prefix: str) -> RemoteBackend:
    return RemoteBackend(REDIS_URL, prefix, model_dir.name, load_tokenizer(model_dir))


async def test_a_conversation_started_on_one_gateway_continues_on_another(default_model_path: Path,
                                                                          prefix: str) -> None:
    model, options = default_model_path.name, GatewayOptions(api_key=API_KEY, worker_timeout_s=30)
    async with running_workers(default_model_path, prefix, count=1) as (redis, _):
        with serving(_gateway(default_model_path, prefix), options) as url_a, \
                serving(_gateway(default_model_path, prefix), options) as url_b:
            a = openai.AsyncOpenAI(base_url=url_a, api_key=API_KEY, max_retries=0)
            b = openai.AsyncOpenAI(base_url=url_b, api_key=API_KEY, max_retries=0)
            first = await a.responses.create(model=model, input="My name is Ada.", extra_body=forced("Hello Ada."))
            assert 0 < await redis.ttl(f"{prefix}:resp:{first.id}") <= 30 * 24 * 3600
            second = await b.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                              max_output_tokens=6, temperature=0)
            chat = await b.chat.completions.create(model=model, max_tokens=6, temperature=0, messages=[
                {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
                {"role": "user", "content": "What is my name?"}])
            assert second.output_text == chat.choices[0].message.content
            assert second.usage.input_tokens == chat.usage.prompt_tokens
            assert (await a.responses.retrieve(second.id)) == second
            streamed = [event async for event in await a.responses.create(
                model=model, input="What is my name?", previous_response_id=first.id, max_output_tokens=6,
                temperature=0, stream=True)]
            assert without_ids(streamed[-1].response) == without_ids(second)
            await b.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                await a.responses.retrieve(first.id)
            await a.close()
            await b.close()
