"""Tool calling at the gateway: a model's text -> tool calls, streamed as they are generated, one file
per model family's format.

- the scanners for `--tool-call-parser` (hermes, llama3_json, mistral; openai, gpt-oss's harmony calls,
  in harmony.py), used for `tool_choice: auto` when the server runs with `--enable-auto-tool-choice`;
  constrained.py's for `required` and a named function;
- `tool_choice.py`: `tools` and `tool_choice` checked, and `required` or a named function turned into
  a structured-output constraint whose answer is the calls;
- `plan.py`: what a request's answer becomes, as events (events.py, stream.py) that each protocol
  shapes its own way, streamed or whole.

A scanner reads the answer's text as it comes (scanner.py, with json_head.py and arguments.py) and
emits content, a call's opening (its name), its arguments piece by piece, and its end. A call is one
from its head on; only text that may still be a marker or a call's head is held. Text that only looks
like a call (a head that is not one) stays content.

Protocol-neutral: OpenAI's chat, Anthropic's Messages and the Responses API all turn answers into calls
through it.

May import: pipeline.request (the request's tool limits and checks). Nothing of actors/: the protocols
and serve's flags (actors/http/serve_args.py) import it, not the other way round.
"""

from __future__ import annotations

from actors.http.tool_parsers.base import ParsedToolCalls, ToolCall
from actors.http.tool_parsers.harmony import HarmonyScanner
from actors.http.tool_parsers.hermes import HermesScanner
from actors.http.tool_parsers.llama3_json import Llama3JsonScanner
from actors.http.tool_parsers.mistral import MistralScanner
from actors.http.tool_parsers.scanner import Scanner

PARSERS: dict[str, type[Scanner]] = {
    "hermes": HermesScanner,
    "llama3_json": Llama3JsonScanner,
    "mistral": MistralScanner,
    "openai": HarmonyScanner,
}

__all__ = ["PARSERS", "ParsedToolCalls", "ToolCall"]
