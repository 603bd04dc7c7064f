"""The Batch API behind a gateway, with `aqueduct worker` processes on the real Redis: a worker killed with -9
mid-batch, and a gateway restarted mid-batch, leave every custom_id answered exactly once, and no line's reply
stream written twice (each has dense seqs and one final entry)."""

from __future__ import annotations

import signal
import subprocess
from contextlib import AbstractContextManager
from pathlib import Path

import openai
import pytest
import redis

from actors.http.backends import RemoteBackend
from actors.http.options import BatchOptions, GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.batch_helpers import by_custom_id, completion_line, results, submit, wait_until
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.worker_processes import is_final, reply_entries, start_worker, wait_for

pytestmark = pytest.mark.redis
MAX_TOKENS = 120


def _gateway(model_dir: Path, prefix: str, max_in_flight: int) -> AbstractContextManager[str]:
    """A gateway whose graceful stop lets go of its batches (a crashed one's lease would lapse instead)."""
    backend = RemoteBackend(REDIS_URL, prefix, model_dir.name, load_tokenizer(model_dir))
    options = GatewayOptions(api_key=API_KEY, batches=BatchOptions(max_in_flight=max_in_flight))
    return serving(backend, options)


def _lines(count: int) -> list[dict]:
    return [completion_line(f"line-{i}", f"Item {i} is", max_tokens=MAX_TOKENS, ignore_eos=True,
                            temperature=0.0 if i % 2 else 0.9) for i in range(count)]


def _assert_each_line_once(client: openai.OpenAI, batch_id: str, count: int, store: redis.Redis,
                           prefix: str) -> None:
    batch = wait_until(client, batch_id, timeout_s=240)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": count, "completed": count, "failed": 0}
    output, errors = results(client, batch)
    answered = by_custom_id(output)
    assert errors == [] and sorted(answered) == sorted(f"line-{i}" for i in range(count))
    for line in output:
        body = line["response"]["body"]
        assert body["usage"]["completion_tokens"] == MAX_TOKENS, line["custom_id"]
        entries = reply_entries(store, prefix, line["response"]["request_id"])
        assert [entry["seq"] for entry in entries] == list(range(len(entries))), line["custom_id"]
        assert sum(is_final(entry) for entry in entries) == 1 and is_final(entries[-1]), line["custom_id"]


def _stop(workers: dict[str, subprocess.Popen]) -> dict[str, int]:
    for process in workers.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    return {name: process.wait(timeout=60) for name, process in workers.items()}


def test_a_worker_killed_with_9_mid_batch_loses_and_duplicates_no_line(default_model_path: Path, prefix: str,
                                                                      tmp_path: Path) -> None:
    store = redis.Redis.from_url(REDIS_URL)
    workers = {"victim": start_worker(default_model_path, prefix, "victim", tmp_path),
               "survivor": start_worker(default_model_path, prefix, "survivor", tmp_path, ("--max-in-flight", "2"))}
    try:
        wait_for(lambda: all(store.exists(f"{prefix}:worker:{name}") for name in workers), 90, "workers to start")
        with _gateway(default_model_path, prefix, max_in_flight=8) as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            batch = submit(client, _lines(12), endpoint="/v1/completions")

            def victim_is_mid_line() -> bool:
                return any((store.get(f"{prefix}:owner:{batch.id}-{i}") or b"").endswith(b"\nvictim")
                           and store.xlen(f"{prefix}:out:{batch.id}-{i}") < MAX_TOKENS // 2 for i in range(12))

            wait_for(victim_is_mid_line, 90, "the victim to be generating a line")
            workers["victim"].send_signal(signal.SIGKILL)
            workers["victim"].wait(timeout=10)
            workers["replacement"] = start_worker(default_model_path, prefix, "replacement", tmp_path)
            _assert_each_line_once(client, batch.id, 12, store, prefix)
    finally:
        codes = _stop(workers)
    assert codes["victim"] == -signal.SIGKILL and codes["survivor"] == codes["replacement"] == 0
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs


def test_a_gateway_restarted_mid_batch_resumes_it(default_model_path: Path, prefix: str, tmp_path: Path) -> None:
    store = redis.Redis.from_url(REDIS_URL)
    workers = {"worker": start_worker(default_model_path, prefix, "worker", tmp_path)}
    lines = [completion_line(f"line-{i}", f"Item {i} is", max_tokens=MAX_TOKENS, ignore_eos=True) for i in range(8)]
    lines[5]["body"]["max_tokens"] = lines[6]["body"]["max_tokens"] = 1500  # the gateway stops while these run
    try:
        wait_for(lambda: store.exists(f"{prefix}:worker:worker"), 90, "the worker to start")
        with _gateway(default_model_path, prefix, max_in_flight=2) as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            batch = submit(client, lines, endpoint="/v1/completions")
            wait_for(lambda: store.exists(f"{prefix}:out:{batch.id}-5"), 90, "line 5 to start")
        stopped_at = int(store.hget(f"{prefix}:batch:{batch.id}", "completed"))
        assert 0 < stopped_at < 8
        with _gateway(default_model_path, prefix, max_in_flight=2) as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            batch = wait_until(client, batch.id, timeout_s=240)
            output, errors = results(client, batch)
        assert errors == [] and sorted(by_custom_id(output)) == sorted(line["custom_id"] for line in lines)
        for line in output:  # each line generated once, however often it was submitted
            entries = reply_entries(store, prefix, line["response"]["request_id"])
            assert [entry["seq"] for entry in entries] == list(range(len(entries))), line["custom_id"]
            assert sum(is_final(entry) for entry in entries) == 1, line["custom_id"]
        assert [line["response"]["body"]["usage"]["completion_tokens"] for line in output] == [
            line["body"]["max_tokens"] for line in lines]
    finally:
        assert _stop(workers) == {"worker": 0}
