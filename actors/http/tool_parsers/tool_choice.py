"""`tools` and `tool_choice` checked, and `required` / a named function turned into a structured-output
constraint, so the model's answer always parses as the call(s) asked for.

- `required`: a JSON list of at least one {"name": <one of the tools>, "parameters": <its schema>}
  (at most one with `parallel_tool_calls: false`); each item becomes a call (constrained.py). Each tool's schema sits
  inside the list's, so its `$ref`s are rebased onto where it sits (pipeline/request/schema_refs.py).
- `{"type": "function", "function": {"name": F}}`: the answer is F's arguments object itself, returned
  as the call's `arguments` as generated (as vLLM does), even when max_tokens cuts it short.
- `auto` needs a tool-call parser (`--enable-auto-tool-choice --tool-call-parser NAME`), which reads
  the calls out of the model's own format; `none` leaves the text as content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.request.schema_refs import json_pointer, rebase_refs
from pipeline.request.tools import MAX_TOOLS, check_tools

__all__ = ["MAX_TOOLS", "ToolChoice", "check_tool_choice", "check_tools", "constraint_for"]


@dataclass(slots=True, frozen=True)
class ToolChoice:
    mode: str  # none, auto, required, named
    function: str | None = None  # the named function

def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not tools:
            raise ValueError(f"tool_choice {tool_choice!r} needs tools")
        return ToolChoice(tool_choice)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and set(tool_choice) == {
            "type", "function"} and isinstance(tool_choice["function"], dict) \
            and set(tool_choice["function"]) == {"name"} and isinstance(tool_choice["function"]["name"], str):
        name = tool_choice["function"]["name"]
        if name not in _names(tools or []):
            raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
        return ToolChoice("named", name)
    raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name"}}')


def constraint_for(choice: ToolChoice, tools: list[dict[str, Any]], parallel_tool_calls: bool) -> dict | None:
    """The JSON schema (a `guided_json` value) that makes the answer the call(s); None for none/auto."""
    if choice.mode == "named":
        return _parameters(_function(tools, choice.function))
    if choice.mode != "required":
        return None
    items = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"const": tool["function"]["name"]},
                             "parameters": rebase_refs(_parameters(tool["function"]), json_pointer(
                                 "items", "anyOf", index, "properties", "parameters"))}}
             for index, tool in enumerate(tools)]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def _function(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    return next(tool["function"] for tool in tools if tool["function"]["name"] == name)


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    return function.get("parameters") or {"type": "object", "properties": {}}
