"""The two timed phases against one running server, and the figures they give.

- One stream: requests sent one after another; decode tokens/s is the tokens after the first over
  the time from the first token to the last (prefill and TTFT left out), summed over the requests.
- Concurrent: every request of the workload in flight at once (up to `concurrency`); output
  tokens/s is all their tokens over the wall time from the first send to the last token, and
  time to first token is each request's own, from its send.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import structlog

from actors.cli.bench_serve.client import StreamTiming, stream_completion
from actors.cli.bench_serve.workload import ServeRequest, warmup_request

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ServerFigures:
    one_stream_decode_tps: float
    concurrent_output_tps: float
    ttft_p50_s: float
    ttft_p99_s: float
    concurrent_tokens: int
    concurrent_seconds: float


def run_phases(port: int, model: str, requests: list[ServeRequest], one_stream_requests: int,
               concurrency: int) -> ServerFigures:
    stream_completion(port, model, warmup_request())
    one_stream = [stream_completion(port, model, request) for request in requests[:one_stream_requests]]
    log.info("one stream done", port=port, requests=len(one_stream))
    concurrent = run_concurrent(port, model, requests, concurrency)
    _check_lengths(requests[:one_stream_requests], one_stream)
    _check_lengths(requests, concurrent)
    return figures_of(one_stream, concurrent)


def run_concurrent(port: int, model: str, requests: list[ServeRequest], concurrency: int) -> list[StreamTiming]:
    with ThreadPoolExecutor(concurrency, thread_name_prefix="bench-serve") as pool:
        return list(pool.map(lambda request: stream_completion(port, model, request), requests))


def _check_lengths(requests: list[ServeRequest], timings: list[StreamTiming]) -> None:
    """Every server must generate each request's max_tokens (ignore_eos); a shorter answer skews its figures."""
    short = [index for index, (request, timing) in enumerate(zip(requests, timings, strict=True))
             if timing.tokens != request.max_tokens]
    if short:
        log.warning("answers not of max_tokens tokens (ignore_eos not honoured?)", requests=short[:8],
                    count=len(short))


def figures_of(one_stream: list[StreamTiming], concurrent: list[StreamTiming]) -> ServerFigures:
    decode_tokens = sum(timing.tokens - 1 for timing in one_stream)
    decode_seconds = sum(timing.decode_seconds for timing in one_stream)
    tokens = sum(timing.tokens for timing in concurrent)
    wall = max(timing.last_token for timing in concurrent) - min(timing.sent for timing in concurrent)
    ttfts = np.array([timing.ttft for timing in concurrent])
    return ServerFigures(one_stream_decode_tps=decode_tokens / max(decode_seconds, 1e-9),
                         concurrent_output_tps=tokens / wall,
                         ttft_p50_s=float(np.percentile(ttfts, 50)), ttft_p99_s=float(np.percentile(ttfts, 99)),
                         concurrent_tokens=tokens, concurrent_seconds=wall)
