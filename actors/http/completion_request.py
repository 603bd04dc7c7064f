"""OpenAI /v1/completions bodies (plus vLLM's extras) -> prompt and SamplingParams, strictly.

Unknown fields are an error, and so are OpenAI fields we do not implement yet, so a client
never gets silently different behaviour.
"""

from __future__ import annotations

from typing import Any

from pipeline.request.sampling_params import SamplingParams

# Accepted and not used: one model per worker; the rest are the client's metadata or OpenAI's billing.
_IGNORED = {"model", "user", "metadata", "store", "service_tier"}
_UNSUPPORTED = {"echo", "suffix", "stream_options"}
# Values of unsupported fields that ask for nothing (SDKs and frameworks send them for unset fields).
_ABSENT = {"echo": (None, False), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
           "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None, True, False)}


def parse_completion_body(body: Any) -> tuple[str | list[int], dict[str, Any]]:
    """(prompt, the sampling fields as wire params), every field checked; ValueError naming the field."""
    params = sampling_fields(body, "prompt", _UNSUPPORTED)
    prompt = _parse_prompt(body["prompt"])
    SamplingParams.from_dict(params)  # validates every remaining field, naming it
    return prompt, params


def sampling_fields(body: Any, required: str, unsupported: set[str]) -> dict[str, Any]:
    """The checks every OpenAI body of a batch line gets (an object holding `required`, not
    streamed, none of `unsupported`); returns its other fields, the sampling ones, unvalidated."""
    if not isinstance(body, dict):
        raise ValueError(f"body must be a JSON object, got {type(body).__name__}")
    if required not in body:
        raise ValueError(f"body.{required} is required")
    if body.get("stream"):
        raise ValueError("stream must be false in a batch file")
    named = sorted(key for key in unsupported & body.keys() if not _asks_nothing(key, body[key]))
    if named:
        raise ValueError(f"not supported yet: {', '.join(named)}")
    return {key: value for key, value in body.items()
            if key not in _IGNORED and key not in unsupported and key not in (required, "stream")}


def _asks_nothing(key: str, value: Any) -> bool:
    return any(value is absent or (value == absent and type(value) is type(absent))
               for absent in _ABSENT.get(key, (None,)))


def _parse_prompt(prompt: Any) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ValueError("prompt must be a non-empty string or a non-empty list of token ids "
                     "(one prompt per batch line)")
