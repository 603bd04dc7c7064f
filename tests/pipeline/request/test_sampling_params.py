"""SamplingParams: OpenAI/vLLM defaults, normalization, and errors that name the field and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.request.sampling_params import SamplingParams, SamplingType
from pipeline.tensor_prep.sampling_rows import SamplingRowValues, classic_row_values


def test_defaults_match_openai_and_vllm() -> None:
    params = SamplingParams()
    assert (params.n, params.best_of, params.max_tokens) == (1, 1, 16)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, -1, 0.0)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    assert params.seed is None
    assert params.stop == ()
    assert params.stop_token_ids == ()
    assert (params.ignore_eos, params.min_tokens, params.logprobs, params.prompt_logprobs) == (
        False, 0, None, None)
    assert params.include_stop_str_in_output is False
    assert params.skip_special_tokens is True
    assert params.sampling_type is SamplingType.RANDOM


def test_params_are_immutable() -> None:
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(("stop", "expected"), [
    (None, ()), ("###", ("###",)), (["a", "bc"], ("a", "bc")), (("x",), ("x",)),
])
def test_stop_is_normalized_to_a_tuple(stop: Any, expected: tuple[str, ...]) -> None:
    assert SamplingParams(stop=stop).stop == expected


def test_stop_token_ids_are_normalized_and_top_k_minus_one_is_kept_as_off() -> None:
    params = SamplingParams(stop_token_ids=[2, 7], top_k=-1)
    assert params.stop_token_ids == (2, 7)
    assert params.top_k == -1
    assert classic_row_values(params).top_k == 0  # the batch column's "off"


def test_integral_floats_become_floats() -> None:
    params = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert isinstance(params.temperature, float)
    assert isinstance(params.repetition_penalty, float)


def test_best_of_equal_to_n_is_accepted() -> None:
    assert SamplingParams(n=3, best_of=3).best_of == 3
    assert SamplingParams(n=3).best_of == 3
    assert SamplingParams(n=2, best_of=4).ranks_choices
    assert not SamplingParams(n=3, best_of=3).ranks_choices


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 0}, r"n must be in \[1, 128\], got 0"),
    ({"n": 129}, r"n must be in \[1, 128\], got 129"),
    ({"n": 3, "best_of": 2}, r"best_of must be None or in \[n \(3\), 128\], got 2"),
    ({"n": 2, "best_of": 129}, r"best_of must be None or in \[n \(2\), 128\], got 129"),
    ({"max_tokens": -1}, "max_tokens must be >= 0, got -1"),
    ({"max_tokens": 0, "use_beam_search": True, "best_of": 2, "temperature": 0},
     "max_tokens must be >= 1 with use_beam_search"),
    ({"temperature": -1}, "temperature must be >= 0, got -1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ({"top_k": -2}, "top_k must be -1 \\(off\\) or >= 1, got -2"),
    ({"top_k": 0}, "top_k must be -1 \\(off\\) or >= 1, got 0"),  # docs/sampling.md: 0 is an error, not "off"
    ({"min_p": 1.1}, r"min_p must be in \[0, 1\], got 1.1"),
    ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\], got 2.5"),
    ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2, 2\], got -3"),
    ({"repetition_penalty": 0}, "repetition_penalty must be > 0, got 0"),
    ({"min_tokens": -1}, "min_tokens must be >= 0, got -1"),
    ({"min_tokens": 20, "max_tokens": 10}, r"min_tokens must be <= max_tokens \(10\), got 20"),
    ({"logprobs": -1}, r"logprobs must be >= 0 or None, got -1"),  # the upper bound is --max-logprobs, at intake
    ({"prompt_logprobs": -1}, r"prompt_logprobs must be >= 0 or None, got -1"),
    ({"stop": ["ok", ""]}, "stop must not contain empty strings"),
    ({"stop": ""}, "stop must not contain empty strings"),
    ({"stop": [1]}, "stop must contain only strings"),
    ({"stop_token_ids": [-3]}, "stop_token_ids must be >= 0, got -3"),
    ({"temperature": float("nan")}, "temperature must be finite"),
])
def test_invalid_values_name_the_field_and_the_rule(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ignore_eos": 1}, "ignore_eos must be a bool, got int 1"),
    ({"skip_special_tokens": "yes"}, "skip_special_tokens must be a bool"),
    ({"max_tokens": 16.0}, "max_tokens must be an int or None, got float 16.0"),
    ({"max_tokens": True}, "max_tokens must be an int or None, got bool True"),
    ({"n": 2.0}, "n must be an int, got float"),
    ({"top_k": 5.5}, "top_k must be an int"),
    ({"seed": "7"}, "seed must be an int or None, got str"),
    ({"temperature": "hot"}, "temperature must be a number, got str 'hot'"),
    ({"temperature": True}, "temperature must be a number, got bool"),
    ({"stop_token_ids": [1.0]}, r"stop_token_ids\[\] must be an int"),
    ({"stop_token_ids": 5}, "stop_token_ids must be a list of ints"),
])
def test_wrong_types_are_rejected_with_the_field_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_max_tokens_none_means_until_max_model_len_and_skips_the_min_tokens_bound() -> None:
    params = SamplingParams(max_tokens=None, min_tokens=1000)
    assert params.max_tokens is None
    assert params.min_tokens == 1000


def test_from_dict_builds_params() -> None:
    params = SamplingParams.from_dict({"temperature": 0, "max_tokens": 5, "stop": "\n", "seed": 3})
    assert params == SamplingParams(temperature=0.0, max_tokens=5, stop=("\n",), seed=3)


def test_from_dict_rejects_unknown_keys_and_names_them() -> None:
    with pytest.raises(ValueError, match="unknown sampling parameter\\(s\\): max_token, temprature"):
        SamplingParams.from_dict({"temprature": 0.5, "max_token": 3, "top_p": 0.9})


def test_from_dict_type_checks() -> None:
    with pytest.raises(ValueError, match="max_tokens must be an int or None, got str '5'"):
        SamplingParams.from_dict({"max_tokens": "5"})
    with pytest.raises(ValueError, match="params must be a map, got list"):
        SamplingParams.from_dict([("n", 1)])  # type: ignore[arg-type]


def test_temperature_zero_is_greedy() -> None:
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0).sampling_type is SamplingType.GREEDY
    assert not SamplingParams(temperature=0.7).is_greedy


def test_row_values_use_neutral_values_when_knobs_are_off() -> None:
    assert classic_row_values(SamplingParams()) == SamplingRowValues(
        temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
        repetition_penalty=1.0, num_logprobs=-1)
    assert not SamplingParams().needs_penalties


def test_row_values_of_greedy_requests_drop_truncation_but_keep_penalties() -> None:
    params = SamplingParams(temperature=0, top_p=0.5, top_k=3, min_p=0.2, repetition_penalty=1.3,
                            logprobs=2)
    values = classic_row_values(params)
    assert (values.temperature, values.top_p, values.top_k, values.min_p) == (0.0, 1.0, 0, 0.0)
    assert values.repetition_penalty == pytest.approx(1.3)
    assert values.num_logprobs == 2
    assert params.needs_penalties


def test_row_values_of_random_requests_carry_every_knob() -> None:
    values = classic_row_values(SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
                            frequency_penalty=-0.5, logprobs=0))
    assert values == SamplingRowValues(0.7, 0.9, 40, 0.05, 0.5, -0.5, 1.0, 0)
