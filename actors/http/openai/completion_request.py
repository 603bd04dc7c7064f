"""OpenAI /v1/completions bodies (plus vLLM's extras) -> prompt and SamplingParams, strictly.

Unknown fields are an error, and so are OpenAI fields we do not implement yet, so a client
never gets silently different behaviour. `prompt` is one prompt (a string or a list of token ids) or
several (a list of strings or of token-id lists): one choice per prompt x n. `echo` is answered by
the gateway (actors/http/openai/prompt_results.py, chunks.py); on the wire it becomes `prompt_logprobs`
when `logprobs` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.request.sampling_params import SamplingParams

# Accepted and not used: one model per worker; the rest are the client's metadata or OpenAI's billing.
_IGNORED = {"model", "user", "metadata", "store", "service_tier"}
_UNSUPPORTED = {"suffix", "stream_options"}
# Values of unsupported fields that ask for nothing (SDKs and frameworks send them for unset fields).
_ABSENT = {"echo": (None, False), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
           "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None, True, False)}
# The most prompts one request may carry (each is a request of its own to the workers); an
# evaluation harness batches a few dozen.
MAX_PROMPTS = 256

Prompt = str | list[int]


@dataclass(slots=True)
class CompletionBody:
    prompts: list[Prompt]  # one or more; the choices are prompt_index * n + j
    params: dict[str, Any]  # the sampling fields as wire params, validated
    echo: bool = False  # prepend each prompt (and, with logprobs, its token logprobs) to its choices


def parse_completion_body(body: Any) -> CompletionBody:
    """The prompts, the sampling fields as wire params and `echo`, every field checked; ValueError
    naming the field."""
    params = sampling_fields(body, "prompt", _UNSUPPORTED)
    echo = _pop_echo(params)
    prompts = parse_prompts(body["prompt"])
    if params.get("max_tokens") == 0 and not echo:
        raise ValueError("max_tokens must be >= 1, got 0 (max_tokens 0 scores the prompt only, and needs "
                         "echo: true)")
    if echo and params.get("logprobs") is not None:
        # The prompt's own logprobs, with as many alternatives as the generated tokens get.
        params["prompt_logprobs"] = max(params["logprobs"], params.get("prompt_logprobs") or 0)
    SamplingParams.from_dict(params)  # validates every remaining field, naming it
    return CompletionBody(prompts, params, echo)


def prompt_field(prompt: Prompt) -> dict[str, Any]:
    """A prompt as its wire request carries it: text, or token ids."""
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}


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


def _pop_echo(params: dict[str, Any]) -> bool:
    echo = params.pop("echo", None)
    if echo is None:
        return False
    if not isinstance(echo, bool):
        raise ValueError(f"echo must be true or false, got {echo!r}")
    return echo


def parse_prompts(prompt: Any) -> list[Prompt]:
    """`prompt` as OpenAI takes it: a string, a list of token ids, a list of strings, or a list of
    token-id lists; each one non-empty, at most MAX_PROMPTS of them."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("prompt must be a string, a list of strings, a non-empty list of token ids or a list "
                         f"of token-id lists, got {_kind(prompt)}")
    if all(_is_token_id(item) for item in prompt):
        return [prompt]
    if len(prompt) > MAX_PROMPTS:
        raise ValueError(f"prompt may hold at most {MAX_PROMPTS} prompts, got {len(prompt)}")
    return [_one_of_several(item, index) for index, item in enumerate(prompt)]


def _one_of_several(item: Any, index: int) -> Prompt:
    if isinstance(item, str):
        return item
    if isinstance(item, list) and item and all(_is_token_id(token) for token in item):
        return item
    if isinstance(item, list) and item:
        bad = next(position for position, token in enumerate(item) if not _is_token_id(token))
        raise ValueError(f"prompt[{index}][{bad}] must be a token id (an integer), got {_kind(item[bad])}")
    raise ValueError(f"prompt[{index}] must be a string or a non-empty list of token ids, got {_kind(item)}")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_JSON_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
               "dict": "an object", "NoneType": "null"}


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list of mixed items"
    return _JSON_KINDS.get(type(value).__name__, type(value).__name__)
