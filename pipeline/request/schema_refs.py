"""A JSON schema placed inside a larger one keeps its meaning: its local `$ref`s are rebased onto where
it now sits.

A tool's `parameters` (Pydantic writes `{"$ref": "#/$defs/Unit"}` for any nested model) becomes one
branch of `tool_choice: "required"`'s schema, where "#/$defs/Unit" would point at the outer schema's
root. Every ref that starts at the root ("#" or "#/...") gets the branch's JSON pointer in front:
placed at "/items/anyOf/0/properties/parameters", "#/$defs/Unit" becomes
"#/items/anyOf/0/properties/parameters/$defs/Unit" and "#" (recursion into itself) that pointer.
Anchors ("#name") and remote refs name no position and stay as they are; values under `const`,
`enum`, `default` and `examples` are data, not schema, and are left alone.
"""

from __future__ import annotations

from typing import Any

_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def json_pointer(*keys: str | int) -> str:
    """"/a/b" for keys a, b, each escaped per RFC 6901 ("~" -> "~0", "/" -> "~1")."""
    return "".join("/" + str(key).replace("~", "~0").replace("/", "~1") for key in keys)


def rebase_refs(schema: Any, pointer: str) -> Any:
    """A copy of `schema` whose root-relative refs point below `pointer` (a JSON pointer, "" = root)."""
    if isinstance(schema, list):
        return [rebase_refs(item, pointer) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            rebased[key] = "#" + pointer + value[1:]
        elif key in _DATA_KEYWORDS:
            rebased[key] = value
        else:
            rebased[key] = rebase_refs(value, pointer)
    return rebased
