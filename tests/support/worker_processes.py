"""Helpers for tests that run `aqueduct worker` subprocesses on one Redis prefix (fault injection):
start one, wait for a condition, read a request's reply stream, and check every request was answered
once with the tokens of an uninterrupted in-process run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import redis

from pipeline.request.sampling_params import SamplingParams
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine, run_requests

AQUEDUCT = Path(sys.executable).with_name("aqueduct")
ENGINE_FLAGS = {"max_num_seqs": 4, "num_kv_blocks": 256}


def make_requests(count: int, max_tokens: int = 150) -> dict[str, dict]:
    """Wire requests by id: greedy, seeded and unseeded ones in turn, random prompts (the same every run)."""
    rng = random.Random(2)
    requests = {}
    for i in range(count):
        kind = ("greedy", "seeded", "unseeded")[i % 3]
        params = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0 if kind == "greedy" else 0.9}
        if kind == "seeded":
            params["seed"] = 1000 + i
        requests[f"{kind}-{i}"] = {"id": f"{kind}-{i}", "params": params,
                                   "prompt_token_ids": [rng.randrange(3, 512) for _ in range(rng.randint(4, 40))]}
    return requests


def start_worker(model_dir: Path, prefix: str, name: str, log_dir: Path, extra_flags: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """`aqueduct worker` logging to `log_dir/<name>.log`; `env` is added to this process's environment."""
    command = [str(AQUEDUCT), "worker", "--redis-url", REDIS_URL, "--prefix", prefix, "--name", name,
               "--model", str(model_dir), "--dtype", "float32", "--quantization", "none",
               "--claim-idle-ms", "1500", "--max-num-seqs", "4",
               "--num-kv-blocks", "256", "--drain-timeout", "60", *extra_flags]
    log = (log_dir / f"{name}.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def reply_entries(client: redis.Redis, prefix: str, request_id: str) -> list[dict]:
    return [msgpack.unpackb(fields[b"data"]) for _, fields in client.xrange(f"{prefix}:out:{request_id}")]


def is_final(entry: dict) -> bool:
    return entry.get("usage") is not None or entry.get("error") is not None


def all_final(client: redis.Redis, prefix: str, requests: dict[str, dict]) -> bool:
    return all(any(is_final(e) for e in reply_entries(client, prefix, r)) for r in requests)


def reference_run(model_dir: Path, requests: dict[str, dict]) -> dict[str, dict]:
    """The requests run to completion in-process, uninterrupted (tests/support/engine_helpers.py's results)."""
    uninterrupted = {request_id: (r["prompt_token_ids"], SamplingParams.from_dict(r["params"]))
                     for request_id, r in requests.items()}
    return run_requests(make_engine(model_dir, **ENGINE_FLAGS), uninterrupted)


def assert_answered_once(client: redis.Redis, prefix: str, requests: dict[str, dict],
                         reference: dict[str, dict]) -> None:
    """Each reply stream: seqs without gap or duplicate, one final entry (the last), the reference's
    tokens and usage; and nothing left pending in the consumer group."""
    for request_id, request in requests.items():
        entries = reply_entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id
        assert sum(is_final(e) for e in entries) == 1 and is_final(entries[-1]), request_id
        tokens = [t for e in entries for choice in e["choices"] for t in choice["token_ids"]]
        assert tokens == reference[request_id]["choices"][0]["token_ids"], request_id
        assert entries[-1]["usage"]["completion_tokens"] == request["params"]["max_tokens"], request_id
    assert client.xpending(f"{prefix}:requests", "workers")["pending"] == 0
