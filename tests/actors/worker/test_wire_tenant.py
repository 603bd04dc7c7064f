"""A wire request's priority, tenant and weight reach the worker's scheduler: intake builds them into the
Request, and the Admit message (which may cross a Redis edge) carries them to the scheduler actor."""

from __future__ import annotations

from pathlib import Path

from actors.kit.message_codec import decode_message, encode_message
from actors.kit.messages import Admit
from actors.worker.intake import build_request
from queue_adapters.codec import WireRequest, decode_request, encode
from tests.support.engine_helpers import make_engine


def test_the_scheduler_gets_the_wire_requests_priority_tenant_and_weight(default_model_path: Path) -> None:
    engine = make_engine(default_model_path)
    wire = WireRequest(id="r-1", prompt="Hello", params={"max_tokens": 2}, priority=-2, tenant="acme/alice",
                       tenant_weight=2.5)
    request = build_request(engine.builder, decode_request(encode(wire)))
    admitted = decode_message(encode_message(Admit.of(request, deadline_ms=None))).to_request()
    assert (admitted.priority, admitted.tenant, admitted.tenant_weight) == (-2, "acme/alice", 2.5)
    plain = build_request(engine.builder, decode_request(encode(WireRequest(id="r-2", prompt="Hi"))))
    assert (plain.tenant, plain.tenant_weight) == (None, 1.0)
