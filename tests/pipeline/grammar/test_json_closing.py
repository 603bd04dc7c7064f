"""closing_suffix: every prefix of a JSON document, closed, is a JSON document."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pipeline.grammar.json_closing import closing_suffix

SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=8)
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12)


@given(DOCUMENTS, st.sampled_from([None, 1, 2]), st.booleans())
def test_every_cut_of_a_document_closes_into_json(document, indent, ascii_only) -> None:
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only)
    for cut in range(1, len(text)):
        prefix = text[:cut]
        suffix = closing_suffix(prefix)
        if suffix is None:  # complete already (a number may go on: '12' of '123')
            json.loads(prefix)
            continue
        json.loads(prefix + suffix)


def test_examples() -> None:
    assert closing_suffix('{"a": [1, 2') == "]}"
    assert closing_suffix('{"name": "Al') == '"}'
    assert closing_suffix('{"name') == '":null}'
    assert closing_suffix('{"a":') == "null}"
    assert closing_suffix('{"a": 1,') == '"":null}'
    assert closing_suffix("[tr") == "ue]"
    assert closing_suffix('{"n": -') == "0}"
    assert closing_suffix('{"s": "x\\') == 'n"}'
    assert closing_suffix('{"s": "\\u00') == '00"}'
    assert closing_suffix('{"a": 1.5e') == "0}"
    assert closing_suffix("") is None  # nothing written: nothing to close
    assert closing_suffix('{"a": 1}') is None  # complete
    assert closing_suffix('{"a" 1') is None  # not JSON
    assert closing_suffix("]") is None
