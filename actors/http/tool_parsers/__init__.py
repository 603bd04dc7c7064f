"""Tool calling at the gateway: a model's text -> OpenAI `tool_calls`, one file per model family's format.

- the parsers for `--tool-call-parser` (hermes, llama3_json, mistral; openai, gpt-oss's harmony calls,
  in harmony.py), used for `tool_choice: auto` when the server runs with `--enable-auto-tool-choice`;
- `tool_choice.py`: `tools` and `tool_choice` checked, and `required` or a named function turned into
  a structured-output constraint whose answer parses back into the calls;
- `plan.py`: what a request's answer becomes (non-streamed and streamed alike).

Each parser takes the whole generated text and returns `ParsedToolCalls`: the content left for the
message (text outside the calls) and the calls, each a function name and its arguments as a JSON
string. Text that only looks like a call (malformed JSON, an unknown shape) stays content. Each parser's
`sendable` says, while an answer streams, how much of the text so far is content whatever follows, and
its `settled` which calls too (streamed as soon as they are, by auto_stream.py).

Protocol-neutral: OpenAI's chat and Anthropic's Messages both turn answers into calls through it.

May import: pipeline.request (the request's tool limits and checks). Nothing of actors/: the protocols
and serve's flags (actors/http/serve_args.py) import it, not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.http.tool_parsers.base import ParsedToolCalls, ToolCall
from actors.http.tool_parsers.harmony import parse_openai, sendable_openai, settled_openai
from actors.http.tool_parsers.hermes import parse_hermes, sendable_hermes, settled_hermes
from actors.http.tool_parsers.llama3_json import parse_llama3_json, sendable_llama3_json, settled_llama3_json
from actors.http.tool_parsers.mistral import parse_mistral, sendable_mistral, settled_mistral

PARSERS: dict[str, Callable[[str], ParsedToolCalls]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
    "openai": parse_openai,
}

SENDABLE: dict[str, Callable[[str], int]] = {
    "hermes": sendable_hermes,
    "llama3_json": sendable_llama3_json,
    "mistral": sendable_mistral,
    "openai": sendable_openai,
}

# Streaming: the content and calls of the text so far that no continuation changes (auto_stream.py).
SETTLED: dict[str, Callable[[str], ParsedToolCalls]] = {
    "hermes": settled_hermes,
    "llama3_json": settled_llama3_json,
    "mistral": settled_mistral,
    "openai": settled_openai,
}

__all__ = ["PARSERS", "SENDABLE", "SETTLED", "ParsedToolCalls", "ToolCall"]
