"""Responses `tools` and `tool_choice` -> the wire's tools (chat completions' shape, which chat templates
take) and what becomes of the answer, on chat completions' mechanism (docs/http-api.md#tool-calling):

    {"type": "function", "name", "description"?, "parameters"?, "strict"?}
        -> {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}
    tool_choice "auto" (the default with tools) / "required" / "none" / {"type": "function", "name": F}
        -> the same choice in chat's terms; required and a named function add its constraint

Other tool types (web_search, file_search, mcp, ...) run on OpenAI's servers: a 400 here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import check_tool_choice, constraint_for
from pipeline.request.structured_output import MAX_SPEC_CHARS
from pipeline.request.tools import check_tools
from pipeline.request.untrusted import UntrustedValueError

AUTO_NEEDS_PARSER = ('tool_choice "auto" (the default when tools are given) requires serve --enable-auto-tool-choice '
                     'and --tool-call-parser; ask for "required" or {"type": "function", "name": ...} instead')
_TOOL_FIELDS = ("name", "description", "parameters", "strict")


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    tools: list[dict[str, Any]] | None  # for the chat template
    plan: ToolPlan | None  # None: the answer is text
    constraint: dict[str, Any] | None  # required / a named function: the guided_json that makes it the call(s)


def tool_answer(tools: Any, tool_choice: Any, parallel: Any, tool_parser: str | None) -> ToolAnswer:
    """`tool_parser`: the server's --tool-call-parser (with --enable-auto-tool-choice); ValueError naming the field."""
    wire = _wire_tools(tools)
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"parallel_tool_calls must be true or false, got {parallel!r}")
    choice = check_tool_choice(_chat_tool_choice(tool_choice), wire)
    if choice.mode == "none":
        return ToolAnswer(wire, None, None)
    assert wire is not None
    if choice.mode == "auto":
        if tool_parser is None:
            raise UntrustedValueError(AUTO_NEEDS_PARSER, "tool_choice")
        return ToolAnswer(wire, ToolPlan(choice, tool_parser, parallel is not False), None)
    constraint = constraint_for(choice, wire, parallel is not False)
    size = len(json.dumps(constraint, sort_keys=True))
    if size > MAX_SPEC_CHARS:
        raise UntrustedValueError(f"tools: for tool_choice {choice.mode!r} the parameter schemas become a "
                                  f"constraint of at most {MAX_SPEC_CHARS} characters, got {size}", "tools")
    return ToolAnswer(wire, ToolPlan(choice, None, parallel is not False), constraint)


def _wire_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list of {type: function, name, parameters} objects")
    return check_tools([_wire_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)])


def _wire_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise ValueError(f"{where} must be an object {{type: function, name, parameters}}")
    if tool.get("type") != "function":
        raise ValueError(f"{where}.type {tool.get('type')!r}: this server runs no hosted tools; give functions "
                         "({type: function, name, parameters})")
    unknown = sorted(key for key, value in tool.items() if key not in ("type", *_TOOL_FIELDS) and value is not None)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    function = {key: tool[key] for key in _TOOL_FIELDS if tool.get(key) is not None}
    return {"type": "function", "function": function}  # check_tools names what is wrong inside


def _chat_tool_choice(tool_choice: Any) -> Any:
    """Responses' {"type": "function", "name": F} is chat's {"type": "function", "function": {"name": F}}."""
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and set(tool_choice) == {"type", "name"} and tool_choice["type"] == "function" \
            and isinstance(tool_choice["name"], str):
        return {"type": "function", "function": {"name": tool_choice["name"]}}
    raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}')
