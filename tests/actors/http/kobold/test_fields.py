"""Kobold's generate fields onto our sampling parameters (actors/http/kobold/fields.py, sampler_order.py):
what each field becomes, which values are accepted with no effect, and which are errors naming the field."""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import pytest

from actors.http.kobold.fields import KNOWN, KoboldFieldError, parse_generate_body
from actors.http.kobold.genkeys import Genkeys
from actors.http.kobold.sampler_order import OUR_ORDER, check_sampler_order
from actors.http.openapi import openapi_document
from pipeline.request.sampling_params import SamplingParams

MODEL_LEN = 2048
# What SillyTavern's server forwards to /api/v1/generate (src/endpoints/backends/kobold.js) with its
# default Kobold settings (public/scripts/kai-settings.js), values written out by hand.
SILLYTAVERN_DEFAULTS: dict[str, Any] = {
    "prompt": "A chat between Alice and Bob.\nAlice: Hi!\nBob:", "use_story": False, "use_memory": False,
    "use_authors_note": False, "use_world_info": False, "max_context_length": 2048, "max_length": 100,
    "rep_pen": 1, "rep_pen_range": 0, "rep_pen_slope": 0.9, "temperature": 1, "tfs": 1, "top_a": 1, "top_k": 0,
    "top_p": 1, "min_p": 0, "typical": 1, "sampler_order": [0, 1, 2, 3, 4, 5, 6], "singleline": False,
    "use_default_badwordsids": False, "mirostat": 0, "mirostat_eta": 0.1, "mirostat_tau": 5, "grammar": "",
    "stop_sequence": ["\nAlice:", "\nBob:"],
}
# KoboldAI Lite's shape of body (genkey, trim_stop, dynatemp, DRY, XTC), values of our choosing.
KOBOLD_LITE: dict[str, Any] = {
    "n": 1, "max_context_length": 1024, "max_length": 64, "rep_pen": 1.07, "temperature": 0.75, "top_p": 0.92,
    "top_k": 100, "top_a": 0, "typical": 1, "tfs": 1, "rep_pen_range": 0, "rep_pen_slope": 0.7,
    "sampler_order": [6, 0, 1, 3, 4, 2, 5], "memory": "", "trim_stop": True, "genkey": "KCPP4821", "min_p": 0.05,
    "dynatemp_range": 0.25, "dynatemp_exponent": 1, "smoothing_factor": 0, "nsigma": 0, "banned_tokens": [],
    "render_special": False, "logprobs": False, "presence_penalty": 0, "logit_bias": {}, "quiet": True,
    "stop_sequence": ["You:"], "use_default_badwordsids": False, "bypass_eos": False, "prompt": "Once upon",
    "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 360,
    "dry_sequence_breakers": ["\n", ":"], "xtc_threshold": 0.15, "xtc_probability": 0.5,
}


def parse(**fields: Any) -> dict[str, Any]:
    body = {"prompt": "hi", "max_length": 16, "max_context_length": 512, **fields}
    return parse_generate_body(body, MODEL_LEN).params


def refused(field: str, **fields: Any) -> str:
    with pytest.raises(KoboldFieldError) as caught:
        parse(**fields)
    assert caught.value.field == field, str(caught.value)
    return str(caught.value)


def test_sillytavern_s_default_body_maps_onto_valid_sampling_params() -> None:
    request = parse_generate_body(SILLYTAVERN_DEFAULTS, MODEL_LEN)
    params = request.params
    assert request.prompt == SILLYTAVERN_DEFAULTS["prompt"] and request.genkey is None
    assert params["max_tokens"] == 100 and params["truncate_prompt_tokens"] == 2048 - 100
    assert params["top_k"] == -1 and params["top_a"] == 1 and params["stop"] == ["\nAlice:", "\nBob:"]
    assert params["mirostat_mode"] == 0 and "guided_grammar" not in params and "min_tokens" not in params
    SamplingParams.from_dict(params)


def test_kobold_lite_s_body_maps_every_sampler() -> None:
    request = parse_generate_body(KOBOLD_LITE, MODEL_LEN)
    params = request.params
    assert request.genkey == "KCPP4821"
    assert params["repetition_penalty"] == 1.07 and params["include_stop_str_in_output"] is False
    assert params["dynatemp_min"] == pytest.approx(0.5) and params["dynatemp_max"] == pytest.approx(1.0)
    assert params["dry_range"] == 360 and params["dry_multiplier"] == 0.8 and params["xtc_probability"] == 0.5
    assert params["skip_special_tokens"] is True and params["ignore_eos"] is False and params["min_p"] == 0.05
    SamplingParams.from_dict(params)


def test_kobold_s_off_values_become_ours() -> None:
    params = parse(top_k=0, top_p=0, typical=0)
    assert (params["top_k"], params["top_p"], params["typical_p"]) == (-1, 1.0, 1.0)
    assert parse(sampler_seed=-1).get("seed") is None and parse(sampler_seed=7)["seed"] == 7


def test_the_prompt_keeps_what_the_context_leaves_and_the_model_caps_the_context() -> None:
    assert parse(max_context_length=100, max_length=30)["truncate_prompt_tokens"] == 70
    assert parse(max_context_length=10**6, max_length=48)["truncate_prompt_tokens"] == MODEL_LEN - 48
    assert "max_context_length" in refused("max_length", max_context_length=40, max_length=40)
    refused("max_length", max_length=0)
    refused("max_context_length", max_context_length="2048")


def test_use_default_badwordsids_bans_eos_for_the_whole_answer() -> None:
    assert parse(use_default_badwordsids=True, max_length=16)["min_tokens"] == 16
    assert "min_tokens" not in parse(use_default_badwordsids=False)


def test_trim_stop_singleline_and_render_special() -> None:
    assert parse(trim_stop=False)["include_stop_str_in_output"] is True
    assert parse(stop_sequence=["END"], singleline=True)["stop"] == ["END", "\n"]
    assert parse(render_special=True)["skip_special_tokens"] is False
    refused("trim_stop", trim_stop=True, include_stop_str_in_output=True)


def test_grammar_becomes_a_structured_output_and_an_empty_one_asks_for_none() -> None:
    assert parse(grammar='root ::= "yes"')["guided_grammar"] == 'root ::= "yes"'
    assert "guided_grammar" not in parse(grammar="")


def test_a_repetition_range_and_slope_become_the_window_as_koboldcpp_reads_them() -> None:
    windowed = parse(rep_pen=1.1, rep_pen_range=256, rep_pen_slope=0.7, max_context_length=1024)
    assert (windowed["repetition_penalty_range"], windowed["repetition_penalty_slope"]) == (256, 0.7)
    flat = parse(rep_pen=1.1, rep_pen_range=256, rep_pen_slope=0)  # outside (0, 1]: flat, as KoboldCpp clamps
    assert flat["repetition_penalty_range"] == 256 and "repetition_penalty_slope" not in flat
    whole = parse(rep_pen=1.1, rep_pen_range=0, rep_pen_slope=0.9)
    assert whole["repetition_penalty"] == 1.1 and "repetition_penalty_range" not in whole
    refused("rep_pen_slope", rep_pen=1.1, rep_pen_range=64, rep_pen_slope="steep")
    refused("rep_pen_range", rep_pen=1.1, rep_pen_range=-1)


@pytest.mark.parametrize(("field", "value"), [
    ("use_story", True), ("use_world_info", True), ("soft_prompt", "x"), ("memory", "Remember"),
    ("frmtrmblln", True), ("banned_tokens", ["slop"]), ("images", ["aGk="]), ("nsigma", 1.0), ("logprobs", True),
    ("grammar_retain_state", True), ("quiet", "yes"), ("sampler_full_determinism", True),
])
def test_a_feature_we_lack_is_refused_naming_its_field(field: str, value: Any) -> None:
    refused(field, **{field: value})


def test_neutral_values_of_missing_features_are_accepted() -> None:
    assert parse(use_story=False, soft_prompt="", memory="", banned_tokens=[], nsigma=0, quiet=True,
                 disable_output_formatting=True, frmttriminc=False, sampler_full_determinism=True, sampler_seed=3)


def test_unknown_fields_are_refused_and_listed() -> None:
    message = refused("temprature", temprature=0.5)
    assert "temprature" in message and "temperature" in message
    assert {"rep_pen", "sampler_order", "genkey", "dry_multiplier", "xtc_threshold"} <= KNOWN


def test_bad_genkeys_and_prompts_are_refused() -> None:
    refused("genkey", genkey="a b")
    refused("genkey", genkey="k" * 129)
    with pytest.raises(KoboldFieldError) as caught:
        parse_generate_body({"max_length": 8, "max_context_length": 64}, MODEL_LEN)
    assert caught.value.field == "prompt"
    with pytest.raises(KoboldFieldError):
        parse_generate_body(["prompt"], MODEL_LEN)


def test_sampler_order_equal_to_ours_up_to_unused_and_commuting_samplers_is_accepted() -> None:
    ours = {"repetition_penalty": 1.1, "top_k": 40, "top_p": 0.9, "tfs": 0.95, "typical_p": 0.9, "temperature": 0.7}
    check_sampler_order(list(OUR_ORDER), ours)
    check_sampler_order([6, 2, 1, 0, 3, 4, 5], ours)  # top-k, top-a, top-p cut one distribution here
    check_sampler_order([5, 6, 0, 1, 2, 3, 4], {"repetition_penalty": 1.1, "top_k": 40, "temperature": 0.7})
    check_sampler_order([0, 1, 2, 3, 4, 5, 6], {"top_a": 1})  # SillyTavern's default order, one sampler on
    check_sampler_order([6, 5, 3, 0, 1, 2, 4], {"temperature": 0, "tfs": 0.9, "repetition_penalty": 1.2})


def test_sampler_order_that_would_change_the_result_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("tfs (3) before top_p (2)")):
        check_sampler_order([6, 0, 1, 3, 4, 2, 5], {"top_p": 0.9, "tfs": 0.9})
    with pytest.raises(ValueError, match=re.escape("temperature (5) before top_p")):
        check_sampler_order([6, 5, 0, 1, 2, 3, 4], {"top_p": 0.9, "temperature": 0.7})
    with pytest.raises(ValueError, match=re.escape("top_k (0) before rep_pen")):  # greedy: the cut set decides
        check_sampler_order([0, 6, 1, 2, 3, 4, 5], {"top_k": 5, "repetition_penalty": 1.3, "temperature": 0})
    for bad in ([0, 1, 2], [0, 1, 2, 3, 4, 5, 5], "6012345", [0, 1, 2, 3, 4, 5, 6.0]):
        with pytest.raises(ValueError, match="each of the samplers 0-6 once"):
            check_sampler_order(bad, {})
    assert "sampler_order" in refused("sampler_order", top_p=0.9, tfs=0.9, sampler_order=[6, 0, 1, 3, 4, 2, 5])


def test_genkeys_belong_to_the_client_that_sent_them() -> None:
    genkeys = Genkeys(capacity=2)
    genkeys.bind("Bearer a", "KCPP1", "req-1")
    genkeys.bind("Bearer b", "KCPP1", "req-2")
    assert genkeys.request_id("Bearer a", "KCPP1") == "req-1"
    assert genkeys.request_id("Bearer b", "KCPP1") == "req-2"
    assert genkeys.request_id(None, "KCPP1") is None
    genkeys.bind("Bearer a", "KCPP2", "req-3")  # the oldest binding is forgotten
    assert genkeys.request_id("Bearer a", "KCPP1") is None


def test_the_openapi_document_describes_the_kobold_body_field_by_field() -> None:
    paths = openapi_document()["paths"]
    assert {"/api/v1/generate", "/api/extra/generate/stream", "/api/extra/abort", "/api/extra/tokencount",
            "/api/v1/model", "/api/v1/config/max_context_length"} <= set(paths)
    schema = paths["/api/v1/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["properties"]) == KNOWN
    validator = jsonschema_rs.Draft202012Validator(schema)
    assert validator.is_valid(SILLYTAVERN_DEFAULTS) and validator.is_valid(KOBOLD_LITE)
    for bad in ({"temprature": 1}, {"use_story": True}, {"top_p": 1.5}, {"sampler_order": [0, 1]}):
        assert not validator.is_valid({**SILLYTAVERN_DEFAULTS, **bad}), bad
