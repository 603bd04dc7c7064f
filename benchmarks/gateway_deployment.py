"""Workers and gateways as processes on one Redis, under a fresh key prefix, for benchmarks/gateway_check.py."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

_COUNTER = re.compile(r"^(aqueduct_requests_finished_total|aqueduct_request_errors_total)\{[^}]*\} ([0-9.e+]+)$",
                      re.MULTILINE)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    url: str  # the gateway's base URL, or the worker's health endpoint
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill_hard(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)


@dataclass
class Deployment:
    redis_url: str
    model: str
    prefix: str = field(default_factory=lambda: f"bench-gateway:{uuid.uuid4().hex[:12]}")
    workers: list[Process] = field(default_factory=list)
    gateways: list[Process] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="aq-gateway-check-")))

    def start_worker(self, *flags: str) -> Process:
        port = free_port()
        name = f"w{len(self.workers)}"
        process = self._spawn(name, ["worker", "--redis-url", self.redis_url, "--prefix", self.prefix, "--name", name,
                                     "--health-port", str(port), "--health-host", "127.0.0.1",
                                     "--model", self.model, *flags], f"http://127.0.0.1:{port}", "/readyz")
        self.workers.append(process)
        return process

    def start_gateway(self, *flags: str) -> Process:
        port = free_port()
        process = self._spawn(f"g{len(self.gateways)}", ["serve", "--redis-url", self.redis_url, "--prefix",
                                                         self.prefix, "--host", "127.0.0.1", "--port", str(port),
                                                         "--model", self.model, *flags], f"http://127.0.0.1:{port}",
                              "/health")
        self.gateways.append(process)
        return process

    def _spawn(self, name: str, argv: list[str], url: str, probe: str) -> Process:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen([sys.executable, "-m", "actors.cli.main", *argv], stdout=log,
                                     stderr=subprocess.STDOUT, env=os.environ.copy())
        process = Process(name, popen, url, log_path)
        deadline = time.monotonic() + 180
        while not _answers(url + probe):
            if not process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        return process

    def worker_counts(self) -> tuple[float, float]:
        """(requests finished, request errors) summed over the live workers, from their /metrics."""
        finished = errors = 0.0
        for worker in self.workers:
            text = httpx.get(worker.url + "/metrics", timeout=10).text
            for name, value in _COUNTER.findall(text):
                if name == "aqueduct_requests_finished_total":
                    finished += float(value)
                else:
                    errors += float(value)
        return finished, errors

    def close(self) -> None:
        for process in [*self.gateways, *self.workers]:
            if process.alive():
                process.popen.terminate()
        for process in [*self.gateways, *self.workers]:
            try:
                process.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.popen.kill()
        client = redis.Redis.from_url(self.redis_url)
        keys = list(client.scan_iter(match=f"{self.prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
