"""The new sampling parameters everywhere parameters are accepted: errors that name the field and
its range, the rules intake checks against the model, the wire and batch-file forms, flags."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from actors.cli.batch import read_batch_file
from actors.cli.engine_args import engine_config_from_args
from actors.cli.main import build_parser
from actors.kit.message_codec import decode_message, encode_message
from actors.kit.messages import Admit
from pipeline.intake.request_builder import RequestBuilder
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling import rng
from pipeline.sampling.dry import SequenceBreakers, dry_penalties, token_decoder
from pipeline.sampling.sampler import Sampler
from pipeline.tensor_prep.sampling_rows import advanced_row_values, classic_row_values
from queue_adapters.codec import CodecError, decode_request, encode
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.sampling_helpers import Row, batch_of
from tests.support.sampling_reference import Knobs, dry


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"top_a": -0.1}, r"top_a must be >= 0, got -0.1"),
    ({"tfs": 0}, r"tfs must be in \(0, 1\], got 0"),
    ({"tfs": 1.2}, r"tfs must be in \(0, 1\], got 1.2"),
    ({"eta_cutoff": -1}, r"eta_cutoff must be >= 0, got -1"),
    ({"epsilon_cutoff": 1001}, r"epsilon_cutoff must be in \[0, 1000\], got 1001"),
    ({"typical_p": 0}, r"typical_p must be in \(0, 1\], got 0"),
    ({"smoothing_factor": -2}, r"smoothing_factor must be >= 0, got -2"),
    ({"smoothing_curve": 0.5}, r"smoothing_curve must be >= 1, got 0.5"),
    ({"dynatemp_min": -1}, r"dynatemp_min must be >= 0, got -1"),
    ({"dynatemp_min": 2, "dynatemp_max": 1}, r"dynatemp_min must be <= dynatemp_max \(1\), got 2"),
    ({"dynatemp_exponent": -1}, r"dynatemp_exponent must be >= 0, got -1"),
    ({"mirostat_mode": 1}, r"mirostat_mode must be 0 \(off\) or 2 \(mirostat v2\), got 1"),
    ({"mirostat_tau": -1}, r"mirostat_tau must be >= 0, got -1"),
    ({"mirostat_eta": -0.5}, r"mirostat_eta must be >= 0, got -0.5"),
    ({"mirostat_mode": 2.0}, "mirostat_mode must be an int, got float"),
    ({"custom_token_bans": [3, -1]}, "custom_token_bans must be >= 0, got -1"),
    ({"custom_token_bans": 3}, "custom_token_bans must be a list of ints"),
    ({"logit_bias": {"5": 101}}, r"logit_bias\[5\] must be in \[-100, 100\], got 101"),
    ({"logit_bias": {"x": 1}}, "logit_bias keys must be token ids >= 0, got 'x'"),
    ({"logit_bias": {"-3": 1}}, "logit_bias keys must be token ids >= 0"),
    ({"logit_bias": [1, 2]}, "logit_bias must be a map of token id to bias, got list"),
    ({"logit_bias": {"5": "high"}}, r"logit_bias\[5\] must be a number, got str"),
    ({"dry_multiplier": -1}, r"dry_multiplier must be >= 0, got -1"),
    ({"dry_base": 1}, r"dry_base must be > 1, got 1"),
    ({"dry_allowed_length": 0}, r"dry_allowed_length must be >= 1, got 0"),
    ({"dry_range": -1}, r"dry_range must be >= 0, got -1"),
    ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers must be a list of strings, got str"),
    ({"dry_sequence_breakers": ["\n", ""]}, "dry_sequence_breakers must not contain empty strings"),
    ({"xtc_threshold": 0}, r"xtc_threshold must be in \(0, 1\], got 0"),
    ({"xtc_probability": 1.5}, r"xtc_probability must be in \[0, 1\], got 1.5"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be >= 1 or None, got 0"),
    ({"spaces_between_special_tokens": 0}, "spaces_between_special_tokens must be a bool"),
    ({"use_beam_search": True, "best_of": 2}, r"temperature must be 0 with use_beam_search .*got 1"),
    ({"use_beam_search": True, "temperature": 0}, r"best_of \(the beam width\) must be > 1 .*got 1"),
    ({"use_beam_search": True, "temperature": 0, "best_of": 2, "early_stopping": "sometimes"},
     r"early_stopping must be true, false or \"never\", got 'sometimes'"),
    ({"use_beam_search": True, "temperature": 0, "best_of": 2, "early_stopping": 1},
     r"early_stopping must be true, false or \"never\", got 1"),
    ({"length_penalty": 0.5}, "length_penalty must be 1 without use_beam_search"),
    ({"early_stopping": "never"}, "early_stopping must be false without use_beam_search"),
])
def test_invalid_sampler_values_name_the_field_and_the_range(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_defaults_switch_every_new_sampler_off() -> None:
    params = SamplingParams()
    assert advanced_row_values(params) is None
    assert advanced_row_values(SamplingParams(temperature=0, tfs=0.5, typical_p=0.5, mirostat_mode=2)) is None, (
        "greedy rows skip stages 4-12, so those knobs cost them nothing")
    assert advanced_row_values(SamplingParams(temperature=0, logit_bias={3: 1.0})) is not None


def test_logit_bias_takes_json_string_keys_and_normalizes_to_sorted_pairs() -> None:
    assert SamplingParams(logit_bias={"50": -100, "7": 2.5}).logit_bias == ((7, 2.5), (50, -100.0))
    assert SamplingParams(logit_bias={7: 1}).logit_bias == ((7, 1.0),)
    assert SamplingParams(logit_bias=[[7, 1.0]]).logit_bias == ((7, 1.0),)  # the normalized form again


def test_dynatemp_requests_are_random_whatever_their_temperature() -> None:
    assert not SamplingParams(temperature=0, dynatemp_min=0.5, dynatemp_max=1.5).is_greedy
    assert classic_row_values(SamplingParams(temperature=0, dynatemp_min=0.5, dynatemp_max=1.5)).temperature == 1.0


# ---- rules that need the model (intake) -------------------------------------------------------

def _builder(**kwargs: Any) -> RequestBuilder:
    return RequestBuilder(None, vocab_size=100, eos_token_ids=frozenset({2}), max_model_len=64, **kwargs)


def test_max_tokens_beyond_the_context_left_after_the_prompt_is_an_error() -> None:
    builder = _builder()
    assert builder.build("ok", SamplingParams(max_tokens=54), prompt_token_ids=list(range(10)))
    with pytest.raises(ValueError, match=r"max_tokens must be <= 54 \(max_model_len 64 minus the prompt's 10 tokens\), "
                                         r"got 1000000000000"):
        builder.build("huge", SamplingParams(max_tokens=10**12), prompt_token_ids=list(range(10)))
    assert builder.build("none", SamplingParams(max_tokens=None), prompt_token_ids=list(range(10)))


def test_logprobs_are_allowed_up_to_max_logprobs() -> None:
    with pytest.raises(ValueError, match=r"logprobs must be in \[0, 20\] or None \(--max-logprobs\), got 21"):
        _builder().build("a", SamplingParams(logprobs=21), prompt_token_ids=[1])
    with pytest.raises(ValueError, match=r"prompt_logprobs must be in \[0, 20\]"):
        _builder().build("a", SamplingParams(prompt_logprobs=21), prompt_token_ids=[1])
    assert _builder(max_logprobs=40).build("a", SamplingParams(logprobs=40), prompt_token_ids=[1])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"custom_token_bans": [5, 100]}, "custom_token_bans"),
    ({"logit_bias": {"100": 1}}, "logit_bias"),
    ({"stop_token_ids": [250]}, "stop_token_ids"),
])
def test_token_ids_outside_the_vocabulary_are_rejected(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} must hold token ids in \[0, 100\)"):
        _builder().build("a", SamplingParams(**kwargs), prompt_token_ids=[1])


def test_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    request = _builder().build("a", SamplingParams(truncate_prompt_tokens=3), prompt_token_ids=list(range(1, 90)))
    assert request.prompt_token_ids == [87, 88, 89]


# ---- the wire, actor edges, batch files, flags ------------------------------------------------

def test_wire_params_accept_the_new_fields_and_name_bad_ones() -> None:
    params = {"tfs": 0.9, "mirostat_mode": 2, "mirostat_tau": 5, "logit_bias": {"11": -100},
              "dry_multiplier": 0.8, "dry_sequence_breakers": ["\n"], "xtc_probability": 0.5}
    request = decode_request(encode({"id": "a", "prompt": "x", "params": params}))
    assert request.sampling_params().logit_bias == ((11, -100.0),)
    with pytest.raises(CodecError, match=r"params.typical_p must be in \(0, 1\], got 2"):
        decode_request(encode({"id": "a", "prompt": "x", "params": {"typical_p": 2}}))


def test_params_cross_a_redis_edge_unchanged() -> None:
    params = SamplingParams(logit_bias={3: 1.5}, dry_multiplier=1.0, dry_sequence_breakers=["\n"], mirostat_mode=2,
                            mirostat_tau=4.0, custom_token_bans=[9], truncate_prompt_tokens=8)
    admit = Admit.of(Request("r", [1, 2], params, seed=5), None)
    assert decode_message(encode_message(admit)).params == params


def test_batch_file_lines_accept_logit_bias(tmp_path) -> None:
    body = {"prompt": [5, 6], "max_tokens": 3, "logit_bias": {"7": 100}, "tfs": 0.95, "mirostat_mode": 2}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    [line] = read_batch_file(path)
    assert line.error is None
    assert line.request.sampling_params().logit_bias == ((7, 100.0),)


def test_logprobs_flags_reach_the_engine_config() -> None:
    args = build_parser().parse_args(["batch", "-i", "x", "-o", "y", "--logprobs-mode", "raw_logprobs",
                                      "--max-logprobs", "50"])
    config = engine_config_from_args(args)
    assert (config.model.logprobs_mode, config.model.max_logprobs) == ("raw_logprobs", 50)


# ---- logprobs mode, breakers, streams ---------------------------------------------------------

def test_raw_logprobs_mode_returns_the_models_log_softmax() -> None:
    logits = torch.from_numpy(np.random.default_rng(2).normal(0, 2, (1, 30)).astype(np.float32))
    row = Row(SamplingParams(max_tokens=None, temperature=0.5, top_k=3, logprobs=4), prompt=[1], output=[])
    raw = Sampler(30, logprobs_mode="raw_logprobs")(logits, batch_of([row]))
    processed = Sampler(30)(logits, batch_of([row]))
    expected = torch.log_softmax(logits, dim=-1)[0].numpy()
    assert raw.token_ids[0] == processed.token_ids[0]
    assert raw.chosen_logprobs[0] == pytest.approx(expected[raw.token_ids[0]], abs=1e-6)
    np.testing.assert_allclose(raw.top_logprobs[0], np.sort(expected)[::-1][:4], atol=1e-6)
    assert np.isneginf(processed.top_logprobs[0, 3])  # top_k 3 masked the rest of the processed distribution


def test_sequence_breaker_masks_come_from_token_texts_once_per_set() -> None:
    texts = ["a", "b\n", "c:", "d", "\n\n"]
    calls = []

    def decode(ids: list[int]) -> str:
        calls.append(ids)
        return texts[ids[0]]

    breakers = SequenceBreakers(decode, 5)
    assert breakers.mask(("\n",)).tolist() == [False, True, False, False, True]
    assert breakers.mask((":", "\n")).tolist() == [False, True, True, False, True]
    assert breakers.mask(("\n", ":")) is breakers.mask((":", "\n"))
    assert len(calls) == 5, "each token is decoded once"
    assert SequenceBreakers(None, 5).mask(("\n",)).tolist() == [False] * 5


def test_token_decoder_gives_empty_text_for_ids_the_tokenizer_lacks() -> None:
    class Tokenizer:
        def decode(self, ids, skip_special_tokens=False):
            if ids[0] >= 3:
                raise IndexError("unknown id")
            return f"<{ids[0]}>"

    decode = token_decoder(Tokenizer())
    assert (decode([1]), decode([7])) == ("<1>", "")
    assert token_decoder(None) is None


def test_the_xtc_stream_differs_from_the_token_stream() -> None:
    seeds, choices, positions = np.arange(1000, dtype=np.uint64), np.zeros(1000, np.int64), np.arange(1000)
    tokens, coins = rng.uniforms(seeds, choices, positions), rng.uniforms(seeds, choices, positions, rng.XTC_STREAM)
    np.testing.assert_array_equal(tokens, rng.uniforms(seeds, choices, positions, rng.SAMPLING_STREAM))
    assert abs(np.corrcoef(tokens, coins)[0, 1]) < 0.1
    assert (tokens != coins).all()


# ---- the whole chain through the engine --------------------------------------------------------

def test_the_whole_chain_runs_through_the_engine(default_model_path) -> None:
    engine = make_engine(default_model_path, num_kv_blocks=64)
    everything = SamplingParams(
        max_tokens=12, seed=1, ignore_eos=True, logprobs=2, repetition_penalty=1.1, custom_token_bans=[5],
        logit_bias={"6": -5}, dry_multiplier=0.8, dry_allowed_length=1, top_a=0.1, tfs=0.95, eta_cutoff=3.0,
        epsilon_cutoff=2.0, typical_p=0.95, xtc_threshold=0.1, xtc_probability=0.5, smoothing_factor=0.2,
        dynatemp_min=0.5, dynatemp_max=1.5, mirostat_mode=2, mirostat_tau=5.0, mirostat_eta=0.1)
    forced = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logit_bias={"42": 100})
    results = run_requests(engine, {"all": ("The river", everything), "forced": ("The river", forced),
                                    "plain": ("The river", SamplingParams(max_tokens=6, temperature=0))})
    choice = results["all"]["choices"][0]
    assert len(choice["token_ids"]) == 12 and 5 not in choice["token_ids"]
    assert len(choice["mirostat_mu"]) == len(results["all"]["seqs"])
    assert all(entry.rank >= 1 for entry in choice["logprobs"])
    assert results["forced"]["choices"][0]["token_ids"] == [42] * 6
    assert engine.sampler.breakers._texts is not None, "DRY's breakers were read from the tokenizer"


def test_beam_search_params_are_accepted_with_temperature_0_and_a_width() -> None:
    params = SamplingParams(use_beam_search=True, temperature=0, best_of=4, n=2, length_penalty=0.5,
                            early_stopping="never")
    assert params.reports_at_end and not params.ranks_choices and params.num_generated_choices == 1


def test_dry_never_penalises_a_breaker_that_would_continue_a_repeat() -> None:
    """docs/sampling.md: repeats do not cross a breaker, so a breaker token that would extend one (a
    newline after a repeated line, say) is not penalised; the same token as a non-breaker is."""
    context = np.array([5, 6, 7, 9, 5, 6, 7, 4, 5, 6, 7])  # 5 6 7 was followed by 9 and by 4
    knobs = (np.array([1.0]), np.array([2.0]), np.array([2]))
    plain = np.zeros(10, np.bool_)
    nine_breaks = plain.copy()
    nine_breaks[9] = True
    _, tokens, penalties = dry_penalties([context], [plain], *knobs)
    assert dict(zip(tokens.tolist(), penalties.tolist(), strict=True)) == {9: 2.0, 4: 2.0}  # n = 3: 1 * 2^(3-2)
    _, tokens, penalties = dry_penalties([context], [nine_breaks], *knobs)
    assert dict(zip(tokens.tolist(), penalties.tolist(), strict=True)) == {4: 2.0}
    logits = np.random.default_rng(5).normal(0, 1, 10)
    reference = dry(logits, Knobs(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2), context.tolist(),
                    nine_breaks)
    np.testing.assert_allclose(reference - logits, [0, 0, 0, 0, -2.0, 0, 0, 0, 0, 0])
