"""A worker's error codes map to HTTP statuses: the client's faults are 4xx, outages 503, our bugs 500."""

import pytest

from actors.http.errors import from_engine_error


@pytest.mark.parametrize(("code", "status"), [("invalid_request", 400), ("lora_unavailable", 404),
                                              ("queue_timeout", 503), ("worker_died", 503), ("poison", 500),
                                              ("request_failed", 500), (None, 500)])
def test_engine_error_codes_map_to_statuses(code: str | None, status: int) -> None:
    error = from_engine_error({"code": code, "message": "m"})
    assert error.status == status
    assert error.body()["error"]["code"] == (code or "error")
