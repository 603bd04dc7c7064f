"""Structured-output requests, in every spelling clients send, reduced to one canonical constraint.

Accepted (at most one per request; two are an error naming both):
- OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`;
- Aphrodite's (and vLLM's older) `guided_json` (a schema, as an object or a JSON string),
  `guided_regex`, `guided_choice` (a list of strings), `guided_grammar` (GBNF or Lark), with
  `guided_whitespace_pattern` for JSON;
- vLLM's `structured_outputs: {json | regex | choice | grammar | json_object, whitespace_pattern,
  disable_any_whitespace}` (the last: compact JSON, no whitespace between tokens).

The canonical form is `(kind, spec, whitespace_pattern)`: kind one of json, regex, choice, grammar;
spec a string (a schema as sorted-key JSON, a choice list as JSON). It is what crosses the wire
between actors and what the grammar compiler caches by. Whether the spec compiles is checked at
intake (pipeline/intake/grammar_compiler.py), with the compiler's message.

Example: `{"guided_choice": ["yes", "no"]}` and `{"structured_outputs": {"choice": ["yes", "no"]}}`
both become `("choice", '["yes", "no"]', "")`.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.request.param_checks import fail

KINDS = ("json", "regex", "choice", "grammar")
ALIASES = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
MAX_SPEC_CHARS = 65_536  # a schema, regex or grammar; compiling is bounded by the compiler's own limits
MAX_CHOICES = 1024
ANY_JSON_OBJECT = json.dumps({"type": "object"})
NO_WHITESPACE = "(?:)"  # a JSON answer with nothing between its tokens (disable_any_whitespace)
_STRUCTURED_OUTPUTS_FIELDS = (*KINDS, "json_object", "whitespace_pattern", "disable_any_whitespace")

StructuredOutput = tuple[str, str, str]


def canonical_structured_output(given: dict[str, Any], whitespace_pattern: Any) -> StructuredOutput | None:
    """`given`: the alias fields and `structured_outputs` as the request set them (None = unset)."""
    constraints = {name: value for name, value in given.items() if value is not None}
    if constraints.get("response_format") is not None and _response_format_kind(constraints["response_format"]) is None:
        del constraints["response_format"]  # {"type": "text"}: no constraint
    if len(constraints) > 1:
        fail(f"give at most one structured-output constraint, got {' and '.join(sorted(constraints))}")
    if not constraints:
        if whitespace_pattern is not None:
            fail("guided_whitespace_pattern needs a JSON constraint (guided_json, response_format or "
                 "structured_outputs.json)")
        return None
    (name, value), = constraints.items()
    if name == "structured_outputs":
        return _from_structured_outputs(value, whitespace_pattern)
    if name == "response_format":
        return _with_whitespace(_from_response_format(value), whitespace_pattern)
    return _with_whitespace(_from_kind(name.removeprefix("guided_"), value, name), whitespace_pattern)


def _from_structured_outputs(value: Any, whitespace_pattern: Any) -> StructuredOutput:
    if isinstance(value, list | tuple) and len(value) == 3 and all(isinstance(part, str) for part in value):
        kind, spec, pattern = value  # the canonical form itself (it crosses actor edges as a list)
        if kind not in KINDS:
            fail(f"structured_outputs kind must be one of {', '.join(KINDS)}, got {kind!r}")
        _check_length("structured_outputs", spec)
        return kind, spec, pattern
    if not isinstance(value, dict):
        fail(f"structured_outputs must be an object, got {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in _STRUCTURED_OUTPUTS_FIELDS)
    if unknown:
        fail(f"structured_outputs has unknown field(s) {', '.join(unknown)} (known: "
             f"{', '.join(_STRUCTURED_OUTPUTS_FIELDS)})")
    kinds = [key for key in (*KINDS, "json_object") if value.get(key) not in (None, False)]
    if len(kinds) != 1:
        fail(f"structured_outputs must set exactly one of json, regex, choice, grammar, json_object, got "
             f"{', '.join(kinds) or 'none'}")
    pattern = _whitespace_of(value, whitespace_pattern)
    if kinds[0] == "json_object":
        if value["json_object"] is not True:
            fail(f"structured_outputs.json_object must be true, got {value['json_object']!r}")
        return _with_whitespace(("json", ANY_JSON_OBJECT, ""), pattern)
    return _with_whitespace(_from_kind(kinds[0], value[kinds[0]], f"structured_outputs.{kinds[0]}"), pattern)


def _whitespace_of(value: dict[str, Any], whitespace_pattern: Any) -> Any:
    """structured_outputs' whitespace_pattern, or none at all with disable_any_whitespace: true."""
    pattern = value.get("whitespace_pattern", whitespace_pattern)
    disable = value.get("disable_any_whitespace")
    if disable not in (None, True, False):
        fail(f"structured_outputs.disable_any_whitespace must be true or false, got {disable!r}")
    if disable and pattern is not None:
        fail("structured_outputs.disable_any_whitespace and a whitespace pattern cannot be combined")
    return NO_WHITESPACE if disable else pattern


def _response_format_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        fail(f"response_format must be an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        fail(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
    unknown = sorted(str(key) for key in value if key not in ("type", "json_schema"))
    if unknown:
        fail(f"response_format has unknown field(s) {', '.join(unknown)}")
    if "json_schema" in value or kind == "json_schema":  # checked whatever the type: the document says so
        _check_schema_holder(value.get("json_schema"))
    return None if kind == "text" else kind


def _from_response_format(value: dict[str, Any]) -> StructuredOutput:
    if value["type"] == "json_object":
        return "json", ANY_JSON_OBJECT, ""
    schema = value["json_schema"].get("schema", {})  # OpenAI: a missing schema means any JSON value
    return _from_kind("json", schema, "response_format.json_schema.schema")


def _check_schema_holder(schema_holder: Any) -> None:
    if not isinstance(schema_holder, dict):
        fail("response_format.json_schema must be an object with a schema (and a name)")
    unknown = sorted(str(key) for key in schema_holder if key not in ("name", "schema", "strict", "description"))
    if unknown:
        fail(f"response_format.json_schema has unknown field(s) {', '.join(unknown)}")
    if not isinstance(schema_holder.get("name", ""), str):  # optional, as llama.cpp's clients send it
        fail("response_format.json_schema.name must be a string")
    if not isinstance(schema_holder.get("strict", False), bool | None):
        fail("response_format.json_schema.strict must be true, false or null")
    if not isinstance(schema_holder.get("description", ""), str):
        fail("response_format.json_schema.description must be a string")
    if not isinstance(schema_holder.get("schema", {}), dict):
        fail("response_format.json_schema.schema must be an object (a JSON schema)")


def _from_kind(kind: str, value: Any, where: str) -> StructuredOutput:
    if kind == "json":
        return "json", _canonical_schema(value, where), ""
    if kind == "choice":
        return "choice", _canonical_choices(value, where), ""
    if not isinstance(value, str) or not value:
        fail(f"{where} must be a non-empty string, got {type(value).__name__}")
    _check_length(where, value)
    return kind, value, ""


def _canonical_schema(value: Any, where: str) -> str:
    if isinstance(value, str):
        _check_length(where, value)
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            fail(f"{where} is not valid JSON: {error}")
    if not isinstance(value, dict):
        fail(f"{where} must be a JSON schema (an object), got {type(value).__name__}")
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    _check_length(where, text)
    return text


def _canonical_choices(value: Any, where: str) -> str:
    if not isinstance(value, list | tuple) or not value or not all(isinstance(item, str) for item in value):
        fail(f"{where} must be a non-empty list of strings")
    if len(value) > MAX_CHOICES:
        fail(f"{where} may hold at most {MAX_CHOICES} choices, got {len(value)}")
    text = json.dumps(list(value), ensure_ascii=False)
    _check_length(where, text)
    return text


def _with_whitespace(constraint: StructuredOutput, pattern: Any) -> StructuredOutput:
    if pattern is None or pattern == "":
        return constraint
    if constraint[0] != "json":
        fail(f"guided_whitespace_pattern applies to JSON constraints only, not {constraint[0]}")
    if not isinstance(pattern, str):
        fail(f"guided_whitespace_pattern must be a string (a regex), got {type(pattern).__name__}")
    _check_length("guided_whitespace_pattern", pattern)
    return constraint[0], constraint[1], pattern


def _check_length(where: str, text: str) -> None:
    if len(text) > MAX_SPEC_CHARS:
        fail(f"{where} may be at most {MAX_SPEC_CHARS} characters, got {len(text)}")
