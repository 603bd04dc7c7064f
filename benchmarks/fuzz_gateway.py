"""The HTTP gateway's long fuzz: schemathesis cases (valid and invalid bodies) from the gateway's own OpenAPI
document, against the in-process app over the built-in model (as tests/system/test_fuzz_gateway.py, which runs a
short derandomized slice of this in CI), or against a running server.

    python benchmarks/fuzz_gateway.py [--max-examples 10000] [--seed N]
    python benchmarks/fuzz_gateway.py --url http://127.0.0.1:8000 [--api-key KEY]

Prints figures and asserts nothing: requests generated, the status histogram per operation, server errors
(5xx), hangs (no answer within 10 s), and each distinct failure once, with the smallest body that caused it
and (in-process) the last line of the server's traceback. A third of the bodies carry JSON no library writes
(lone surrogates, numbers beyond 64 bits, deep nesting: tests/support/gateway_fuzz.py edged_bodies); cases are tamed
as in the test (short outputs, fresh request ids), so the time goes into requests, not decoding.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from structlog.testing import capture_logs

from actors.http.openapi import openapi_document
from pipeline.loading.default_model import default_model_dir
from tests.support.gateway_fuzz import AUTH, HANG_S, Edged, OneLifespan, edged_bodies, fuzz_app, fuzz_backend, tame


@dataclass
class Failure:
    label: str  # "POST /tokenize"
    what: str  # "500 internal error: TypeError", "hang", "ConnectionError: ..."
    body: Any
    server_trace: str | None
    edge: str | None = None  # the edged_bodies value the body carried, if any
    count: int = 1

    @property
    def size(self) -> int:
        return len(_shown(self.body))


@dataclass
class Tally:
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: dict[tuple[str, str, str | None], Failure] = field(default_factory=dict)
    requests: int = 0
    server_errors: int = 0
    hangs: int = 0
    slowest_s: float = 0.0
    engine_killer: Any = None  # the request after which /health said down (the run stops there)

    def record(self, label: str, status: str, elapsed_s: float, failure: Failure | None) -> None:
        self.requests += 1
        self.statuses[label, status] += 1
        self.slowest_s = max(self.slowest_s, elapsed_s)
        if failure is None:
            return
        self.server_errors += status.startswith("5")
        self.hangs += failure.what == "hang"
        key = (failure.label, failure.what, failure.server_trace)
        known = self.failures.get(key)
        if known is None:
            self.failures[key] = failure
            return
        failure.count = known.count + 1
        self.failures[key] = failure if failure.size < known.size else known
        self.failures[key].count = failure.count


class Target:
    """Where cases go: the in-process app (server tracebacks come from its logs) or a server's URL."""

    def __init__(self, url: str | None, api_key: str | None, model_cache: Path | None) -> None:
        self.url, self.app = url, None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if url is None:
            model_dir = default_model_dir(model_cache or tempfile.mkdtemp(prefix="fuzz-gateway-"))
            backend = fuzz_backend(model_dir)
            self.app, self.headers = OneLifespan(fuzz_app(backend), backend), AUTH

    def schema(self) -> schemathesis.BaseSchema:
        if self.url is None:
            return schemathesis.openapi.from_dict(openapi_document())
        return schemathesis.openapi.from_url(f"{self.url}/openapi.json", headers=self.headers)

    def call(self, case: schemathesis.Case) -> tuple[int, bytes]:
        if self.app is not None:
            response = case.call(headers=self.headers, timeout=HANG_S, app=self.app)
        else:
            response = case.call(base_url=self.url, headers=self.headers, timeout=HANG_S)
        return response.status_code, response.content

    def send_raw(self, path: str, raw: bytes) -> tuple[int, bytes]:
        with self._http() as (http, base):
            response = http.post(f"{base}{path}", data=raw, timeout=HANG_S,
                                 headers={**self.headers, "Content-Type": "application/json"})
        return response.status_code, response.content

    def alive(self) -> bool:
        with self._http() as (http, base):
            health = http.get(f"{base}/health", timeout=HANG_S)
        return health.status_code == 200 and health.json().get("status") == "ok"

    def good_request_status(self) -> str:
        try:
            with self._http() as (http, base):
                return str(http.post(f"{base}/v1/completions", headers=self.headers, timeout=HANG_S,
                                     json={"prompt": "Water flows", "max_tokens": 4, "temperature": 0}).status_code)
        except requests.exceptions.RequestException as error:
            return f"no answer ({type(error).__name__})"

    @contextmanager
    def _http(self) -> Iterator[tuple[requests.Session, str]]:
        """A session and the base its paths go after: the app in-process, or the server."""
        if self.app is None:
            with requests.Session() as http:
                yield http, self.url or ""
        else:
            from schemathesis.python import asgi

            with asgi.get_client(self.app) as client:
                yield client, ""

    def close(self) -> None:
        if self.app is not None:
            self.app.close()


def one_request(target: Target, drawn: schemathesis.Case | Edged, server_log: list[dict[str, Any]],
                tally: Tally) -> None:
    edge = None
    if isinstance(drawn, Edged):
        edge = drawn.edge
        label, body, send = f"POST {drawn.path}", drawn.raw.decode("utf-8", "replace")[:2000], target.send_raw
        args: tuple[Any, ...] = (drawn.path, drawn.raw)
    else:
        tame(drawn)
        label, body, send, args = f"{drawn.method} {drawn.path}", drawn.body, target.call, (drawn,)
    row = f"{label} (edge: {edge})" if edge else label
    server_log.clear()
    started = time.perf_counter()
    try:
        status_code, content = send(*args)
    except requests.exceptions.RequestException as error:  # no answer: a hang, or the connection broke
        hang = isinstance(error, requests.exceptions.Timeout)
        status, what = ("hang", "hang") if hang else ("exception", _text(error))
        tally.record(row, status, time.perf_counter() - started,
                     Failure(label, what, body, _last_trace(server_log), edge))
        return
    except Exception as error:  # in-process, the app's own exception: Starlette re-raises it after its 500
        tally.record(row, "500", time.perf_counter() - started,
                     Failure(label, f"500 raised {_text(error)}", body, _last_trace(server_log) or _last_frame(error),
                             edge))
        return
    elapsed = time.perf_counter() - started
    failure = None
    if status_code >= 500 or elapsed > HANG_S:
        what = "hang" if elapsed > HANG_S else f"{status_code} {_error_message(content)}"
        failure = Failure(label, what, body, _last_trace(server_log), edge)
    tally.record(row, str(status_code), elapsed, failure)


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:120]}"


def _error_message(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["message"])[:120]
    except (ValueError, KeyError, TypeError):
        return repr(content[:120])


def _last_trace(server_log: list[dict[str, Any]]) -> str | None:
    """The last line of the first traceback the server logged for this request: 'file:line: Type: message'."""
    for entry in server_log:
        error = entry.get("exc_info")
        if isinstance(error, BaseException):
            return _last_frame(error)
        if entry.get("log_level") in ("error", "critical"):
            return f"logged: {entry.get('event')}"
    return None


def _last_frame(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f"{Path(frame.filename).name}:{frame.lineno}: " if frame else ""
    return f"{where}{type(error).__name__}: {str(error)[:160]}"


def _shown(body: Any) -> str:
    try:
        return json.dumps(body, ensure_ascii=True)
    except (TypeError, ValueError):
        return repr(body)


def fuzz(target: Target, max_examples: int, seed: int, tally: Tally) -> None:
    schema = target.schema()
    valid = schema.as_strategy(GenerationMode.POSITIVE)
    cases = st.one_of(valid, schema.as_strategy(GenerationMode.NEGATIVE), edged_bodies(valid))

    @hypothesis.seed(seed)
    @settings(max_examples=max_examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=hypothesis.Verbosity.quiet)
    @given(drawn=cases)
    def run(drawn: schemathesis.Case | Edged) -> None:
        if tally.engine_killer is not None:  # hypothesis replays the failing example: not again
            raise EngineDown()
        one_request(target, drawn, server_log, tally)
        if not target.alive():  # every later request would hang: this one is the finding
            tally.engine_killer = drawn
            raise EngineDown()
        if tally.requests % 1000 == 0:
            print(f"... {tally.requests} requests, {tally.server_errors} server errors, {tally.hangs} hangs",
                  file=sys.stderr, flush=True)

    # capture_logs also keeps the per-request log lines off the terminal.
    with capture_logs() as server_log, contextlib.suppress(EngineDown):
        run()


class EngineDown(Exception):
    """Ends the run: the engine stopped, so every later request would only wait for it."""


def report(tally: Tally, seconds: float, after: tuple[bool, str]) -> None:
    print(f"requests generated: {tally.requests} in {seconds:.0f} s ({tally.requests / max(seconds, 1e-9):.0f}/s), "
          f"slowest answer {tally.slowest_s:.2f} s")
    print(f"server errors (5xx): {tally.server_errors}   hangs (> {HANG_S:g} s): {tally.hangs}   "
          f"transport exceptions: {sum(n for (_, status), n in tally.statuses.items() if status == 'exception')}")
    print("status histogram:")
    for label in sorted({label for label, _ in tally.statuses}):
        row = {status: n for (where, status), n in tally.statuses.items() if where == label}
        print(f"  {label:50s} " + "  ".join(f"{status}: {n}" for status, n in sorted(row.items())))
    print(f"after the run: /health ok = {after[0]}, a good completion -> {after[1]}")
    if tally.engine_killer is not None:
        killer = tally.engine_killer
        shown = repr(killer) if isinstance(killer, Edged) else f"{killer.method} {killer.path} {_shown(killer.body)}"
        print(f"THE ENGINE WENT DOWN after this request (the run stopped there): {shown[:800]}")
    print(f"distinct failures: {len(tally.failures)}")
    for failure in sorted(tally.failures.values(), key=lambda item: (item.label, item.what)):
        edge = f", e.g. with {failure.edge}" if failure.edge else ""
        print(f"- {failure.label}: {failure.what}  (x{failure.count}{edge})")
        print(f"    smallest body: {_shown(failure.body)[:600]}")
        if failure.server_trace:
            print(f"    server: {failure.server_trace}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, printed)")
    parser.add_argument("--url", default=None, help="a running server (default: the app in this process)")
    parser.add_argument("--api-key", default=None, help="the server's --api-key (with --url)")
    parser.add_argument("--model-cache", type=Path, default=None, help="where to build the built-in model")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    target = Target(args.url.rstrip("/") if args.url else None, args.api_key, args.model_cache)
    print(f"fuzzing {'the in-process app' if args.url is None else args.url}: {args.max_examples} examples, "
          f"seed {seed}", flush=True)
    tally, started = Tally(), time.perf_counter()
    try:
        fuzz(target, args.max_examples, seed, tally)
        seconds = time.perf_counter() - started
        after = target.alive(), target.good_request_status()
    finally:
        target.close()
    report(tally, seconds, after)


if __name__ == "__main__":
    main()
