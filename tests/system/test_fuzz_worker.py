"""Property-based fuzzing of a live worker (hypothesis over msgpack maps and raw bytes): every
entry is answered with an error reply or dead-lettered, and the worker stays up and serving."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.worker.run import WorkerOptions, run_worker
from queue_adapters.codec import peek_ids
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.hf_models import make_tiny_hf_model

pytestmark = pytest.mark.redis

# reply_to is left out: errors for such entries would go to arbitrary keys (its rules are codec tests).
KEYS = ["prompt", "prompt_token_ids", "messages", "params", "lora", "deadline_ms", "extra"]
PARAM_KEYS = ["max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "logprobs", "min_tokens", "typo"]
# Besides the plain kinds: what a hostile producer can put in msgpack (extension types, timestamps,
# lone surrogates as CESU-8 bytes); and whole entries nested past any limit.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=20), st.binary(max_size=20), st.sampled_from(["\ud800", "a\udfff"]),
                    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
                    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1)))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                                           inner, max_size=4),
                      max_leaves=8)


def _deeply_nested_entry(depth: int) -> bytes:
    """{id, prompt, params: {x: [[[...nil...]]]}}, packed by hand: msgpack's packer stops at depth 512."""
    head = _pack({"id": f"fz{uuid.uuid4().hex[:16]}", "prompt": "hi"})
    return bytes([head[0] + 1]) + head[1:] + _pack("params") + b"\x81" + _pack("x") + b"\x91" * depth + b"\xc0"


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True, unicode_errors="surrogatepass")


request_maps = st.builds(  # request-shaped: a readable id, wrong keys, types and values
    lambda fields, params, token_ids: {"id": f"fz{uuid.uuid4().hex[:16]}", **fields, "params": params,
                                       "prompt_token_ids": token_ids},
    st.dictionaries(st.sampled_from(KEYS), values, max_size=3),
    st.dictionaries(st.sampled_from(PARAM_KEYS), values, max_size=3),
    st.lists(st.integers(-5, 10**6), max_size=3))
entries = st.one_of(
    st.binary(max_size=64),  # raw bytes, mostly not msgpack
    st.builds(_pack, values),  # any msgpack value
    st.builds(_pack, request_maps),
    st.builds(_deeply_nested_entry, st.integers(100, 100_000)),
)


class LiveWorker:
    """One worker on its own event loop thread for the whole module (hypothesis calls the test body
    many times; starting a worker per example would be slow)."""

    def __init__(self, model_dir) -> None:
        self.prefix = f"test-fuzz-{uuid.uuid4().hex[:10]}"
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.loop = asyncio.new_event_loop()
        self.stop: asyncio.Event | None = None
        self.exit_code: int | None = None
        engine = make_engine(model_dir, max_num_seqs=4)
        self.thread = threading.Thread(target=self._serve, args=(engine,), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.redis.exists(f"{self.prefix}:worker:fuzz"):
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)

    def _serve(self, engine) -> None:
        async def serve() -> int:
            self.stop = asyncio.Event()
            return await run_worker(engine, WorkerOptions(REDIS_URL, self.prefix, name="fuzz"), self.stop)

        self.exit_code = self.loop.run_until_complete(serve())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)
        keys = list(self.redis.scan_iter(f"{self.prefix}:*"))
        if keys:
            self.redis.delete(*keys)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    live = LiveWorker(make_tiny_hf_model("llama", tmp_path_factory.mktemp("fuzz-llama"), seed=8))
    yield live
    live.close()
    assert live.exit_code == 0


def _readable_id(raw: bytes) -> str | None:
    """The id as the worker reads it (only the top-level map: an entry too deep or with invalid text
    elsewhere still has one), else the first `id` key of whatever msgpack decodes."""
    request_id, _ = peek_ids(raw)
    if request_id is not None:
        return request_id
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return None
    return value.get("id") if isinstance(value, dict) and isinstance(value.get("id"), str) else None


def _settled(worker: LiveWorker, dead_before: int, reply_key: str | None) -> bool:
    """A final reply (an error, or a completion when the fuzz happened to be valid) or a dead letter."""
    answered = reply_key is not None and any(
        (entry := msgpack.unpackb(fields[b"data"])).get("error") or entry.get("usage")
        for _, fields in worker.redis.xrange(reply_key))
    return answered or worker.redis.xlen(f"{worker.prefix}:dead") > dead_before


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=entries)
def test_every_fuzzed_entry_is_answered_or_dead_lettered(worker, raw):
    request_id = _readable_id(raw)
    reply_key = f"{worker.prefix}:out:{request_id}" if request_id is not None else None
    dead_before = worker.redis.xlen(f"{worker.prefix}:dead")
    worker.redis.xadd(f"{worker.prefix}:requests", {"data": raw})
    deadline = time.monotonic() + 10
    while not _settled(worker, dead_before, reply_key):
        assert worker.thread.is_alive(), "the worker died"
        assert time.monotonic() < deadline, f"entry neither answered nor dead-lettered: {raw!r}"
        time.sleep(0.002)


def test_the_worker_still_serves_after_the_fuzzing(worker):
    worker.redis.xadd(f"{worker.prefix}:requests", {"data": msgpack.packb(
        {"id": "after-fuzz", "prompt_token_ids": [3, 4, 5], "params": {"max_tokens": 3, "ignore_eos": True}})})
    deadline = time.monotonic() + 30
    while True:
        entries = [msgpack.unpackb(f[b"data"]) for _, f in worker.redis.xrange(f"{worker.prefix}:out:after-fuzz")]
        if entries and entries[-1].get("usage"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sum(len(c["token_ids"]) for e in entries for c in e["choices"]) == 3
    # The ack follows the final reply entry's write: give it a moment.
    ack_deadline = time.monotonic() + 10
    while worker.redis.xpending(f"{worker.prefix}:requests", "workers")["pending"] and time.monotonic() < ack_deadline:
        time.sleep(0.01)
    assert worker.redis.xpending(f"{worker.prefix}:requests", "workers")["pending"] == 0


def test_loadtest_with_hostile_entries_answers_every_one_and_loses_nothing(worker, capsys):
    from actors.cli.main import build_parser

    args = build_parser().parse_args([
        "loadtest", "--redis-url", REDIS_URL, "--prefix", worker.prefix, "--rate", "20", "--duration", "2",
        "--prompt-len", "4", "16", "--output-len", "2", "8", "--vocab-size", "500", "--hostile-fraction", "0.5",
        "--wait", "60"])
    assert args.handler(args) == 0
    report = capsys.readouterr().out
    assert "lost 0" in report and "unanswered 0" in report, report
    hostile = int(report.split("hostile ")[1].split(":")[0])
    assert hostile >= 10  # about half of 41 entries: every kind at least once
    assert "workers alive: 1 at the start, 1 at the end" in report
    assert worker.thread.is_alive()
