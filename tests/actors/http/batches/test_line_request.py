"""A batch line becomes the wire request its route would make, plus what a batch adds: the bulk lane, the
batch's tenant, and the batch's deadline."""

from __future__ import annotations

import time

import pytest

from actors.http.batches.line_request import BATCH_PRIORITY, LineParser
from actors.http.batches.records import BatchRecord
from actors.http.errors import ApiError
from actors.http.options import GatewayOptions
from tests.support.gateway_helpers import SilentBackend


def _batch(tenant: str | None = "acme") -> BatchRecord:
    now = int(time.time())
    return BatchRecord(id="batch_" + "a" * 32, owner=tenant or "default", endpoint="/v1/completions",
                       input_file_id="file-" + "b" * 32, completion_window="1h", created_at=now,
                       expires_at=now + 3600, total=1, tenant=tenant, tenant_weight=3.0)


@pytest.mark.parametrize("priority, expected", [(None, BATCH_PRIORITY), (0, BATCH_PRIORITY), (-7, BATCH_PRIORITY),
                                                (3, 3), (50, 50)])
def test_lines_run_in_the_bulk_lane(priority: int | None, expected: int) -> None:
    body = {"prompt": "x", "max_tokens": 2, "priority": priority}
    line = LineParser(SilentBackend(), GatewayOptions()).parse("/v1/completions", body, "batch_x-0", _batch())
    assert [wire.priority for wire in line.request.wires] == [expected]


def test_lines_run_as_the_batch_s_tenant_by_its_deadline() -> None:
    batch = _batch()
    line = LineParser(SilentBackend(), GatewayOptions(request_timeout_s=60)).parse(
        "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2}, "batch_x-4", batch)
    assert [wire.id for wire in line.request.wires] == ["batch_x-4:0", "batch_x-4:1"]
    for wire in line.request.wires:
        assert (wire.tenant, wire.tenant_weight) == ("acme", 3.0)
        assert wire.deadline_ms <= time.time() * 1000 + 60_001  # its own --request-timeout comes first
    untimed = LineParser(SilentBackend(), GatewayOptions()).parse("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}]}, "batch_x-5", _batch(None))
    assert untimed.request.wire.deadline_ms == batch.expires_at * 1000 and untimed.request.wire.tenant is None


def test_a_line_is_refused_as_its_route_refuses_it() -> None:
    parser = LineParser(SilentBackend(), GatewayOptions())
    with pytest.raises(ApiError, match="model"):
        parser.parse("/v1/completions", {"prompt": "x", "model": "another"}, "batch_x-0", _batch())
    with pytest.raises(ApiError, match="stream must be false"):
        parser.parse("/v1/completions", {"prompt": "x", "stream": True}, "batch_x-0", _batch())
