"""The reasoning formats `--reasoning-parser` names, and the format one request's answer is split by.

- `deepseek_r1`: reasoning from the answer's start (a leading `<think>` is skipped: DeepSeek-R1's
  template may open it in the prompt) to the first `</think>`, content after it; no `</think>`: all
  reasoning (the answer was cut short while thinking).
- `qwen3`: as `deepseek_r1` (Qwen3's first templates have the model write `<think>`, later ones open it
  in the prompt; vLLM reads both), but with `enable_thinking: false` among the template's variables the
  answer is all content.
- `think`, for a generic `<think>` template: reasoning only when the answer opens with `<think>` (after
  whitespace), up to `</think>`; any other answer is all content.
- `gpt_oss`: OpenAI's harmony messages (harmony.py): `analysis` is reasoning, `final` (and a
  `commentary` preamble) content, a call to a function stays in the content for `--tool-call-parser
  openai`; an answer that is not harmony is all content. Its markers are special tokens, which the
  detokenizer drops by default (`skip_special_tokens`), so its requests ask for them (`decode_params`).

A structured-output constraint (or tool_choice `required` / a named function) covers the whole output:
the grammar cannot wait for the reasoning to end. Such an answer has reasoning only where it opens with
the start marker (a grammar that writes the reasoning too); a JSON answer is all content.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Opening = Literal["prompt", "marker", "never"]
Syntax = Literal["think", "harmony"]


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    # Where reasoning may begin. "prompt": the template may have opened it, so the answer is reasoning
    # from its start (a leading start marker skipped) up to the end marker; "marker": only an answer that
    # opens with the start marker has reasoning; "never": none (thinking switched off).
    opening: Opening = "prompt"
    start: str = "<think>"
    end: str = "</think>"
    off_switch: str | None = None  # a template kwarg whose value `false` switches thinking off
    # "think": a start and an end marker (the fields above); "harmony": gpt-oss's channels (harmony.py),
    # which reads `opening` "never" as all content and any other as "marker"
    syntax: Syntax = "think"


FORMATS: dict[str, ReasoningFormat] = {
    "deepseek_r1": ReasoningFormat("deepseek_r1"),
    "qwen3": ReasoningFormat("qwen3", off_switch="enable_thinking"),
    "think": ReasoningFormat("think", opening="marker"),
    "gpt_oss": ReasoningFormat("gpt_oss", opening="marker", syntax="harmony"),  # start, end: unused
}


def decode_params(name: str | None) -> dict[str, Any]:
    """Sampling params a request under the server's parser needs so the parser sees its markers:
    harmony's are special tokens, which the default `skip_special_tokens` would drop from the text
    (vLLM reads gpt-oss answers from their token ids instead; the gateway has only the text)."""
    if name is not None and FORMATS[name].syntax == "harmony":
        return {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    return {}


def format_for_request(name: str | None, template_kwargs: Mapping[str, Any] | None,
                       constrained: bool) -> ReasoningFormat | None:
    """How a request's answers split (None: the server has no reasoning parser). `template_kwargs`:
    what the chat template renders with; `constrained`: the request has a structured-output constraint."""
    if name is None:
        return None
    fmt = FORMATS[name]
    if fmt.off_switch is not None and (template_kwargs or {}).get(fmt.off_switch) is False:
        return dataclasses.replace(fmt, opening="never")  # as Jinja's `is false`: only the boolean
    if constrained and fmt.opening == "prompt":
        return dataclasses.replace(fmt, opening="marker")
    return fmt
