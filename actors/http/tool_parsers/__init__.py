"""Tool-call parsers: a model's text -> OpenAI `tool_calls`, one file per model family's format.

Not wired into the gateway yet: `tools` and `tool_choice` are still refused (issue 29). These are the
pieces the wiring will use: the parsers for `--tool-call-parser` (hermes, llama3_json, mistral) and
`tool_choice.py`, which turns `required` or a named function into a structured-output constraint.

Each parser takes the whole generated text and returns `ParsedToolCalls`: the content left for the
message (text outside the calls) and the calls, each a function name and its arguments as a JSON
string. Text that only looks like a call (malformed JSON, an unknown shape) stays content.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.http.tool_parsers.base import ParsedToolCalls, ToolCall
from actors.http.tool_parsers.hermes import parse_hermes
from actors.http.tool_parsers.llama3_json import parse_llama3_json
from actors.http.tool_parsers.mistral import parse_mistral

PARSERS: dict[str, Callable[[str], ParsedToolCalls]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
}

__all__ = ["PARSERS", "ParsedToolCalls", "ToolCall"]
