"""A batch through the OpenAI Batch API (/v1/files, /v1/batches) on a Redis deployment, with a worker killed -9
midway: every custom_id must come back exactly once.

    python benchmarks/batch_api.py --lines 1000 --workers 2

Starts `aqueduct worker` processes and one `aqueduct serve` gateway (the built-in tiny model unless --model) on a
fresh Redis prefix (127.0.0.1:6379 by default), uploads a file of chat and completion lines with the official
openai client, creates the batch, and once --kill-at of its lines are answered kills one worker with SIGKILL
(its lines are claimed by the others after --claim-idle-ms). Prints: lines, answered 200, errors, wall time,
lines/s, duplicates, missing. Figures depend on the machine and what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import openai
import redis

REPO = Path(__file__).resolve().parents[1]


def _line(index: int, max_tokens: int) -> dict:
    if index % 2:
        body = {"messages": [{"role": "user", "content": f"Question {index}: what comes next?"}],
                "max_tokens": max_tokens, "temperature": 0.7, "seed": index}
        return {"custom_id": f"req-{index}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    body = {"prompt": f"Item {index} of the list is", "max_tokens": max_tokens, "temperature": 0}
    return {"custom_id": f"req-{index}", "method": "POST", "url": "/v1/completions", "body": body}


def _aqueduct(args: argparse.Namespace, *command: str) -> list[str]:
    return [sys.executable, "-m", "actors.cli", *command, "--model", args.model, "--redis-url", args.redis_url,
            "--log-level", "WARNING"]


def _start(args: argparse.Namespace, prefix: str, port: int) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    threads = str(max(1, (os.cpu_count() or 1) // args.workers))
    workers = [subprocess.Popen([*_aqueduct(args, "worker"), "--prefix", prefix, "--name", f"bench-{index}",
                                 "--cpu-threads", threads, "--claim-idle-ms", str(args.claim_idle_ms)], cwd=REPO)
               for index in range(args.workers)]
    gateway = subprocess.Popen([*_aqueduct(args, "serve"), "--prefix", prefix, "--port", str(port),
                                "--batch-max-in-flight", str(args.in_flight)], cwd=REPO)
    return gateway, workers


def _wait_ready(store: redis.Redis, prefix: str, client: openai.OpenAI, workers: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            client.models.list()
            if len(list(store.scan_iter(f"{prefix}:worker:*"))) >= workers:
                return
        except openai.APIConnectionError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the gateway or the workers did not start")


def _run(args: argparse.Namespace, client: openai.OpenAI, workers: list[subprocess.Popen]) -> dict[str, float]:
    data = "".join(json.dumps(_line(index, args.max_tokens)) + "\n" for index in range(args.lines)).encode()
    started = time.monotonic()
    uploaded = client.files.create(file=("bench.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    killed_at = None
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
        counts = batch.request_counts
        if killed_at is None and counts is not None and counts.completed + counts.failed >= args.kill_at * args.lines:
            workers[0].send_signal(signal.SIGKILL)
            killed_at = counts.completed + counts.failed
            print(f"killed worker bench-0 (SIGKILL) after {killed_at} lines", flush=True)
    wall_s = time.monotonic() - started
    answered = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            answered += [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
    ids = [line["custom_id"] for line in answered]
    expected = {f"req-{index}" for index in range(args.lines)}
    ok = sum(1 for line in answered if line["response"] and line["response"]["status_code"] == 200)
    return {"status": batch.status, "lines": len(answered), "answered 200": ok, "errors": len(answered) - ok,
            "wall s": round(wall_s, 1), "lines/s": round(len(answered) / wall_s, 1),
            "duplicates": len(ids) - len(set(ids)), "missing": len(expected - set(ids)),
            "killed after": killed_at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=64, help="--batch-max-in-flight of the gateway")
    parser.add_argument("--kill-at", type=float, default=0.3, help="the share of lines answered before the kill")
    parser.add_argument("--claim-idle-ms", type=int, default=3000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    prefix = f"bench-batch:{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url(args.redis_url)
    gateway, workers = _start(args, prefix, args.port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none", max_retries=0)
        _wait_ready(store, prefix, client, args.workers)
        figures = _run(args, client, workers)
    finally:
        for process in [gateway, *workers]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [gateway, *workers]:
            process.wait(timeout=60)
        keys = list(store.scan_iter(f"{prefix}:*"))
        if keys:
            store.delete(*keys)
    print(f"batch of {args.lines} lines, {args.workers} workers ({args.model}), one killed -9 midway:")
    for name, value in figures.items():
        print(f"  {name:>13}: {value}")


if __name__ == "__main__":
    main()
