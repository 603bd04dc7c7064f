"""compose.yaml as a specification: its structure, and each of our services' commands run locally.

Docker is not available where these tests run, so a service built from this repo is run as a
plain process: the image's entrypoint is `aqueduct` (see the Dockerfile), so `command` is
aqueduct's argv. Redis is the local test server, with a unique key prefix per test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
AQUEDUCT = Path(sys.executable).parent / "aqueduct"
READY_TIMEOUT_S = 90.0  # the first start in a session generates the default model


def load_compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


COMPOSE = load_compose()
SERVICES: dict[str, dict] = COMPOSE["services"]
OUR_SERVICES = sorted(name for name, service in SERVICES.items() if "build" in service)


def argv_of(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def flag_value(argv: list[str], flag: str) -> str:
    for index, arg in enumerate(argv):
        if arg == flag:
            return argv[index + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with the value of an existing `flag` replaced (`--flag v` or `--flag=v`)."""
    flag_value(argv, flag)
    out = list(argv)
    for index, arg in enumerate(out):
        if arg == flag:
            out[index + 1] = value
        elif arg.startswith(f"{flag}="):
            out[index] = f"{flag}={value}"
    return out


def duration_s(text: str | int) -> float:
    """Compose durations: '45s', '1m30s', '500ms', or a bare number of seconds."""
    if isinstance(text, int | float):
        return float(text)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_healthcheck(name: str, health_port: int) -> subprocess.CompletedProcess[str]:
    """The service's compose healthcheck, run here: our python, our health port."""
    service = SERVICES[name]
    compose_port = flag_value(argv_of(service["command"]), "--health-port")
    kind, program, *args = service["healthcheck"]["test"]
    assert (kind, program) == ("CMD", "python")
    args = [arg.replace(f"127.0.0.1:{compose_port}/", f"127.0.0.1:{health_port}/") for arg in args]
    timeout_s = duration_s(service["healthcheck"]["timeout"])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout_s + 5)


# --- structure -------------------------------------------------------------------------------


def test_redis_persists_with_aof_fsynced_every_second_on_a_volume() -> None:
    redis_service = SERVICES["redis"]
    assert redis_service["image"].startswith("redis:7")
    argv = argv_of(redis_service["command"])
    assert flag_value(argv, "--appendonly") == "yes"
    assert flag_value(argv, "--appendfsync") == "everysec"
    volume = next(v for v in redis_service["volumes"] if v.split(":")[1] == "/data")
    assert volume.split(":")[0] in COMPOSE["volumes"]


def test_redis_reports_health_with_redis_cli_ping() -> None:
    assert SERVICES["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_the_worker_is_built_here_and_runs_the_worker_command_against_the_redis_service() -> None:
    worker = SERVICES["worker"]
    assert worker["build"] == "."
    argv = argv_of(worker["command"])
    assert argv[0] == "worker"
    assert flag_value(argv, "--redis-url") == "redis://redis:6379"
    assert flag_value(argv, "--prefix") == "aqueduct"
    assert flag_value(argv, "--health-port") == "8081"
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_our_services_scale_no_fixed_container_name_host_port_or_consumer_name(name: str) -> None:
    service = SERVICES[name]
    assert "container_name" not in service
    assert "hostname" not in service
    # "8081" alone (an ephemeral host port) would scale; "8081:8081" would not.
    for port in service.get("ports", []):
        assert ":" not in str(port), f"{name} binds host port {port}; --scale would collide"
    # One consumer name shared by replicas would make them steal each other's pending entries.
    assert "--name" not in argv_of(service["command"])
    assert "AQUEDUCT_WORKER_NAME" not in (service.get("environment") or {})


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_our_services_get_longer_to_stop_than_their_drain_timeout(name: str) -> None:
    service = SERVICES[name]
    drain_s = float(flag_value(argv_of(service["command"]), "--drain-timeout"))
    assert duration_s(service["stop_grace_period"]) > drain_s


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_our_healthchecks_probe_healthz_on_the_health_port_with_python(name: str) -> None:
    service = SERVICES[name]
    port = flag_value(argv_of(service["command"]), "--health-port")
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]  # the slim image has no curl
    assert f"http://127.0.0.1:{port}/healthz" in test[3]


def test_the_gpu_variant_is_opt_in_reserves_an_nvidia_gpu_and_runs_on_cuda() -> None:
    gpu = SERVICES["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    assert flag_value(argv_of(gpu["command"]), "--device") == "cuda"
    assert gpu["build"]["args"]["TORCH_SPEC"].startswith("torch")
    assert gpu["image"] != SERVICES["worker"]["image"]  # a CUDA image must not overwrite the CPU tag


def test_the_image_entrypoint_is_aqueduct_so_a_command_is_aqueducts_argv() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["aqueduct"\]$', dockerfile, re.MULTILINE)
    assert re.search(r"^USER (?!root\b)\S+$", dockerfile, re.MULTILINE)
    assert re.search(r"^ENV .*AQUEDUCT_CACHE_DIR=/cache", dockerfile, re.MULTILINE | re.DOTALL)
    assert [v.split(":")[1] for v in SERVICES["worker"]["volumes"]] == ["/cache"]


def test_the_worker_healthcheck_fails_when_nothing_answers() -> None:
    result = run_healthcheck("worker", free_port())
    assert result.returncode != 0


# --- our services, run locally -----------------------------------------------------------------


@dataclass
class LocalService:
    name: str
    process: subprocess.Popen
    health_port: int
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def get(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}", timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode} before ready:\n{self.log_tail()}")
            if self.get("/readyz") == 200:
                return
            time.sleep(0.25)
        pytest.fail(f"{self.name}: /readyz not 200 within {timeout_s:.0f}s:\n{self.log_tail()}")


@pytest.fixture(scope="session")
def aqueduct_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compose-aqueduct-cache")


@pytest.fixture
def local_redis_url(redis_url: str) -> str:
    return redis_url


def skip_unless_runnable_here(name: str) -> None:
    if "--device" in argv_of(SERVICES[name]["command"]):
        device = flag_value(argv_of(SERVICES[name]["command"]), "--device")
        if device.startswith("cuda") and not torch.cuda.is_available():
            pytest.skip(f"{name} runs with --device {device} and this machine has no CUDA device")


def on_cuda(name: str) -> bool:
    argv = argv_of(SERVICES[name]["command"])
    return "--device" in argv and flag_value(argv, "--device").startswith("cuda")


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.gpu) if on_cuda(name) else name for name in OUR_SERVICES])
def local_service(request: pytest.FixtureRequest, local_redis_url: str, aqueduct_cache_dir: Path,
                  tmp_path: Path) -> Iterator[LocalService]:
    """One of our services, started from its compose command as a local process."""
    name = request.param
    skip_unless_runnable_here(name)
    service = SERVICES[name]
    argv = argv_of(service["command"])
    compose_url = flag_value(argv, "--redis-url")
    local = urlsplit(local_redis_url)
    assert urlsplit(compose_url).netloc == "redis:6379"
    argv = with_flag(argv, "--redis-url", compose_url.replace("redis:6379", local.netloc, 1))
    prefix = f"test-aqueduct:{uuid.uuid4().hex}"
    argv = with_flag(argv, "--prefix", prefix)
    health_port = free_port()
    argv = with_flag(argv, "--health-port", str(health_port))
    # The image serves its default model (SmolLM2); these tests check mechanics, on the tiny built-in one.
    assert "--model" not in argv
    argv = [*argv, "--model", "builtin"]
    env = {**os.environ, **{k: str(v) for k, v in (service.get("environment") or {}).items()},
           "AQUEDUCT_CACHE_DIR": str(aqueduct_cache_dir)}
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(AQUEDUCT), *argv], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield LocalService(name, process, health_port, log_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        client = redis.Redis.from_url(local_redis_url)
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def test_our_service_becomes_ready_and_exits_0_on_sigterm_within_its_grace_period(
        local_service: LocalService) -> None:
    local_service.wait_ready(READY_TIMEOUT_S)
    assert local_service.get("/healthz") == 200
    local_service.process.send_signal(signal.SIGTERM)
    grace_s = duration_s(SERVICES[local_service.name]["stop_grace_period"])
    try:
        returncode = local_service.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {grace_s:.0f}s after SIGTERM (Docker would SIGKILL):\n{local_service.log_tail()}")
    assert returncode == 0, local_service.log_tail()


def test_our_service_passes_its_compose_healthcheck(local_service: LocalService) -> None:
    local_service.wait_ready(READY_TIMEOUT_S)
    result = run_healthcheck(local_service.name, local_service.health_port)
    assert result.returncode == 0, result.stderr
