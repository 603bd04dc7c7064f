"""Anthropic's `tools` and `tool_choice` -> the wire's tools (OpenAI's shape, which chat templates take)
and what becomes of the answer, on the same mechanism as chat completions' (docs/http-api.md#tool-calling):

| tool_choice | as OpenAI's | the answer |
|---|---|---|
| `{"type": "auto"}` (the default with tools) | `auto` | the server's --tool-call-parser reads the calls |
| `{"type": "any"}` | `required` | constrained to a JSON list of {name, parameters}: always parses |
| `{"type": "tool", "name": F}` | a named function | constrained to F's input object |
| `{"type": "none"}` | `none` | text (the tools are still in the prompt) |

`disable_parallel_tool_use: true` is OpenAI's `parallel_tool_calls: false`: at most one call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice, constraint_for
from pipeline.request.structured_output import MAX_SPEC_CHARS
from pipeline.request.tools import MAX_NAME_CHARS, check_tools
from pipeline.request.untrusted import UntrustedValueError

AUTO_NEEDS_PARSER = ('tool_choice "auto" (the default when tools are given) requires serve --enable-auto-tool-choice '
                     'and --tool-call-parser; ask for {"type": "any"} or {"type": "tool", "name": ...} instead')
_TOOL_FIELDS = {"name", "description", "input_schema", "type", "cache_control"}
_MODES = {"auto": "auto", "any": "required", "tool": "named"}


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    plan: ToolPlan | None  # None: the answer is text
    constraint: dict[str, Any] | None  # any / tool: the guided_json that makes the answer the call(s)


def wire_tools(tools: Any) -> list[dict[str, Any]] | None:
    """[{name, description?, input_schema}] -> [{type: function, function: {name, description?, parameters}}]."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list of {name, description, input_schema} objects")
    converted = [_wire_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in converted]
    repeated = next((name for index, name in enumerate(names) if name in names[:index]), None)
    if repeated is not None:
        raise ValueError(f"tools: the name {repeated!r} is given twice")
    return check_tools(converted)  # the limits every request's tools have: count, size, plain values


def _wire_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise ValueError(f"{where} must be an object {{name, description, input_schema}}")
    if tool.get("type") not in (None, "custom"):
        raise ValueError(f"{where}.type {tool['type']!r}: this server runs no server tools; give client tools "
                         "({name, description, input_schema})")
    unknown = sorted(set(tool) - _TOOL_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"{where}.name must be a string of 1 to {MAX_NAME_CHARS} characters")
    if not isinstance(schema, dict):
        raise ValueError(f"{where}.input_schema must be a JSON schema object")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}.description must be a string")
    function = {"name": name, "parameters": schema, **({"description": description} if description else {})}
    return {"type": "function", "function": function}


def tool_answer(tool_choice: Any, tools: list[dict[str, Any]] | None, tool_parser: str | None) -> ToolAnswer:
    """What the answer becomes; `tool_parser`: the server's --tool-call-parser (with --enable-auto-tool-choice)."""
    choice, parallel = _tool_choice(tool_choice, tools)
    if choice.mode == "none":
        return ToolAnswer(None, None)
    assert tools is not None
    if choice.mode == "auto":
        if tool_parser is None:
            raise UntrustedValueError(AUTO_NEEDS_PARSER, "tool_choice")
        return ToolAnswer(ToolPlan(choice, tool_parser, parallel), None)
    constraint = constraint_for(choice, tools, parallel)
    assert constraint is not None
    size = len(json.dumps(constraint, sort_keys=True))
    if size > MAX_SPEC_CHARS:
        raise UntrustedValueError(f"tools: for tool_choice {tool_choice['type']!r} the input schemas become a "
                                  f"constraint of at most {MAX_SPEC_CHARS} characters, got {size}", "tools")
    return ToolAnswer(ToolPlan(choice, None, parallel), constraint)


def _tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> tuple[ToolChoice, bool]:
    """(the choice in OpenAI's terms, whether several calls are allowed)."""
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none"), True
    kind = tool_choice.get("type") if isinstance(tool_choice, dict) else None
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if kind not in ("auto", "any", "tool", "none") or set(tool_choice) - allowed:
        raise ValueError('tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}, '
                         'optionally with disable_parallel_tool_use')
    parallel = tool_choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"tool_choice.disable_parallel_tool_use must be true or false, got {parallel!r}")
    if kind == "none":
        return ToolChoice("none"), True
    if not tools:
        raise ValueError(f"tool_choice {kind!r} needs tools")
    name = tool_choice.get("name")
    if kind == "tool" and name not in [tool["function"]["name"] for tool in tools]:
        raise ValueError(f"tool_choice names the tool {name!r}, which is not among the tools")
    return ToolChoice(_MODES[kind], name if kind == "tool" else None), not parallel
