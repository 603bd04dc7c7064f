"""The wire's tenant and tenant_weight: optional, bounded, and refused with the field named."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from queue_adapters.codec import CodecError, WireRequest, decode_request, encode


def _decode(**fields: Any) -> WireRequest:
    return decode_request(msgspec.msgpack.encode({"id": "r-1", "prompt": "hi", **fields}))


def test_tenant_and_weight_round_trip_and_default_to_none_and_one() -> None:
    plain = _decode()
    assert plain.tenant is None and plain.tenant_weight == 1.0
    assert b"tenant" not in encode(plain)  # omitted when unset: old workers read new gateways' requests
    tagged = decode_request(encode(WireRequest(id="r-2", prompt="hi", tenant="acme/alice", tenant_weight=2.5)))
    assert (tagged.tenant, tagged.tenant_weight) == ("acme/alice", 2.5)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"tenant": ""}, "tenant must have length >= 1"),
    ({"tenant": "x" * 129}, "tenant must have length <= 128"),
    ({"tenant": "a\nb"}, "tenant must match"),
    ({"tenant": 7}, "tenant must be a string"),
    ({"tenant_weight": 0}, "tenant_weight must be >= 0.001"),
    ({"tenant_weight": 1e-300}, "tenant_weight must be >= 0.001"),
    ({"tenant_weight": -1.5}, "tenant_weight must be >= 0.001"),
    ({"tenant_weight": float("nan")}, "tenant_weight must be >= 0.001"),
    ({"tenant_weight": float("inf")}, "tenant_weight must be <= 1000"),
    ({"tenant_weight": 1001}, "tenant_weight must be <= 1000"),
    ({"tenant_weight": "2"}, "tenant_weight must be a number"),
])
def test_out_of_bounds_tenant_fields_are_refused_by_name(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(CodecError, match=expected):
        _decode(**fields)
