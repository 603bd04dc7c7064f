"""The sampler against the numpy reference of docs/sampling.md: each stage alone and in combination,
batch independence, and sampled frequencies (chi-square) for a few stages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.dry import SequenceBreakers
from pipeline.sampling.sampler import Sampler
from tests.support.sampling_helpers import Row, batch_of, knobs_of, reference_of
from tests.support.sampling_reference import reference_row, softmax

VOCAB = 48
# Token texts for DRY's sequence breakers: every 7th token holds a newline, every 11th a colon.
TOKEN_TEXTS = [f"t{i}" + ("\n" if i % 7 == 3 else "") + (":" if i % 11 == 5 else "") for i in range(VOCAB)]


def _is_breaker(breakers: tuple[str, ...]) -> np.ndarray:
    return np.array([any(b in text for b in breakers) for text in TOKEN_TEXTS])


def _sampler(vocab: int = VOCAB, **kwargs: Any) -> Sampler:
    decode = (lambda ids: TOKEN_TEXTS[ids[0]]) if vocab == VOCAB else None
    return Sampler(vocab, breakers=SequenceBreakers(decode, vocab), **kwargs)


def _rounded(low: float, high: float, digits: int = 3) -> st.SearchStrategy[float]:
    return st.floats(low, high).map(lambda x: round(x, digits))


# One strategy per stage: (name -> value); a drawn subset of stages is switched on.
STAGES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "bans": st.fixed_dictionaries({"custom_token_bans": st.lists(st.integers(0, VOCAB - 1), max_size=4)}),
    "bias": st.fixed_dictionaries({"logit_bias": st.dictionaries(st.integers(0, VOCAB - 1), _rounded(-100, 100),
                                                                  max_size=5)}),
    "min_tokens": st.fixed_dictionaries({"min_tokens": st.integers(1, 40), "stop_token_ids": st.just([1, 2])}),
    "penalties": st.fixed_dictionaries({"repetition_penalty": _rounded(0.5, 2), "presence_penalty": _rounded(-2, 2),
                                        "frequency_penalty": _rounded(-2, 2)}),
    "repetition_window": st.fixed_dictionaries({"repetition_penalty": _rounded(0.5, 2),
                                                "repetition_penalty_range": st.integers(1, 40),
                                                "repetition_penalty_slope": _rounded(0.01, 1)}),
    "dry": st.fixed_dictionaries({"dry_multiplier": _rounded(0.1, 3), "dry_base": _rounded(1.01, 3),
                                  "dry_allowed_length": st.integers(1, 4), "dry_range": st.integers(0, 40),
                                  "dry_sequence_breakers": st.sampled_from([["\n"], ["\n", ":"], []])}),
    "top_p_k_min": st.fixed_dictionaries({"top_p": _rounded(0.05, 1), "min_p": _rounded(0, 0.5),
                                          "top_k": st.one_of(st.just(-1), st.integers(1, 40))}),
    "top_a": st.fixed_dictionaries({"top_a": _rounded(0, 3)}),
    "tfs": st.fixed_dictionaries({"tfs": _rounded(0.05, 1)}),
    "eta": st.fixed_dictionaries({"eta_cutoff": _rounded(0.01, 600)}),
    "epsilon": st.fixed_dictionaries({"epsilon_cutoff": _rounded(0.01, 1000)}),
    "typical": st.fixed_dictionaries({"typical_p": _rounded(0.05, 1)}),
    "xtc": st.fixed_dictionaries({"xtc_threshold": _rounded(0.01, 0.4), "xtc_probability": _rounded(0, 1)}),
    "smoothing": st.fixed_dictionaries({"smoothing_factor": _rounded(0.01, 2), "smoothing_curve": _rounded(1, 4)}),
    "dynatemp": st.tuples(_rounded(0, 2), _rounded(0, 2), _rounded(0, 3)).map(
        lambda t: {"dynatemp_min": min(t[:2]), "dynatemp_max": max(t[:2]), "dynatemp_exponent": t[2]}),
    "mirostat": st.fixed_dictionaries({"mirostat_mode": st.just(2), "mirostat_tau": _rounded(0, 8),
                                       "mirostat_eta": _rounded(0, 1)}),
}


@st.composite
def rows(draw: st.DrawFn, stages: list[str] | None = None) -> tuple[Row, np.ndarray]:
    chosen = stages if stages is not None else draw(st.lists(st.sampled_from(sorted(STAGES)), max_size=5,
                                                             unique=True))
    knobs: dict[str, Any] = {"temperature": draw(st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.6]))}
    for stage in chosen:
        knobs.update(draw(STAGES[stage]))
    knobs["max_tokens"] = None
    generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # A few distinct tokens, so that histories repeat (penalties, DRY) and logits tie sometimes.
    history_vocab = draw(st.integers(2, VOCAB))
    prompt = generator.integers(0, history_vocab, draw(st.integers(1, 30))).tolist()
    output = generator.integers(0, history_vocab, draw(st.integers(0, 30))).tolist()
    scale = draw(st.sampled_from([0.5, 2.0, 4.0]))
    logits = (generator.normal(0, scale, VOCAB)).astype(np.float32)
    if draw(st.booleans()):
        logits = np.round(logits * 2) / 2  # exact ties
    mu = draw(st.none() | _rounded(0, 20)) if knobs.get("mirostat_mode") == 2 else None
    row = Row(SamplingParams(**knobs), prompt, output, seed=draw(st.integers(0, 2**63 - 1)),
              choice_index=draw(st.integers(0, 3)), mirostat_mu=mu, stop_token_ids=(1, 2))
    return row, logits


def _assert_matches_reference(sampler: Sampler, row: Row, logits: np.ndarray) -> None:
    batch = batch_of([row])
    expected = reference_of(row, logits, _is_breaker(row.params.dry_sequence_breakers))
    scaled = sampler.process_logits(torch.from_numpy(logits[None]), batch)
    processed = torch.log_softmax(scaled, dim=-1)[0].numpy()
    finite = np.isfinite(expected.logprobs)
    np.testing.assert_array_equal(np.isfinite(processed), finite, err_msg="different tokens masked")
    np.testing.assert_allclose(processed[finite], expected.logprobs[finite], rtol=1e-5,
                               atol=_float32_tolerance(scaled[0].numpy()))
    output = sampler(torch.from_numpy(logits[None]), batch)
    assert output.token_ids[0] == expected.token
    if expected.next_mu is not None:
        assert output.mirostat_mu[0] == pytest.approx(expected.next_mu, rel=1e-6, abs=1e-6)


def _float32_tolerance(scaled_logits: np.ndarray) -> float:
    """How far a float32 log-softmax may honestly be from float64's: it subtracts the log-sum-exp from
    each logit, so its error is a few ulps of the largest logit's magnitude, not of the result. Example:
    logits near -280 (temperature 0.3) leave the top token's logprob near 0 with an ulp of 3.05e-5."""
    finite = scaled_logits[np.isfinite(scaled_logits)]
    magnitude = float(np.abs(finite).max()) if finite.size else 0.0
    return 1e-5 + 8 * float(np.finfo(np.float32).eps) * magnitude


@pytest.mark.parametrize("stage", sorted(STAGES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_stage_alone_matches_the_reference(stage: str, data: st.DataObject) -> None:
    row, logits = data.draw(rows([stage]))
    _assert_matches_reference(_sampler(), row, logits)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rows())
def test_stages_in_combination_match_the_reference(case: tuple[Row, np.ndarray]) -> None:
    row, logits = case
    _assert_matches_reference(_sampler(), row, logits)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=rows(), others=st.lists(rows(), min_size=1, max_size=6), position=st.integers(0, 6))
def test_a_row_gives_the_same_result_alone_and_inside_any_batch(
        target: tuple[Row, np.ndarray], others: list[tuple[Row, np.ndarray]], position: int) -> None:
    everyone = list(others)
    index = min(position, len(everyone))
    everyone.insert(index, target)
    sampler = _sampler()
    target_row, target_logits = target
    target_row.params = SamplingParams(**{**_as_kwargs(target_row.params), "logprobs": 5})
    alone = sampler(torch.from_numpy(target_logits[None]), batch_of([target_row]))
    batched = sampler(torch.from_numpy(np.stack([logits for _, logits in everyone])),
                      batch_of([row for row, _ in everyone]))
    assert batched.token_ids[index] == alone.token_ids[0]
    assert batched.chosen_logprobs[index] == alone.chosen_logprobs[0]
    assert batched.chosen_ranks[index] == alone.chosen_ranks[0]
    np.testing.assert_array_equal(batched.top_token_ids[index, :5], alone.top_token_ids[0])
    np.testing.assert_array_equal(batched.top_logprobs[index, :5], alone.top_logprobs[0])
    if alone.mirostat_mu is not None:
        assert batched.mirostat_mu[index] == alone.mirostat_mu[0]


def _as_kwargs(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}


# ---- sampled frequencies -------------------------------------------------------------------------

LOGITS_8 = np.array([0.5, 2.0, -1.5, 0.0, 1.0, -0.5, 1.6, 0.2], dtype=np.float32)
NUM_DRAWS = 20_000


@pytest.mark.parametrize("knobs", [
    {"temperature": 0.9, "tfs": 0.7},
    {"temperature": 1.2, "typical_p": 0.6},
    {"temperature": 1.0, "eta_cutoff": 800.0, "epsilon_cutoff": 300.0},
    {"temperature": 1.0, "xtc_threshold": 0.12, "xtc_probability": 0.5},
    {"smoothing_factor": 0.6, "smoothing_curve": 1.5, "dynatemp_min": 0.5, "dynatemp_max": 1.8},
    {"temperature": 1.0, "mirostat_mode": 2, "mirostat_tau": 1.2, "mirostat_eta": 0.1},
    {"temperature": 0.8, "top_a": 0.6, "top_k": 6},
], ids=lambda knobs: ",".join(f"{key}={value}" for key, value in knobs.items()))
def test_sampled_frequencies_match_the_reference_distribution(knobs: dict[str, Any]) -> None:
    row = Row(SamplingParams(max_tokens=None, **knobs), prompt=[3, 4], output=[5])
    batch = batch_of([row], gather=np.zeros(NUM_DRAWS, np.int64))
    batch.seeds = np.arange(NUM_DRAWS, dtype=np.uint64) * np.uint64(7919) + np.uint64(13)
    output = _sampler(8)(torch.from_numpy(np.tile(LOGITS_8, (NUM_DRAWS, 1))), batch)
    observed = np.bincount(output.token_ids, minlength=8)
    expected = _reference_distribution(row, LOGITS_8) * NUM_DRAWS
    kept = expected > 0
    assert observed[~kept].sum() == 0, "a masked token was sampled"
    assert stats.chisquare(observed[kept], expected[kept]).pvalue > 1e-3


def _reference_distribution(row: Row, logits: np.ndarray) -> np.ndarray:
    """The final distribution; with XTC, the mixture over its coin (applied with probability q)."""
    knobs = knobs_of(row.params)
    run = {"prompt": row.prompt, "output": row.output}
    without = softmax(reference_row(logits, knobs, **run, xtc_uniform=1.0).logits)
    if knobs.xtc_probability == 0:
        return without
    with_xtc = softmax(reference_row(logits, knobs, **run, xtc_uniform=0.0).logits)
    return knobs.xtc_probability * with_xtc + (1 - knobs.xtc_probability) * without


def test_xtc_coin_is_its_own_stream_so_the_token_draw_is_unchanged() -> None:
    # With XTC's threshold above every probability, the coin changes nothing: same tokens as without.
    plain = Row(SamplingParams(max_tokens=None, temperature=0.9), prompt=[3], output=[])
    coin = Row(SamplingParams(max_tokens=None, temperature=0.9, xtc_threshold=0.99, xtc_probability=1.0),
               prompt=[3], output=[])
    draws = np.zeros(2000, np.int64)
    sampler = _sampler(8)
    tokens = []
    for row in (plain, coin):
        batch = batch_of([row], gather=draws)
        batch.seeds = np.arange(2000, dtype=np.uint64)
        tokens.append(sampler(torch.from_numpy(np.tile(LOGITS_8, (2000, 1))), batch).token_ids)
    np.testing.assert_array_equal(tokens[0], tokens[1])


def test_min_p_and_top_a_without_a_sort_drop_what_the_sorted_path_drops() -> None:
    """Stage 4 skips its sort when no row uses top-p or top-k; with ties at the top and top_a
    large enough to drop every token but one, it keeps the lowest id, as the sorted path does."""
    from pipeline.sampling.truncation import apply_top_p_k_min_a

    generator = np.random.default_rng(11)
    logits = torch.from_numpy(generator.normal(0, 2, (6, 40)).astype(np.float32))
    logits[0, [3, 17]] = logits[0].max() + 1  # a tie at the top
    min_p = np.array([0.0, 0.1, 0.3, 0.0, 0.05, 0.9], np.float32)
    top_a = np.array([50.0, 0.0, 0.0, 0.5, 0.2, 0.0], np.float32)
    ones, offs = np.ones(6, np.float32), np.zeros(6, np.int32)
    sort_free = apply_top_p_k_min_a(logits.clone(), ones, offs, min_p, top_a)
    nearly_one = np.full(6, np.nextafter(np.float32(1), np.float32(0)))  # forces the sorted path, drops nothing more
    sorted_path = apply_top_p_k_min_a(logits.clone(), nearly_one, offs, min_p, top_a)
    np.testing.assert_array_equal(sort_free.numpy(), sorted_path.numpy())
    assert np.isfinite(sort_free[0].numpy()).tolist() == [i == 3 for i in range(40)]


def test_smoothing_with_curve_one_keeps_masked_tokens_masked_and_matches_the_reference() -> None:
    """Curve 1 (the default) takes a shorter path: top - f * d^2, with no finiteness mask."""
    from pipeline.sampling.reshaping import apply_smoothing
    from tests.support.sampling_reference import smoothing

    logits = np.random.default_rng(4).normal(0, 3, (3, 30)).astype(np.float32)
    logits[1, [0, 7]] = -np.inf
    factors = np.array([0.3, 1.7, 0.01], np.float32)
    ours = apply_smoothing(torch.from_numpy(logits.copy()), factors, np.ones(3, np.float32)).numpy()
    for row in range(3):
        np.testing.assert_allclose(ours[row], smoothing(logits[row].astype(np.float64), float(factors[row]), 1.0),
                                   rtol=1e-5, atol=1e-5)
    assert np.isneginf(ours[1, [0, 7]]).all() and np.isfinite(np.delete(ours[1], [0, 7])).all()


def test_a_quadratic_smoothing_row_is_bit_identical_beside_a_cubic_one() -> None:
    """A curve-1 row alone takes smoothing's quadratic shortcut; beside a row of another curve the
    batch takes the general formula, which must round the same for it (hypothesis found 1 ulp)."""
    rng = np.random.default_rng(5)
    quadratic = Row(SamplingParams(temperature=0.3, smoothing_factor=1.5, logprobs=5), [1, 2], [3])
    cubic = Row(SamplingParams(temperature=0.7, smoothing_factor=1.0, smoothing_curve=2.5), [4], [])
    logits = rng.normal(0, 3, (2, VOCAB)).astype(np.float32)
    sampler = _sampler()
    alone = sampler(torch.from_numpy(logits[:1]), batch_of([quadratic]))
    batched = sampler(torch.from_numpy(logits), batch_of([quadratic, cubic]))
    np.testing.assert_array_equal(batched.top_logprobs[0, :5], alone.top_logprobs[0])
    assert batched.chosen_logprobs[0] == alone.chosen_logprobs[0]


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab:\n\0é", max_size=6), min_size=1, max_size=40),
       breakers=st.lists(st.text(alphabet="ab:\n\0é", min_size=1, max_size=3), max_size=5))
def test_breaker_masks_mark_exactly_the_tokens_whose_text_holds_a_breaker(texts: list[str],
                                                                          breakers: list[str]) -> None:
    """One pass over the joined texts gives the mask the definition gives (NUL-holding breakers
    match nothing: no token's text holds NUL)."""
    mask = SequenceBreakers(lambda ids: texts[ids[0]], len(texts)).mask(tuple(breakers))
    expected = [any(b in text.replace("\0", "") for b in breakers if "\0" not in b) for text in texts]
    assert mask.tolist() == expected
