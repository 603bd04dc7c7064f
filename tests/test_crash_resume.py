"""Fault injection: kill -9 a worker mid-generation; another worker resumes its requests from the
reply streams, and every client sees each token once, with the tokens of an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import redis

from pipeline.config import LoRAConfig
from pipeline.sampling_params import SamplingParams
from tests.conftest import REDIS_URL
from tests.engine_helpers import make_engine, run_requests
from tests.hf_models import make_tiny_hf_model
from tests.lora_adapters import make_adapters, run_with_adapters

AQUEDUCT = Path(sys.executable).with_name("aqueduct")
ENGINE_FLAGS = {"max_num_seqs": 4, "num_kv_blocks": 256}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=17)


def _requests(count: int) -> dict[str, dict]:
    rng = random.Random(2)
    requests = {}
    for i in range(count):
        kind = ("greedy", "seeded", "unseeded")[i % 3]
        params = {"max_tokens": 150, "ignore_eos": True, "temperature": 0.0 if kind == "greedy" else 0.9}
        if kind == "seeded":
            params["seed"] = 1000 + i
        requests[f"{kind}-{i}"] = {"id": f"{kind}-{i}", "params": params,
                                   "prompt_token_ids": [rng.randrange(3, 512) for _ in range(rng.randint(4, 40))]}
    return requests


def _start_worker(model_dir: Path, prefix: str, name: str, log_dir: Path,
                  extra_flags: tuple[str, ...] = ()) -> subprocess.Popen:
    command = [str(AQUEDUCT), "worker", "--redis-url", REDIS_URL, "--prefix", prefix, "--name", name,
               "--model", str(model_dir), "--claim-idle-ms", "1500", "--max-num-seqs", "4",
               "--num-kv-blocks", "256", "--drain-timeout", "60", *extra_flags]
    log = (log_dir / f"{name}.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _entries(client: redis.Redis, prefix: str, request_id: str) -> list[dict]:
    return [msgpack.unpackb(fields[b"data"]) for _, fields in client.xrange(f"{prefix}:out:{request_id}")]


def _is_final(entry: dict) -> bool:
    return entry.get("usage") is not None or entry.get("error") is not None


def _kill_the_victim_mid_generation(model_dir: Path, prefix: str, tmp_path: Path, client: redis.Redis,
                                    requests: dict[str, dict], kill_after_entries: int,
                                    extra_flags: tuple[str, ...] = ()) -> dict[str, int]:
    """Two workers take `requests`; once `kill_after_entries` reply entries exist and the victim
    holds some, it is killed with SIGKILL and a replacement starts. Returns every exit code.

    The survivor admits at most 2 requests at a time, so the victim takes the rest up to twice its
    batch: some wait in its queue, unstarted, until the kill. (Left to chance, the survivor could
    take nearly all, and the victim finish its few before the check saw them.)"""
    workers = {"victim": _start_worker(model_dir, prefix, "victim", tmp_path, extra_flags),
               "survivor": _start_worker(model_dir, prefix, "survivor", tmp_path,
                                         (*extra_flags, "--max-in-flight", "2"))}
    try:
        _wait(lambda: all(client.exists(f"{prefix}:worker:{n}") for n in workers), 60, "workers to start")
        for request in requests.values():
            client.xadd(f"{prefix}:requests", {"data": msgpack.packb(request)})

        def victim_is_mid_generation() -> bool:
            """Enough entries out, and the victim owns a request less than half done: one it cannot
            finish in the moment before the kill (an entry it merely had not acked yet could be)."""
            emitted = {r: client.xlen(f"{prefix}:out:{r}") for r in requests}
            if sum(emitted.values()) < kill_after_entries:
                return False
            return any(client.get(f"{prefix}:owner:{r}") == b"victim"
                       and emitted[r] < requests[r]["params"]["max_tokens"] // 2 for r in requests)

        _wait(victim_is_mid_generation, 60, "the victim to be generating")
        workers["victim"].send_signal(signal.SIGKILL)
        workers["victim"].wait(timeout=10)
        workers["replacement"] = _start_worker(model_dir, prefix, "replacement", tmp_path, extra_flags)
        _wait(lambda: client.exists(f"{prefix}:worker:replacement"), 60, "the replacement to start")
        _wait(lambda: all(any(_is_final(e) for e in _entries(client, prefix, r)) for r in requests), 120,
              "every request to finish")
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        exit_codes = {name: process.wait(timeout=30) for name, process in workers.items()}
    return exit_codes


@pytest.mark.parametrize("kill_after_entries", [3, 60])  # early in the run, and well into it
def test_kill_9_mid_generation_loses_and_duplicates_nothing(model_dir, prefix, tmp_path, kill_after_entries):
    requests = _requests(12)
    uninterrupted = {request_id: (r["prompt_token_ids"], SamplingParams.from_dict(r["params"]))
                     for request_id, r in requests.items()}
    reference = run_requests(make_engine(model_dir, **ENGINE_FLAGS), uninterrupted)
    client = redis.Redis.from_url(REDIS_URL)
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, kill_after_entries)
    assert exit_codes["victim"] == -signal.SIGKILL
    assert exit_codes["survivor"] == 0 and exit_codes["replacement"] == 0, (tmp_path / "survivor.log").read_text()
    resumed = 0
    for request_id in requests:
        entries = _entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id  # no gap, no duplicate
        assert sum(_is_final(e) for e in entries) == 1 and _is_final(entries[-1])
        tokens = [t for e in entries for choice in e["choices"] for t in choice["token_ids"]]
        assert tokens == reference[request_id]["choices"][0]["token_ids"], request_id
        assert entries[-1]["usage"]["completion_tokens"] == 150
        resumed += 1
    assert resumed == len(requests)
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs
    assert client.xpending(f"{prefix}:requests", "workers")["pending"] == 0


def _mirostat_requests(count: int) -> dict[str, dict]:
    rng = random.Random(3)
    return {f"mirostat-{i}": {"id": f"mirostat-{i}", "prompt_token_ids": [rng.randrange(3, 512) for _ in range(12)],
                              "params": {"max_tokens": 100, "ignore_eos": True, "n": 1 + i % 2, "seed": 70 + i,
                                         "mirostat_mode": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.3}}
            for i in range(count)}


def test_kill_9_resumed_mirostat_choices_continue_from_their_mu(model_dir, prefix, tmp_path):
    """mu rides in the reply entries: the replacement continues each choice from the mu after the
    tokens its client has, so the tokens are those of an uninterrupted run (a restarted mu, 2 tau,
    would mask other tokens)."""
    requests = _mirostat_requests(8)
    uninterrupted = {request_id: (r["prompt_token_ids"], SamplingParams.from_dict(r["params"]))
                     for request_id, r in requests.items()}
    reference = run_requests(make_engine(model_dir, **ENGINE_FLAGS), uninterrupted)
    client = redis.Redis.from_url(REDIS_URL)
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, 40)
    assert exit_codes["victim"] == -signal.SIGKILL
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs
    for request_id, request in requests.items():
        entries = _entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id
        for index in range(request["params"]["n"]):
            ours = [c for e in entries for c in e["choices"] if c["index"] == index]
            expected = reference[request_id]["choices"][index]
            assert [t for c in ours for t in c["token_ids"]] == expected["token_ids"], (request_id, index)
            assert ours[-1]["mirostat_mu"] == pytest.approx(expected["mirostat_mu"][-1], abs=1e-5)


def test_kill_9_resumed_lora_requests_keep_their_adapter(model_dir, prefix, tmp_path):
    adapters = make_adapters(model_dir, tmp_path / "adapters", ["attn8", "all16rs"])
    flags = ("--max-loras", "2", "--lora-modules", *[f"{name}={path}" for name, path in adapters.items()])
    requests = _requests(9)
    for index, request in enumerate(requests.values()):
        request["params"]["max_tokens"] = 60
        if index % 3:
            request["lora"] = ("attn8", "all16rs")[index % 2]
    engine = make_engine(model_dir, **ENGINE_FLAGS, lora=LoRAConfig(
        modules=tuple((name, str(path)) for name, path in adapters.items()), max_loras=2))
    reference = run_with_adapters(engine, {
        request_id: (r["prompt_token_ids"], SamplingParams.from_dict(r["params"]), r.get("lora"))
        for request_id, r in requests.items()})
    client = redis.Redis.from_url(REDIS_URL)
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, 12, flags)
    assert exit_codes["victim"] == -signal.SIGKILL
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs
    for request_id in requests:
        entries = _entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id
        tokens = [t for e in entries for choice in e["choices"] for t in choice["token_ids"]]
        assert tokens == reference[request_id]["tokens"], request_id


def test_sigterm_drains_in_flight_requests_and_leaves_the_rest_for_another_worker(model_dir, prefix, tmp_path):
    requests = _requests(12)
    client = redis.Redis.from_url(REDIS_URL)
    first = _start_worker(model_dir, prefix, "first", tmp_path)
    second = None
    try:
        _wait(lambda: client.exists(f"{prefix}:worker:first"), 60, "the worker to start")
        for request in requests.values():
            client.xadd(f"{prefix}:requests", {"data": msgpack.packb(request)})
        _wait(lambda: sum(client.xlen(f"{prefix}:out:{r}") for r in requests) >= 5, 60, "generation to start")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=90) == 0  # the drain may take up to its 60 s on a loaded box
        finished = [r for r in requests if any(_is_final(e) for e in _entries(client, prefix, r))]
        started = [r for r in requests if _entries(client, prefix, r)]
        assert set(started) == set(finished), "a request was cut off mid-generation by the drain"
        assert len(finished) < len(requests), "nothing was left for the second worker: the test proves nothing"
        second = _start_worker(model_dir, prefix, "second", tmp_path)
        _wait(lambda: all(any(_is_final(e) for e in _entries(client, prefix, r)) for r in requests), 120,
              "every request to finish")
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
    for request_id in requests:
        entries = _entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries)))
        assert sum(len(c["token_ids"]) for e in entries for c in e["choices"]) == 150
