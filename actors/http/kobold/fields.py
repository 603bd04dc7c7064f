"""Kobold generate bodies -> our prompt and sampling parameters, field by field (docs/kobold.md).

Every field Kobold clients send is one of: renamed onto a sampling parameter; translated (Kobold's
"off" values, dynatemp_range, trim_stop, ...); accepted with no effect because the value asks for
nothing this server would do differently; or an error naming it, because we cannot honour it.
Unknown fields are errors too. `null` means absent, as everywhere on this server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from actors.http.kobold.sampler_order import check_sampler_order

# Kobold's name -> ours, values passed as they are (SamplingParams checks them).
RENAMED = {"max_length": "max_tokens", "rep_pen": "repetition_penalty", "typical": "typical_p",
           "eps_cutoff": "epsilon_cutoff", "stop_sequence": "stop", "mirostat": "mirostat_mode",
           "dry_penalty_last_n": "dry_range", "bypass_eos": "ignore_eos"}
SAME_NAME = ("n", "temperature", "top_p", "top_k", "top_a", "min_p", "tfs", "eta_cutoff", "smoothing_factor",
             "smoothing_curve", "dynatemp_exponent", "presence_penalty", "mirostat_tau", "mirostat_eta",
             "xtc_threshold", "xtc_probability", "dry_multiplier", "dry_base", "dry_allowed_length",
             "dry_sequence_breakers", "include_stop_str_in_output", "logit_bias")
# Accepted with any value of their type: they change nothing here (logging, or formatting we never do).
NO_EFFECT = {"quiet": bool, "disable_input_formatting": bool, "disable_output_formatting": bool}
# Features this server does not have: accepted only with the value that asks for none of it.
NEUTRAL = {"use_story": (False,), "use_memory": (False,), "use_authors_note": (False,), "use_world_info": (False,),
           "use_userscripts": (False,), "soft_prompt": ("",), "memory": ("",), "frmttriminc": (False,),
           "frmtrmblln": (False,), "frmtrmspch": (False,), "frmtadsnsp": (False,), "banned_tokens": ([],),
           "images": ([],), "nsigma": (0,), "logprobs": (False,), "replace_instruct_placeholders": (False,),
           "grammar_retain_state": (False,)}
_WHY_NOT = {"memory": "memory text is not kept apart from the prompt here; prepend it to prompt",
            "banned_tokens": "phrase bans are not supported; logit_bias bans single tokens",
            "images": "images are not supported on this route; use /v1/chat/completions",
            "nsigma": "top-n-sigma sampling is not supported", "logprobs": "this route returns no logprobs"}
# Handled in code below (translated or checked against other fields).
TRANSLATED = ("prompt", "max_context_length", "genkey", "rep_pen_range", "rep_pen_slope", "dynatemp_range",
              "sampler_seed", "trim_stop", "singleline", "use_default_badwordsids", "grammar", "render_special",
              "sampler_order", "sampler_full_determinism")
KNOWN = frozenset({*RENAMED, *SAME_NAME, *NO_EFFECT, *NEUTRAL, *TRANSLATED})
_GENKEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(slots=True)
class KoboldRequest:
    prompt: str
    params: dict[str, Any]  # ours, for SamplingParams.from_dict
    genkey: str | None


class KoboldFieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_generate_body(body: Any, max_model_len: int | None) -> KoboldRequest:
    """The prompt and our sampling parameters of a Kobold body; KoboldFieldError naming the field."""
    if not isinstance(body, dict):
        raise KoboldFieldError("body", f"the body must be a JSON object, got {type(body).__name__}")
    body = {key: value for key, value in body.items() if value is not None}
    unknown = sorted(str(key) for key in body if key not in KNOWN)
    if unknown:
        raise KoboldFieldError(unknown[0], f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(KNOWN))})")
    _check_neutral(body)
    params = {ours: body[kobold] for kobold, ours in RENAMED.items() if kobold in body}
    params.update({name: body[name] for name in SAME_NAME if name in body})
    _kobold_off_values(params)
    params["truncate_prompt_tokens"] = _prompt_budget(body, max_model_len)
    _repetition_range(body, params)
    _dynatemp(body, params)
    _seed(body, params)
    _stops(body, params)
    _eos_and_specials(body, params)
    _grammar(body, params)
    try:
        check_sampler_order(body.get("sampler_order"), params)
    except ValueError as error:
        raise KoboldFieldError("sampler_order", str(error)) from None
    return KoboldRequest(prompt=_string(body, "prompt", required=True), params=params, genkey=_genkey(body))


def kobold_name(ours: str) -> str:
    """The Kobold field a sampling parameter of ours came from (for error messages)."""
    named = {ours_name: kobold for kobold, ours_name in RENAMED.items()}
    extra = {"truncate_prompt_tokens": "max_context_length", "seed": "sampler_seed", "guided_grammar": "grammar",
             "dynatemp_min": "dynatemp_range", "dynatemp_max": "dynatemp_range",
             "min_tokens": "use_default_badwordsids", "skip_special_tokens": "render_special"}
    return {**named, **extra}.get(ours, ours)


def _check_neutral(body: dict[str, Any]) -> None:
    for name, kind in NO_EFFECT.items():
        if name in body and not isinstance(body[name], kind):
            raise KoboldFieldError(name, f"{name} must be true or false, got {body[name]!r}")
    for name, neutral in NEUTRAL.items():
        if name in body and not any(body[name] == value and type(body[name]) is type(value) for value in neutral):
            why = _WHY_NOT.get(name, "this server does not implement it")
            raise KoboldFieldError(name, f"{name} must be {neutral[0]!r} (or absent): {why}; got {body[name]!r}")


def _kobold_off_values(params: dict[str, Any]) -> None:
    """Kobold switches top_k off with 0 and, as Aphrodite reads it, top_p and typical with 0 too."""
    if params.get("top_k") == 0 and type(params["top_k"]) is int:
        params["top_k"] = -1
    for name in ("top_p", "typical_p"):
        if params.get(name) == 0 and not isinstance(params[name], bool):
            params[name] = 1.0


def _prompt_budget(body: dict[str, Any], max_model_len: int | None) -> int:
    """Prompt tokens kept (the last ones): the context the client allows, less what it asks to generate."""
    max_length = _int(body, "max_length", required=True, minimum=1)
    context = _int(body, "max_context_length", required=True, minimum=1)
    if max_model_len is not None:
        context = min(context, max_model_len)  # as Kobold servers do: the client cannot have more than the model
    if max_length >= context:
        raise KoboldFieldError("max_length", f"max_length ({max_length}) must be less than max_context_length "
                                             f"({context}, at most the model's {max_model_len}) to leave room "
                                             "for a prompt")
    return context - max_length


def _repetition_range(body: dict[str, Any], params: dict[str, Any]) -> None:
    """rep_pen_range and rep_pen_slope, as KoboldCpp reads them (docs/sampling.md stage 2): rep_pen covers
    the last rep_pen_range tokens (0: the whole context), and tokens seen only in the older half of that
    window get 1 + (rep_pen - 1) * slope; a slope outside (0, 1] means 1 (flat), as KoboldCpp clamps it."""
    window = _int(body, "rep_pen_range", minimum=0)
    slope = body.get("rep_pen_slope")
    if slope is not None and (not isinstance(slope, int | float) or isinstance(slope, bool)):
        raise KoboldFieldError("rep_pen_slope", f"rep_pen_slope must be a number, got {slope!r}")
    if window:
        params["repetition_penalty_range"] = window
        if slope is not None and 0 < slope <= 1:
            params["repetition_penalty_slope"] = float(slope)


def _dynatemp(body: dict[str, Any], params: dict[str, Any]) -> None:
    """Kobold's dynamic temperature spans temperature ± dynatemp_range (its lower end at least 0)."""
    if "dynatemp_range" not in body:
        return
    spread = _number(body, "dynatemp_range", minimum=0)
    if spread > 0:
        center = _number(params, "temperature", minimum=0) if "temperature" in params else 1.0
        params["dynatemp_min"], params["dynatemp_max"] = max(0.0, center - spread), center + spread


def _seed(body: dict[str, Any], params: dict[str, Any]) -> None:
    seed = _int(body, "sampler_seed")
    if seed is not None and seed != -1:  # -1: a fresh seed, as in KoboldCpp
        params["seed"] = seed
    if body.get("sampler_full_determinism") is True and "seed" not in params:
        raise KoboldFieldError("sampler_full_determinism", "sampler_full_determinism needs a sampler_seed here "
                                                           "(a seeded request is fully deterministic)")
    if "sampler_full_determinism" in body and not isinstance(body["sampler_full_determinism"], bool):
        raise KoboldFieldError("sampler_full_determinism", "sampler_full_determinism must be true or false")


def _stops(body: dict[str, Any], params: dict[str, Any]) -> None:
    """trim_stop (KoboldCpp: the stop sequence left out of the text) is include_stop_str_in_output negated;
    singleline ends the text at its first newline."""
    trim = body.get("trim_stop")
    if trim is not None:
        if not isinstance(trim, bool):
            raise KoboldFieldError("trim_stop", f"trim_stop must be true or false, got {trim!r}")
        given = params.get("include_stop_str_in_output")
        if given is not None and given is trim:
            raise KoboldFieldError("trim_stop", "trim_stop and include_stop_str_in_output contradict each other")
        params["include_stop_str_in_output"] = not trim
    singleline = body.get("singleline")
    if singleline is not None and not isinstance(singleline, bool):
        raise KoboldFieldError("singleline", f"singleline must be true or false, got {singleline!r}")
    if singleline:
        stops = params.get("stop", [])
        params["stop"] = [*([stops] if isinstance(stops, str) else stops), "\n"]


def _eos_and_specials(body: dict[str, Any], params: dict[str, Any]) -> None:
    """use_default_badwordsids bans EOS (KoboldCpp's meaning): our min_tokens bans it until max_length
    tokens exist, that is for the whole answer. render_special keeps special tokens in the text."""
    ban_eos = body.get("use_default_badwordsids")
    if ban_eos is not None and not isinstance(ban_eos, bool):
        raise KoboldFieldError("use_default_badwordsids", f"use_default_badwordsids must be true or false, got "
                                                          f"{ban_eos!r}")
    if ban_eos:
        params["min_tokens"] = body["max_length"]
    render = body.get("render_special")
    if render is not None:
        if not isinstance(render, bool):
            raise KoboldFieldError("render_special", f"render_special must be true or false, got {render!r}")
        params["skip_special_tokens"] = not render


def _grammar(body: dict[str, Any], params: dict[str, Any]) -> None:
    grammar = _string(body, "grammar")
    if grammar:  # "" asks for none (SillyTavern sends it when the box is empty)
        params["guided_grammar"] = grammar


def _genkey(body: dict[str, Any]) -> str | None:
    genkey = _string(body, "genkey")
    if genkey is not None and not _GENKEY.match(genkey):
        raise KoboldFieldError("genkey", "genkey must be 1-128 characters of [A-Za-z0-9._:-]")
    return genkey


def _string(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and required:
        raise KoboldFieldError(name, f"{name} is required")
    if value is not None and not isinstance(value, str):
        raise KoboldFieldError(name, f"{name} must be a string, got {type(value).__name__}")
    return value


def _int(body: dict[str, Any], name: str, *, required: bool = False, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise KoboldFieldError(name, f"{name} is required")
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise KoboldFieldError(name, f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise KoboldFieldError(name, f"{name} must be >= {minimum}, got {value}")
    return value


def _number(body: dict[str, Any], name: str, *, minimum: float) -> float:
    value = body[name]
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= minimum:
        raise KoboldFieldError(name, f"{name} must be a number >= {minimum:g}, got {value!r}")
    return float(value)
