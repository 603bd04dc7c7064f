"""Sampler: distributions, batch independence, greedy, penalties, bans, logprobs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from pipeline.sampling import rng
from pipeline.sampling.sampler import Sampler, compute_prompt_logprobs
from pipeline.step.sampling_batch import SamplingBatch

# Token ids deliberately not in probability order: the inverse CDF walks token-id order.
LOGITS_6 = np.array([0.5, 2.0, -1.5, 0.0, 1.0, -0.5], dtype=np.float32)
NUM_DRAWS = 20_000

_COLUMNS: dict[str, tuple[Any, Any]] = {  # name -> (neutral value, dtype)
    "temperature": (1.0, np.float32), "top_p": (1.0, np.float32), "top_k": (0, np.int32),
    "min_p": (0.0, np.float32), "presence_penalty": (0.0, np.float32),
    "frequency_penalty": (0.0, np.float32), "repetition_penalty": (1.0, np.float32),
    "choice_index": (0, np.int64), "output_position": (0, np.int64), "num_logprobs": (-1, np.int32),
}


def make_batch(num_rows: int, **overrides: Any) -> SamplingBatch:
    """A batch of neutral rows; a scalar override fills the column, an array replaces it."""
    columns: dict[str, Any] = {}
    for name, (neutral, dtype) in _COLUMNS.items():
        value = overrides.pop(name, neutral)
        columns[name] = np.broadcast_to(np.asarray(value, dtype=dtype), (num_rows,)).copy()
    seeds = overrides.pop("seeds", np.arange(num_rows) + 1)
    columns["seeds"] = np.broadcast_to(np.asarray(seeds, dtype=np.uint64), (num_rows,)).copy()
    columns["prompt_token_ids"] = overrides.pop("prompt_token_ids", None)
    columns["output_token_ids"] = overrides.pop("output_token_ids", None)
    columns["banned_rows"] = np.asarray(overrides.pop("banned_rows", []), dtype=np.int64)
    columns["banned_tokens"] = np.asarray(overrides.pop("banned_tokens", []), dtype=np.int64)
    assert not overrides, f"unknown columns {overrides}"
    return SamplingBatch(**columns)


def softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values.astype(np.float64) - values.max())
    return shifted / shifted.sum()


def reference_distribution(logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0,
                           min_p: float = 0.0) -> np.ndarray:
    """The truncated, renormalized target: truncation on the T=1 distribution, then temperature."""
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")
    sorted_probs = probs[order]
    mass_before = np.cumsum(sorted_probs) - sorted_probs
    keep_sorted = (mass_before < top_p) | (top_p >= 1)
    keep_sorted &= sorted_probs >= min_p * sorted_probs[0]
    if top_k > 0:
        keep_sorted &= np.arange(len(logits)) < top_k
    keep = np.zeros(len(logits), dtype=bool)
    keep[order] = keep_sorted
    tempered = np.where(keep, softmax(logits / temperature), 0.0)
    return tempered / tempered.sum()


@pytest.mark.parametrize("knobs", [
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 1.5},
    {"temperature": 0.8, "top_k": 3},
    # At these temperatures truncating after tempering would keep other sets ({1} and all six).
    {"temperature": 0.5, "top_p": 0.8},
    {"temperature": 2.0, "min_p": 0.1},
    {"temperature": 1.2, "top_p": 0.9, "top_k": 3, "min_p": 0.05},
], ids=lambda knobs: ",".join(f"{key}={value}" for key, value in knobs.items()))
def test_sampled_frequencies_match_the_target_distribution(knobs: dict[str, Any]) -> None:
    batch = make_batch(NUM_DRAWS, seeds=np.arange(NUM_DRAWS) * 7 + 11,
                       output_position=np.arange(NUM_DRAWS) % 37, **knobs)
    logits = torch.from_numpy(np.tile(LOGITS_6, (NUM_DRAWS, 1)))
    tokens = Sampler(6)(logits, batch).token_ids
    observed = np.bincount(tokens, minlength=6)
    expected = reference_distribution(LOGITS_6, **knobs) * NUM_DRAWS
    kept = expected > 0
    assert observed[~kept].sum() == 0, "a truncated token was sampled"
    assert stats.chisquare(observed[kept], expected[kept]).pvalue > 1e-3


def test_truncation_keeps_the_expected_token_sets() -> None:
    # Sorted T=1 probs are ~[.544, .200, .121, .074, .045, .016] at ids [1, 4, 0, 3, 5, 2].
    assert np.flatnonzero(reference_distribution(LOGITS_6, 1.0, top_p=0.8)).tolist() == [0, 1, 4]
    assert np.flatnonzero(reference_distribution(LOGITS_6, 1.0, min_p=0.1)).tolist() == [0, 1, 3, 4]
    assert np.flatnonzero(reference_distribution(LOGITS_6, 1.0, top_k=2)).tolist() == [1, 4]


def test_random_rows_pick_by_inverse_cdf_with_the_counter_uniform() -> None:
    generator = np.random.default_rng(0)
    num_rows, vocab_size = 500, 50
    logits_np = generator.normal(0, 2, (num_rows, vocab_size)).astype(np.float32)
    batch = make_batch(num_rows, temperature=0.9, seeds=generator.integers(0, 2**63, num_rows),
                       choice_index=generator.integers(0, 4, num_rows),
                       output_position=generator.integers(0, 1000, num_rows))
    tokens = Sampler(vocab_size)(torch.from_numpy(logits_np), batch).token_ids
    u = rng.uniforms(batch.seeds, batch.choice_index, batch.output_position)
    for row in range(num_rows):
        cdf = np.cumsum(softmax(logits_np[row] / np.float32(0.9)))
        assert tokens[row] == np.argmax(cdf > u[row] * cdf[-1])


def _target_row_batch() -> dict[str, Any]:
    return {"temperature": 0.8, "top_p": 0.9, "top_k": 10, "min_p": 0.02, "repetition_penalty": 1.2,
            "presence_penalty": 0.3, "frequency_penalty": 0.2, "choice_index": 1, "output_position": 7,
            "num_logprobs": 5}


def test_a_seeded_row_gives_the_same_token_and_logprobs_alone_or_inside_any_batch() -> None:
    generator = np.random.default_rng(1)
    vocab_size, index = 32, 3
    sampler = Sampler(vocab_size)
    for seed in range(20):
        target_logits = generator.normal(0, 2, vocab_size).astype(np.float32)
        prompt, output = generator.integers(0, vocab_size, 12), generator.integers(0, vocab_size, 4)
        alone = sampler(torch.from_numpy(target_logits[None]), make_batch(
            1, seeds=seed, prompt_token_ids=[prompt], output_token_ids=[output],
            banned_rows=[0], banned_tokens=[3], **_target_row_batch()))
        others = generator.normal(0, 2, (6, vocab_size)).astype(np.float32)
        others[index] = target_logits
        columns = {name: np.full(6, value) for name, value in _target_row_batch().items()}
        columns["temperature"][[0, 4]] = 0.0  # greedy neighbours
        columns["repetition_penalty"][1] = 1.0
        columns["top_k"][5] = 0
        columns["top_p"][2] = 1.0
        columns["num_logprobs"][[0, 1]] = [8, -1]
        columns["output_position"][[0, 5]] = [0, 99]
        seeds = np.arange(6) + 1000
        seeds[index] = seed
        prompts = [generator.integers(0, vocab_size, length) for length in (0, 30, 5, 0, 7, 1)]
        outputs = [generator.integers(0, vocab_size, length) for length in (9, 0, 2, 0, 3, 40)]
        prompts[index], outputs[index] = prompt, output
        batched = sampler(torch.from_numpy(others), make_batch(
            6, seeds=seeds, prompt_token_ids=prompts, output_token_ids=outputs,
            banned_rows=[0, 3, 5, 5], banned_tokens=[1, 3, 3, 9], **columns))
        assert batched.token_ids[index] == alone.token_ids[0]
        assert batched.chosen_logprobs[index] == alone.chosen_logprobs[0]
        assert batched.chosen_ranks[index] == alone.chosen_ranks[0]
        np.testing.assert_array_equal(batched.top_token_ids[index, :5], alone.top_token_ids[0])
        np.testing.assert_array_equal(batched.top_logprobs[index, :5], alone.top_logprobs[0])


def test_greedy_rows_take_the_argmax_with_lowest_index_on_ties() -> None:
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(2))
    logits[0, 5] = logits[0, 7] = 50.0
    fast = Sampler(100)(logits, make_batch(64, temperature=0.0))
    slow = Sampler(100)(logits, make_batch(64, temperature=0.0, num_logprobs=2))
    np.testing.assert_array_equal(fast.token_ids, torch.argmax(logits, dim=-1).numpy())
    np.testing.assert_array_equal(slow.token_ids, fast.token_ids)
    assert fast.token_ids[0] == 5
    assert fast.chosen_logprobs is None


def test_greedy_and_random_rows_mix_in_one_batch() -> None:
    logits = torch.zeros(4, 10)
    logits[:, 6] = 40.0  # so peaked that random rows pick it too
    tokens = Sampler(10)(logits, make_batch(4, temperature=[0.0, 1.0, 0.0, 0.5])).token_ids
    assert tokens.tolist() == [6, 6, 6, 6]


def _naive_penalties(logits: np.ndarray, prompts: list[np.ndarray], outputs: list[np.ndarray],
                     repetition: np.ndarray, presence: np.ndarray, frequency: np.ndarray) -> np.ndarray:
    result = logits.astype(np.float64).copy()
    for row in range(len(logits)):
        for token in set(prompts[row].tolist()) | set(outputs[row].tolist()):
            value = result[row, token]
            result[row, token] = value / repetition[row] if value > 0 else value * repetition[row]
        for token in set(outputs[row].tolist()):
            count = int((outputs[row] == token).sum())
            result[row, token] -= presence[row] + frequency[row] * count
    return result


def test_penalties_match_a_naive_per_row_reference() -> None:
    generator = np.random.default_rng(3)
    num_rows, vocab_size = 6, 20
    logits = generator.normal(0, 3, (num_rows, vocab_size)).astype(np.float32)
    prompts = [generator.integers(0, vocab_size, length) for length in (5, 0, 12, 3, 8, 1)]
    outputs = [generator.integers(0, vocab_size, length) for length in (7, 4, 0, 15, 2, 0)]
    repetition = np.array([1.3, 1.0, 0.8, 2.0, 1.0, 1.1], dtype=np.float32)
    presence = np.array([0.5, -1.0, 0.0, 2.0, 0.0, 0.3], dtype=np.float32)
    frequency = np.array([0.2, 0.0, 1.0, -0.5, 0.0, 0.3], dtype=np.float32)
    batch = make_batch(num_rows, temperature=0.0, repetition_penalty=repetition,
                       presence_penalty=presence, frequency_penalty=frequency,
                       prompt_token_ids=prompts, output_token_ids=outputs, num_logprobs=0)
    sampler = Sampler(vocab_size)
    expected = _naive_penalties(logits, prompts, outputs, repetition, presence, frequency)
    processed = sampler.process_logits(torch.from_numpy(logits), batch).numpy()
    np.testing.assert_allclose(processed, expected, rtol=1e-6, atol=1e-6)
    output = sampler(torch.from_numpy(logits), batch)
    np.testing.assert_array_equal(output.token_ids, expected.argmax(axis=1))
    expected_logprobs = torch.log_softmax(torch.from_numpy(expected), dim=-1).numpy()
    np.testing.assert_allclose(output.chosen_logprobs,
                               expected_logprobs[np.arange(num_rows), output.token_ids], atol=1e-5)


def test_penalties_without_token_lists_are_an_error() -> None:
    with pytest.raises(ValueError, match="penalties"):
        Sampler(4)(torch.zeros(1, 4), make_batch(1, repetition_penalty=1.5))


def test_banned_tokens_are_never_chosen_and_get_minus_infinity() -> None:
    num_rows, vocab_size = 200, 8
    logits = torch.zeros(num_rows, vocab_size)
    logits[:, 2] = 10.0
    rows = np.arange(num_rows)
    batch = make_batch(num_rows, temperature=np.where(rows % 2 == 0, 0.0, 1.0),
                       banned_rows=np.repeat(rows, 2), banned_tokens=np.tile([2, 5], num_rows))
    before = logits.clone()
    sampler = Sampler(vocab_size)
    tokens = sampler(logits, batch).token_ids
    assert not np.isin(tokens, [2, 5]).any()
    processed = sampler.process_logits(logits, batch)
    assert torch.isneginf(processed[:, [2, 5]]).all()
    assert torch.equal(logits, before), "the caller's logits must not be modified"


def test_logprobs_ranks_and_top_alternatives_come_from_the_processed_distribution() -> None:
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 30, generator=generator) * 2
    temperature = np.array([0.0, 0.5, 1.0, 2.0, 0.0, 0.7, 1.3, 0.9], dtype=np.float32)
    batch = make_batch(8, temperature=temperature, num_logprobs=[5, 5, 5, 5, 0, 3, -1, 5],
                       seeds=np.arange(8) * 31)
    output = Sampler(30)(logits, batch)
    scale = torch.from_numpy(np.where(temperature == 0, 1.0, temperature).astype(np.float32))[:, None]
    expected = torch.log_softmax(logits / scale, dim=-1).numpy()
    assert output.top_token_ids.shape == (8, 5)
    for row in (0, 1, 2, 3, 4, 5, 7):
        token = output.token_ids[row]
        assert output.chosen_logprobs[row] == pytest.approx(expected[row, token], abs=1e-5)
        assert output.chosen_ranks[row] == 1 + (expected[row] > expected[row, token]).sum()
        assert np.all(np.diff(output.top_logprobs[row]) <= 0), "alternatives must be best first"
        np.testing.assert_array_equal(output.top_token_ids[row], np.argsort(-expected[row])[:5])
        np.testing.assert_allclose(output.top_logprobs[row], np.sort(expected[row])[::-1][:5], atol=1e-5)
    assert output.chosen_ranks[0] == 1 and output.chosen_ranks[4] == 1  # greedy picks the best


def test_logprobs_see_truncation() -> None:
    logits = torch.from_numpy(np.tile(LOGITS_6, (1, 1)))
    output = Sampler(6)(logits, make_batch(1, top_k=2, num_logprobs=6))
    assert np.isneginf(output.top_logprobs[0, 2:]).all()
    assert np.exp(output.top_logprobs[0, :2]).sum() == pytest.approx(1.0, abs=1e-6)


def test_top_p_of_one_keeps_a_vanishing_tail() -> None:
    logits = torch.zeros(2, 50)
    logits[:, 0] = 30.0  # the tail has mass ~1e-13 each, below float32 rounding of the cumsum
    batch = make_batch(2, top_p=[1.0, 0.5])
    processed = Sampler(50).process_logits(logits, batch)
    assert torch.isfinite(processed[0]).all()
    assert torch.isneginf(processed[1, 1:]).all()


def test_padded_vocabulary_columns_are_never_sampled() -> None:
    logits = torch.zeros(100, 13)
    logits[:, 10:] = 100.0  # lm_head padding past the tokenizer's 10 tokens
    output = Sampler(10)(logits, make_batch(100, temperature=np.where(np.arange(100) < 50, 0.0, 1.0)))
    assert (output.token_ids < 10).all()


def test_prompt_logprobs_match_the_raw_log_softmax() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 40, generator=generator)
    targets = torch.randint(0, 40, (12,), generator=generator).numpy()
    chosen, ranks, top_ids, top_logprobs = compute_prompt_logprobs(logits, targets, 4)
    expected = torch.log_softmax(logits, dim=-1).numpy()
    np.testing.assert_allclose(chosen, expected[np.arange(12), targets], atol=1e-6)
    np.testing.assert_array_equal(ranks, 1 + (expected > expected[np.arange(12), targets][:, None]).sum(1))
    np.testing.assert_array_equal(top_ids, np.argsort(-expected, axis=1)[:, :4])
    np.testing.assert_allclose(top_logprobs, np.sort(expected, axis=1)[:, ::-1][:, :4], atol=1e-6)
    assert chosen.dtype == np.float32 and top_ids.dtype == np.int64 and top_ids.shape == (12, 4)
