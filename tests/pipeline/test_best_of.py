"""best_of: best_of choices are generated, the n with the highest cumulative logprob come back,
best first, once all have ended (docs/sampling.md "Several choices")."""

from __future__ import annotations

import pytest

from pipeline.output.output_processor import OutputProcessor
from pipeline.request.outputs import TokenEvent, TokenLogprob
from pipeline.request.request import Request, ResumeState
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model

PROMPT = list(range(3, 40))  # 37 tokens: two full prompt blocks of 16 shared by every choice


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5)


def _params(**overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "seed": 7, "max_tokens": 12, "logprobs": 0, **overrides})


def test_best_of_returns_the_n_best_of_what_n_equal_best_of_generates(model_dir) -> None:
    engine = make_engine(model_dir)
    results = run_requests(engine, {"all": (PROMPT, _params(n=5)), "best": (PROMPT, _params(n=2, best_of=5))})
    every = results["all"]["choices"]
    cumulative = {index: sum(entry.logprob for entry in choice["logprobs"]) for index, choice in every.items()}
    ranked = sorted(cumulative, key=lambda index: -cumulative[index])[:2]
    best = results["best"]["choices"]
    assert sorted(best) == [0, 1]
    for position, index in enumerate(ranked):
        assert best[position]["token_ids"] == every[index]["token_ids"]
        assert best[position]["text"] == every[index]["text"]
        returned = sum(entry.logprob for entry in best[position]["logprobs"])
        assert returned == pytest.approx(cumulative[index], abs=1e-5)
    assert results["best"]["usage"].completion_tokens == results["all"]["usage"].completion_tokens


def test_best_of_streams_nothing_until_every_choice_has_ended(model_dir) -> None:
    engine = make_engine(model_dir)
    results = run_requests(engine, {"best": (PROMPT, _params(n=1, best_of=3, logprobs=None))})
    assert results["best"]["seqs"] == [0]  # one delta: the final one
    choice = results["best"]["choices"][0]
    assert len(choice["token_ids"]) == 12 and choice["finish_reason"] == "length"
    assert choice["logprobs"] == []  # ranked by logprobs, but the client did not ask for them


def test_best_of_choices_share_the_prompt_blocks(model_dir) -> None:
    engine = make_engine(model_dir, num_kv_blocks=64)
    engine.add_request("best", PROMPT, _params(n=1, best_of=4, max_tokens=4))
    peak = 0
    while engine.has_unfinished:
        engine.step()
        peak = max(peak, engine.scheduler.kv_cache.pool.num_blocks - engine.scheduler.kv_cache.pool.num_free_blocks)
    # Independent requests would hold 3 blocks each (37 + 4 tokens); shared, 2 prompt blocks + 4 own tails.
    assert peak <= 2 + 4 < 4 * 3


def test_a_resumed_best_of_request_starts_again_as_nothing_was_streamed() -> None:
    params = _params(n=2, best_of=4)
    request = Request("r", [5, 6, 7], params, seed=1)
    resume = ResumeState(next_seq=0, output_token_ids=[[], []], finish_reasons=[None, None], stop_reasons=[None, None])
    request.resume_from(resume)
    assert [seq.token_ids for seq in request.sequences] == [[5, 6, 7]] * 4
    outputs = OutputProcessor(None)
    outputs.add_request("r", [5, 6, 7], params, resume)
    events = [TokenEvent("r", index, 9, TokenLogprob(9, -float(index), 1), finish_reason="length")
              for index in range(4)]
    (delta,), _ = outputs.process(events)
    assert [choice.index for choice in delta.choices] == [0, 1]
    assert [choice.logprobs[0].logprob for choice in delta.choices] == [0.0, -1.0]  # choices 0 and 1 were best
