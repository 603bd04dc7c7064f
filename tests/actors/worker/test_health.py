"""The worker's health/metrics HTTP endpoint and its Prometheus metrics."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs

from actors.worker.health import HealthServer
from actors.worker.metrics import METRICS_CONTENT_TYPE, WorkerMetrics


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def parse_reply(data: bytes) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split(" ")[1]), headers, body)


async def raw_exchange(port: int, payload: bytes, *, half_close: bool = False) -> bytes:
    """Sends `payload` as is and returns everything the server sends before it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    if half_close:
        writer.write_eof()
    data = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    return data


async def get(port: int, path: str, method: str = "GET") -> Reply:
    return parse_reply(await raw_exchange(port, f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()))


def always_ready() -> Callable[[], Awaitable[bool]]:
    async def ready() -> bool:
        return True

    return ready


def serve(scenario: Callable[[HealthServer], Awaitable[None]], **server_kwargs) -> None:
    """Runs `scenario` against a server on a free port, with `always_ready` and fresh metrics unless given."""
    server_kwargs.setdefault("metrics", WorkerMetrics())
    server_kwargs.setdefault("ready", always_ready())

    async def run() -> None:
        async with HealthServer("127.0.0.1", 0, **server_kwargs) as server:
            await scenario(server)

    asyncio.run(run())


def test_port_zero_binds_a_free_port_exposed_as_port():
    async def scenario(server: HealthServer) -> None:
        assert server.port > 0
        assert (await get(server.port, "/healthz")).status == 200

    serve(scenario)


def test_healthz_answers_ok():
    async def scenario(server: HealthServer) -> None:
        reply = await get(server.port, "/healthz")
        assert (reply.status, reply.body) == (200, b"ok\n")
        assert reply.headers["connection"] == "close"
        assert reply.headers["content-length"] == str(len(reply.body))

    serve(scenario)


def test_query_string_is_ignored_for_routing():
    async def scenario(server: HealthServer) -> None:
        assert (await get(server.port, "/healthz?verbose=1")).status == 200

    serve(scenario)


def test_readyz_follows_the_ready_callback():
    is_ready = False

    async def ready() -> bool:
        return is_ready

    async def scenario(server: HealthServer) -> None:
        nonlocal is_ready
        assert (await get(server.port, "/readyz")).status == 503
        is_ready = True
        reply = await get(server.port, "/readyz")
        assert (reply.status, reply.body) == (200, b"ready\n")
        is_ready = False
        assert (await get(server.port, "/readyz")).status == 503

    serve(scenario, ready=ready)


def test_readyz_is_503_and_logged_when_ready_raises():
    async def ready() -> bool:
        raise RuntimeError("model not loaded")

    async def scenario(server: HealthServer) -> None:
        with capture_logs() as logs:
            assert (await get(server.port, "/readyz")).status == 503
        assert any(entry["event"] == "readiness check failed" for entry in logs)
        assert (await get(server.port, "/healthz")).status == 200

    serve(scenario, ready=ready)


def test_readyz_is_503_when_ready_hangs_past_its_timeout():
    async def ready() -> bool:
        await asyncio.sleep(10)
        return True

    async def scenario(server: HealthServer) -> None:
        assert (await asyncio.wait_for(get(server.port, "/readyz"), timeout=2)).status == 503

    serve(scenario, ready=ready, ready_timeout_s=0.1)


def test_metrics_shows_names_and_values_after_recording():
    metrics = WorkerMetrics()
    metrics.observe_step(0.02, num_tokens=7)
    metrics.observe_step(0.03, num_tokens=5)
    metrics.set_queue_state(waiting=3, running=2, kv_used=10, kv_total=64)
    metrics.observe_first_token(0.5)
    metrics.observe_output_token_interval(0.01)
    metrics.record_finish("stop")
    metrics.record_finish("stop")
    metrics.record_error("invalid_request")
    metrics.record_dead_letter()

    async def scenario(server: HealthServer) -> None:
        reply = await get(server.port, "/metrics")
        assert reply.status == 200
        assert reply.headers["content-type"] == METRICS_CONTENT_TYPE
        text = reply.body.decode()
        for expected in (
            "aqueduct_generated_tokens_total 12.0",
            "aqueduct_requests_waiting 3.0",
            "aqueduct_requests_running 2.0",
            "aqueduct_kv_blocks_used 10.0",
            "aqueduct_kv_blocks_total 64.0",
            "aqueduct_step_seconds_count 2.0",
            'aqueduct_step_seconds_bucket{le="0.025"} 1.0',
            "aqueduct_time_to_first_token_seconds_count 1.0",
            "aqueduct_time_per_output_token_seconds_count 1.0",
            'aqueduct_requests_finished_total{finish_reason="stop"} 2.0',
            'aqueduct_requests_finished_total{finish_reason="length"} 0.0',
            'aqueduct_request_errors_total{code="invalid_request"} 1.0',
            "aqueduct_requests_dead_lettered_total 1.0",
        ):
            assert expected in text, expected

    serve(scenario, metrics=metrics)


def test_metrics_of_two_workers_do_not_collide():
    first, second = WorkerMetrics(), WorkerMetrics()
    first.record_dead_letter()
    assert b"aqueduct_requests_dead_lettered_total 1.0" in first.render()
    assert b"aqueduct_requests_dead_lettered_total 0.0" in second.render()


def test_observe_step_rejects_negative_token_count():
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        WorkerMetrics().observe_step(0.1, num_tokens=-1)


def test_unknown_path_is_404_and_non_get_is_405():
    async def scenario(server: HealthServer) -> None:
        assert (await get(server.port, "/nope")).status == 404
        reply = await get(server.port, "/metrics", method="POST")
        assert reply.status == 405
        assert reply.headers["allow"] == "GET"

    serve(scenario)


def test_urllib_client_can_read_all_endpoints():
    def fetch(url: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    async def scenario(server: HealthServer) -> None:
        base = f"http://127.0.0.1:{server.port}"
        assert await asyncio.to_thread(fetch, base + "/healthz") == (200, b"ok\n")
        assert await asyncio.to_thread(fetch, base + "/readyz") == (200, b"ready\n")
        status, body = await asyncio.to_thread(fetch, base + "/metrics")
        assert status == 200 and b"aqueduct_kv_blocks_total" in body
        assert (await asyncio.to_thread(fetch, base + "/missing"))[0] == 404

    serve(scenario)


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (b"garbage\r\n\r\n", 400),
        (b"GET /healthz\r\n\r\n", 400),
        (b"GET healthz HTTP/1.1\r\n\r\n", 400),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400),
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: 1234567890\r\n" * 2000 + b"\r\n", 400),
    ],
)
def test_malformed_requests_get_an_error_and_the_server_keeps_serving(payload: bytes, status: int):
    async def scenario(server: HealthServer) -> None:
        assert parse_reply(await raw_exchange(server.port, payload)).status == status
        assert (await get(server.port, "/healthz")).status == 200

    serve(scenario)


def test_client_that_connects_and_closes_at_once_gets_nothing_and_harms_nothing():
    async def scenario(server: HealthServer) -> None:
        assert await raw_exchange(server.port, b"", half_close=True) == b""
        assert (await get(server.port, "/healthz")).status == 200

    serve(scenario)


def test_half_closed_client_still_gets_its_reply():
    async def scenario(server: HealthServer) -> None:
        data = await raw_exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n", half_close=True)
        assert parse_reply(data).status == 200

    serve(scenario)


def test_client_closing_inside_the_head_gets_400():
    async def scenario(server: HealthServer) -> None:
        data = await raw_exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: te", half_close=True)
        assert parse_reply(data).status == 400

    serve(scenario)


def test_silent_client_times_out_with_408_without_blocking_others():
    async def scenario(server: HealthServer) -> None:
        silent = asyncio.create_task(raw_exchange(server.port, b"GET /healthz HTTP/1.1\r\n"))
        await asyncio.sleep(0.05)
        assert (await get(server.port, "/healthz")).status == 200
        assert parse_reply(await silent).status == 408

    serve(scenario, io_timeout_s=0.3)


def test_stop_closes_idle_connections_and_refuses_new_ones():
    async def scenario() -> None:
        server = HealthServer("127.0.0.1", 0, WorkerMetrics(), always_ready())
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await asyncio.sleep(0.05)
        await asyncio.wait_for(server.stop(), timeout=2)
        assert await asyncio.wait_for(reader.read(), timeout=2) == b""
        writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", server.port)
        await server.stop()

    asyncio.run(scenario())
