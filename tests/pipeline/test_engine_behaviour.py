"""Engine-level behaviour on a tiny model: seeded sampling independent of batching and
preemption (docs/design.md §5), stop strings, and no state left behind after a long run."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5)


def _sampled(seed: int | None = 7, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=seed, ignore_eos=True, **extra)


def _noise(count: int, seed: int) -> dict:
    rng = random.Random(seed)
    return {f"noise{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(5, 60))],
                          SamplingParams(max_tokens=rng.randint(3, 20), temperature=rng.choice([0.0, 1.0]),
                                         repetition_penalty=rng.choice([1.0, 1.2]), ignore_eos=True))
            for i in range(count)}


def test_seeded_sampling_is_independent_of_batch_and_preemption(model_dir):
    prompt = list(range(40, 75))
    alone = run_requests(make_engine(model_dir), {"x": (prompt, _sampled(n=2))})["x"]["choices"]
    crowded_engine = make_engine(model_dir, block_size=4, num_kv_blocks=30, max_num_batched_tokens=16)
    crowded = run_requests(crowded_engine, {**_noise(10, 1), "x": (prompt, _sampled(n=2))})["x"]["choices"]
    assert crowded_engine.scheduler.num_preemptions > 0
    for index in (0, 1):
        assert crowded[index]["token_ids"] == alone[index]["token_ids"]
    assert alone[0]["token_ids"] != alone[1]["token_ids"]  # choices draw independent randomness


def test_unseeded_requests_derive_their_seed_from_the_id(model_dir):
    prompt = list(range(10, 30))
    first = run_requests(make_engine(model_dir), {"same-id": (prompt, _sampled(seed=None))})
    again = run_requests(make_engine(model_dir), {**_noise(4, 2), "same-id": (prompt, _sampled(seed=None))})
    other = run_requests(make_engine(model_dir), {"other-id": (prompt, _sampled(seed=None))})
    tokens = first["same-id"]["choices"][0]["token_ids"]
    assert again["same-id"]["choices"][0]["token_ids"] == tokens
    assert other["other-id"]["choices"][0]["token_ids"] != tokens


def test_engine_holds_no_state_after_requests_finish(model_dir):
    engine = make_engine(model_dir, block_size=4, num_kv_blocks=64, max_num_batched_tokens=32)
    run_requests(engine, _noise(20, 3))  # warm-up: caches, buffers
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for wave in range(3):
        run_requests(engine, {f"{k}-{wave}": v for k, v in _noise(20, 10 + wave).items()})
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert engine.scheduler.sequences == {} and engine.scheduler.requests == {}
    assert not engine.scheduler.waiting and not engine.scheduler.running
    # Rows of the last finished sequences are released by the next plan, which carries their ids.
    assert set(engine.tensor_prep.batch.row_of) == set(engine.scheduler._removed_seq_ids)
    assert engine.outputs._requests == {}
    assert engine.scheduler.kv_cache.num_free_blocks == 64
    assert growth < 256 * 1024, f"Python heap grew by {growth} bytes over 60 finished requests"


def test_invalid_prompts_are_rejected_with_clear_errors(model_dir):
    engine = make_engine(model_dir, max_model_len=64)
    with pytest.raises(ValueError, match="must not be empty"):
        engine.add_request("a", [], SamplingParams())
    with pytest.raises(ValueError, match=r"must be an int in \[0, 512\)"):
        engine.add_request("b", [1, 512], SamplingParams())
    with pytest.raises(ValueError, match="limit is 63"):
        engine.add_request("c", list(range(1, 65)), SamplingParams())
    with pytest.raises(ValueError, match="no tokenizer"):
        engine.add_request("d", "text", SamplingParams())
    assert not engine.has_unfinished


def test_stop_string_truncates_text_and_frees_the_sequence(default_model_path):
    engine = make_engine(default_model_path, num_kv_blocks=128)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    free_text = run_requests(engine, {"free": ("The river", greedy)})["free"]["choices"][0]["text"]
    clean = free_text.replace("\ufffd", "")
    stop = clean[len(clean) // 2: len(clean) // 2 + 3]
    assert len(stop) == 3, free_text
    stopped = run_requests(engine, {"stopped": ("The river", SamplingParams(
        max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop]))})["stopped"]
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == free_text[: free_text.index(stop)]
    assert len(choice["token_ids"]) < 40
    assert engine.scheduler.kv_cache.num_free_blocks == 128


def test_out_of_int32_top_k_and_min_tokens_mean_keep_all_and_no_eos(model_dir):
    """Found by the worker fuzz test: top_k = 5e17 overflowed the batch's int32 column and crashed tensor prep."""
    prompt = [5, 6, 7, 8]
    huge = 2**62
    engine = make_engine(model_dir)
    outputs = run_requests(engine, {
        "huge": (prompt, SamplingParams(max_tokens=6, temperature=0.8, seed=3, top_k=huge, min_tokens=6)),
        "off": (prompt, SamplingParams(max_tokens=6, temperature=0.8, seed=3, top_k=-1, min_tokens=6)),
    })
    huge_tokens = outputs["huge"]["choices"][0]["token_ids"]
    assert huge_tokens == outputs["off"]["choices"][0]["token_ids"]
    assert len(huge_tokens) == 6
