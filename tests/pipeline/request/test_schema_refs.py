"""A schema embedded in a larger one keeps its references: they are rebased onto its new position."""

from __future__ import annotations

from pipeline.request.schema_refs import json_pointer, rebase_refs

PARAMETERS = {  # what Pydantic writes for a model with a nested model and a self-reference
    "type": "object",
    "properties": {"options": {"$ref": "#/$defs/Options"}, "children": {"type": "array", "items": {"$ref": "#"}},
                   "kind": {"const": {"$ref": "#/not-a-ref"}}, "anchor": {"$ref": "#Named"},
                   "remote": {"$ref": "https://example.com/s.json#/x"}},
    "$defs": {"Options": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
                                                            "next": {"$ref": "#/$defs/Options"}}}},
}


def test_root_relative_refs_get_the_embedding_pointer_in_front():
    at = json_pointer("items", "anyOf", 0, "properties", "parameters")
    rebased = rebase_refs(PARAMETERS, at)
    assert rebased["properties"]["options"]["$ref"] == "#/items/anyOf/0/properties/parameters/$defs/Options"
    assert rebased["properties"]["children"]["items"]["$ref"] == "#/items/anyOf/0/properties/parameters"
    assert rebased["$defs"]["Options"]["properties"]["next"]["$ref"] == \
        "#/items/anyOf/0/properties/parameters/$defs/Options"


def test_data_anchors_and_remote_refs_stay_as_they_are():
    rebased = rebase_refs(PARAMETERS, "/x")
    assert rebased["properties"]["kind"] == {"const": {"$ref": "#/not-a-ref"}}
    assert rebased["properties"]["anchor"]["$ref"] == "#Named"
    assert rebased["properties"]["remote"]["$ref"] == "https://example.com/s.json#/x"
    assert PARAMETERS["properties"]["options"]["$ref"] == "#/$defs/Options"  # the input is not changed


def test_pointer_keys_are_escaped():
    assert json_pointer("a/b", "c~d", 3) == "/a~1b/c~0d/3"
