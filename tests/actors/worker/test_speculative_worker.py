"""A worker with speculation (prompt lookup, or a draft model run on the device thread) on a real
Redis: the actor graph (planning ahead where no
draft is wanted, several tokens per reply entry) answers exactly what the plain engine does."""

from __future__ import annotations

import threading

import pytest

from pipeline.config import SpeculativeConfig
from pipeline.request.sampling_params import SamplingParams
from pipeline.speculative.draft_model import DraftModelProposer
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 6
REQUESTS = {
    "greedy": {"max_tokens": 40, "temperature": 0, "ignore_eos": True},
    "sampled": {"max_tokens": 40, "temperature": 0.3, "seed": 1, "ignore_eos": True, "repetition_penalty": 1.05},
    "opted-out": {"max_tokens": 40, "temperature": 0, "ignore_eos": True, "speculative": False},
    "two": {"max_tokens": 30, "temperature": 0.3, "seed": 5, "n": 2, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
async def test_worker_with_speculation_answers_as_the_plain_engine(model_dir, prefix, method, monkeypatch):
    draft_threads: set[str] = set()
    propose_many = DraftModelProposer.propose_many

    def spy(self, requests):
        draft_threads.add(threading.current_thread().name)
        return propose_many(self, requests)

    monkeypatch.setattr(DraftModelProposer, "propose_many", spy)  # the worker drafts a step's sequences together
    plain = run_requests(make_engine(model_dir, block_size=4),
                         {r: (PROMPT, SamplingParams(**params)) for r, params in REQUESTS.items()})
    speculative = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3) if method == "ngram" else \
        SpeculativeConfig.from_dict({"model": str(model_dir), "num_speculative_tokens": 4})  # the target as draft
    async with running_workers(model_dir, prefix, block_size=4, speculative=speculative) as (redis, engines):
        for request_id, params in REQUESTS.items():
            await push(redis, prefix, {"id": request_id, "prompt_token_ids": PROMPT, "params": params})
        replies = {r: await read_replies(redis, f"{prefix}:out:{r}") for r in REQUESTS}
        speculator = engines[0].scheduler.speculator
    assert speculator.num_accepted_tokens > 0
    if method == "draft_model":  # the draft's torch work stays on the one device thread
        assert len(draft_threads) == 1 and next(iter(draft_threads)).startswith("aqueduct-device")
    for request_id in REQUESTS:
        entries = replies[request_id]
        assert [e["seq"] for e in entries] == list(range(len(entries)))
        for index, choice in plain[request_id]["choices"].items():
            assert tokens_of(entries, index) == choice["token_ids"], (request_id, index)
    # accepted drafts arrive together: fewer reply entries than tokens
    assert len(replies["greedy"]) < len(plain["greedy"]["choices"][0]["token_ids"])
