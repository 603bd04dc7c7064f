"""A server process for the length of one measurement: started, waited for, stopped.

Each server runs in a session of its own (vLLM starts an engine process beside its API server),
so stopping it signals the whole group: SIGTERM, then SIGKILL after a grace period, and waits
until its port answers no more. Its output goes to a log file, whose tail is raised with the
error when the server exits or never becomes healthy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from actors.cli.bench_serve.client import get_json
from actors.cli.bench_serve.servers import ServerSpec
from actors.kit.process_tuning import peer_omp_defaults

log = structlog.get_logger(__name__)

_STOP_GRACE_S = 30.0


class ServerFailed(RuntimeError):
    """The server exited, or did not become healthy in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_server(spec: ServerSpec, port: int, log_path: Path, timeout_s: float) -> Iterator[None]:
    """`spec` serving on `port` inside the block (healthy on /health), stopped after it."""
    process = _start(spec, log_path)
    try:
        _wait_healthy(process, port, log_path, timeout_s)
        yield
    finally:
        _stop(process, port)


def _start(spec: ServerSpec, log_path: Path) -> subprocess.Popen:
    log.info("starting server", server=spec.name, command=" ".join(spec.command), log=str(log_path))
    # Peers see OMP_WAIT_POLICY as the user left it, not the PASSIVE this process set for itself.
    context = peer_omp_defaults() if spec.peer else contextlib.nullcontext()
    with context, log_path.open("wb") as output:
        return subprocess.Popen(spec.command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                env={**os.environ, **spec.env}, start_new_session=True)


def _wait_healthy(process: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise ServerFailed(f"exited with status {process.returncode} while starting:\n{log_tail(log_path)}")
        if _healthy(port):
            log.info("server ready", port=port, seconds=round(time.monotonic() - started, 1))
            return
        time.sleep(0.5)
    raise ServerFailed(f"not healthy after {timeout_s:.0f} s:\n{log_tail(log_path)}")


def _healthy(port: int) -> bool:
    try:
        status, _body = get_json(port, "/health", timeout_s=2)
        return status == 200
    except OSError:
        return False


def _stop(process: subprocess.Popen, port: int) -> None:
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("server ignored SIGTERM; killing it", pid=process.pid)
            _signal_group(process, signal.SIGKILL)
            process.wait()
    _signal_group(process, signal.SIGKILL)  # children it left behind (vLLM's engine process)
    _wait_port_free(port)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _wait_port_free(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.2)
    log.warning("port still answers after the server stopped", port=port)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
