"""Beam search is greedy-equal to HF transformers' `generate(num_beams=W, num_return_sequences=n,
length_penalty=…, early_stopping=…, do_sample=False)`: the same sequences, and scores equal to
HF's `sequences_scores`, with and without stop tokens, under chunked prefill and preemption."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model

MAX_NEW_TOKENS = 10
PAD = 0


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_model(request, tmp_path_factory):
    path = make_tiny_hf_model(request.param, tmp_path_factory.mktemp(request.param), seed=3)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, hf


def _prompt(seed: int, length: int = 21) -> list[int]:
    generator = random.Random(seed)
    return [generator.randrange(3, 500) for _ in range(length)]


def hf_beam_search(hf, prompt: list[int], *, width: int, n: int, length_penalty: float,
                   early_stopping: bool | str, eos: list[int] | None, **processors) -> list[tuple[list[int], float]]:
    """HF's n returned (output tokens without padding, sequences_scores); `processors`: more
    `generate` arguments (repetition_penalty=…, bad_words_ids=…)."""
    hf.generation_config.eos_token_id = eos
    hf.generation_config.pad_token_id = PAD
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=MAX_NEW_TOKENS, num_beams=width, num_return_sequences=n,
                          length_penalty=length_penalty, early_stopping=early_stopping, do_sample=False, **processors,
                          output_scores=True, return_dict_in_generate=True)
    lengths = ((out.beam_indices + 1).bool()).sum(dim=1).tolist()  # generated tokens per returned sequence
    return [(out.sequences[row, len(prompt):len(prompt) + lengths[row]].tolist(), float(out.sequences_scores[row]))
            for row in range(n)]


def _stop_token_the_model_generates(hf, prompt: list[int], width: int) -> int:
    """A token that the best beam produces a few steps in, so stopping on it changes the search."""
    (tokens, _), *_ = hf_beam_search(hf, prompt, width=width, n=1, length_penalty=1.0, early_stopping=False, eos=None)
    return tokens[2]


def _check(engine, hf, prompt: list[int], *, width: int, n: int, length_penalty: float,
           early_stopping: bool | str, stop: int | None, ours_extra: dict | None = None,
           theirs_extra: dict | None = None) -> dict:
    params = SamplingParams(temperature=0.0, use_beam_search=True, best_of=width, n=n, max_tokens=MAX_NEW_TOKENS,
                            length_penalty=length_penalty, early_stopping=early_stopping,
                            stop_token_ids=[stop] if stop is not None else [], ignore_eos=stop is None,
                            **(ours_extra or {}))
    result = run_requests(engine, {"beam": (prompt, params)})["beam"]
    eos = [2, stop] if stop is not None else None  # 2: the tiny models' EOS, which ignore_eos=False keeps
    theirs = hf_beam_search(hf, prompt, width=width, n=n, length_penalty=length_penalty,
                            early_stopping=early_stopping, eos=eos, **(theirs_extra or {}))
    ours = result["request"].beam_results
    assert sorted(result["choices"]) == list(range(n))
    for index, (their_tokens, their_score) in enumerate(theirs):
        assert result["choices"][index]["token_ids"] == their_tokens, f"choice {index}"
        assert ours[index].output_token_ids == their_tokens
        assert ours[index].score == pytest.approx(their_score, abs=1e-4)
    assert result["seqs"] == [0]  # nothing streamed before the end
    return result


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("with_stop_token", [False, True])
def test_beam_search_equals_hf(arch_model, early_stopping, with_stop_token) -> None:
    _, path, hf = arch_model
    engine = make_engine(path)
    reasons = set()
    for seed, (width, n, length_penalty) in enumerate([(4, 2, 1.0), (3, 3, 0.5), (2, 1, -1.0), (4, 4, 0.0)]):
        prompt = _prompt(seed)
        stop = _stop_token_the_model_generates(hf, prompt, width) if with_stop_token else None
        result = _check(engine, hf, prompt, width=width, n=n, length_penalty=length_penalty,
                        early_stopping=early_stopping, stop=stop)
        reasons |= {choice["finish_reason"] for choice in result["choices"].values()}
    # With a stop token the model generates, some returned hypothesis ends on it.
    assert reasons == ({"stop", "length"} if with_stop_token else {"length"})
    assert engine.scheduler.kv_cache.num_used_blocks == 0


def test_beam_search_equals_hf_under_chunked_prefill_and_preemption(arch_model) -> None:
    _, path, hf = arch_model
    # Blocks of 4: a 21-token prompt is 6 blocks, four beams of 31 tokens need ~14 even when sharing;
    # 9 blocks force preemption, 8-token steps chunk the prompt and the forks' recompute.
    engine = make_engine(path, block_size=4, num_kv_blocks=9, max_num_batched_tokens=8, max_num_seqs=4)
    prompt = _prompt(7)
    stop = _stop_token_the_model_generates(hf, prompt, 4)
    for early_stopping in (True, False, "never"):
        _check(engine, hf, prompt, width=4, n=3, length_penalty=1.0, early_stopping=early_stopping, stop=stop)
        _check(engine, hf, prompt, width=4, n=2, length_penalty=2.0, early_stopping=early_stopping, stop=None)
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.kv_cache.num_used_blocks == 0


def test_beam_search_wider_than_max_num_seqs_equals_hf(arch_model) -> None:
    _, path, hf = arch_model
    engine = make_engine(path, block_size=4, max_num_seqs=2)  # beams take turns: parked ones are preempted
    _check(engine, hf, _prompt(11), width=5, n=3, length_penalty=1.0, early_stopping=False, stop=None)
    assert not engine.has_unfinished


def test_a_fork_reuses_its_parents_full_blocks_and_recomputes_less_than_one_block(arch_model) -> None:
    _, path, hf = arch_model
    engine = make_engine(path, block_size=4)
    forks = []
    add_forks = engine.scheduler.add_forks
    engine.scheduler.add_forks = lambda new: (forks.extend((fork, fork.num_tokens) for fork in new), add_forks(new))
    _check(engine, hf, _prompt(3), width=4, n=4, length_penalty=1.0, early_stopping=False, stop=None)
    assert forks
    for fork, num_tokens_at_fork in forks:
        assert fork.num_cached_tokens == (num_tokens_at_fork - 1) // 4 * 4  # every full block of its prefix


def test_beam_search_with_penalties_bans_and_min_tokens_equals_hf(arch_model) -> None:
    """HF applies its logits processors to the beams' log-probs and does not renormalise; the
    engine processes a beam row the same way (repetition penalty: log-probs are negative, so
    multiplied by it), so the search picks the same beams with the same scores."""
    _, path, hf = arch_model
    engine = make_engine(path)
    prompt = _prompt(5)
    stop = _stop_token_the_model_generates(hf, prompt, 3)
    _check(engine, hf, prompt, width=3, n=2, length_penalty=1.0, early_stopping=False, stop=None,
           ours_extra={"repetition_penalty": 1.8}, theirs_extra={"repetition_penalty": 1.8})
    banned = _stop_token_the_model_generates(hf, prompt, 4)
    _check(engine, hf, prompt, width=4, n=2, length_penalty=1.0, early_stopping=True, stop=None,
           ours_extra={"custom_token_bans": [banned], "repetition_penalty": 1.3},
           theirs_extra={"bad_words_ids": [[banned]], "repetition_penalty": 1.3})
    _check(engine, hf, prompt, width=3, n=3, length_penalty=1.0, early_stopping=False, stop=stop,
           ours_extra={"min_tokens": 5}, theirs_extra={"min_new_tokens": 5})
    assert engine.scheduler.kv_cache.num_used_blocks == 0


def test_beam_search_rejects_logprobs_naming_the_field() -> None:
    with pytest.raises(ValueError, match="logprobs is not supported with use_beam_search"):
        SamplingParams(temperature=0.0, use_beam_search=True, best_of=2, logprobs=3)
