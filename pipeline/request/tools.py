"""OpenAI's `tools` and a message's `tool_calls`, checked wherever they come in (the gateway's edge and
the wire), so the chat template only ever renders well-formed, bounded data.

- `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}},
  at most MAX_TOOLS of them, MAX_TOOLS_CHARS of JSON in all, plain values only (untrusted.py).
- a tool call's `arguments`: the text of a JSON object (as OpenAI sends it); chat templates iterate
  the arguments, so `arguments_object` gives them the object, as transformers' templates expect.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.request.untrusted import check_untrusted

MAX_TOOLS = 128
MAX_TOOLS_CHARS = 262_144  # the tools' JSON together; each is rendered into every prompt
MAX_TOOL_CALLS = 128  # calls in one assistant message
MAX_NAME_CHARS = 256  # a function's name, a tool call's id
MAX_ARGUMENTS_CHARS = 262_144
_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def check_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]]:
    """`tools` as given, or ValueError naming the item and the rule."""
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"{where} must be a non-empty list of {{type: function, function: {{...}}}} objects")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"{where} may hold at most {MAX_TOOLS} functions, got {len(tools)}")
    check_untrusted(tools, where)
    size = len(json.dumps(tools, ensure_ascii=False))
    if size > MAX_TOOLS_CHARS:
        raise ValueError(f"{where} may be at most {MAX_TOOLS_CHARS} characters of JSON, got {size}")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        name = _check_tool(tool, f"{where}[{index}]")
        if name in names:
            raise ValueError(f"{where}[{index}].function.name {name!r} is given twice")
        names.add(name)
    return tools


def _check_tool(tool: Any, where: str) -> str:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ValueError(f"{where} must be {{type: function, function: {{name, parameters}}}}")
    if set(tool) - {"type", "function"}:
        raise ValueError(f"{where} has unknown field(s) {', '.join(sorted(set(tool) - {'type', 'function'}))}")
    function = tool["function"]
    unknown = sorted(set(function) - set(_FUNCTION_FIELDS))
    if unknown:
        raise ValueError(f"{where}.function has unknown field(s) {', '.join(unknown)} "
                         f"(known: {', '.join(_FUNCTION_FIELDS)})")
    name = function.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"{where}.function.name must be a string of 1 to {MAX_NAME_CHARS} characters")
    if not isinstance(function.get("description", ""), str):
        raise ValueError(f"{where}.function.description must be a string")
    if not isinstance(function.get("parameters", {}), dict):
        raise ValueError(f"{where}.function.parameters must be a JSON schema object")
    if not isinstance(function.get("strict", False), bool | None):
        raise ValueError(f"{where}.function.strict must be true or false")
    return name


def arguments_object(arguments: str, where: str) -> dict[str, Any]:
    """A tool call's `arguments` text -> the object it holds; ValueError naming `where` otherwise."""
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        raise ValueError(f"{where} may be at most {MAX_ARGUMENTS_CHARS} characters, got {len(arguments)}")
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        raise ValueError(f"{where} must be the text of a JSON object, got {arguments[:40]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be the text of a JSON object, got a {type(value).__name__}")
    check_untrusted(value, where)
    return value
