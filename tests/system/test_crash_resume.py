"""Fault injection: kill -9 a worker mid-generation; another worker resumes its requests from the
reply streams, and every client sees each token once, with the tokens of an uninterrupted run."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import msgpack
import pytest
import redis

from pipeline.config import LoRAConfig
from pipeline.request.sampling_params import SamplingParams
from queue_adapters.placement import affinity_key
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import make_adapters, run_with_adapters
from tests.support.worker_processes import (
    ENGINE_FLAGS,
    all_final,
    assert_answered_once,
    is_final,
    make_requests,
    reference_run,
    reply_entries,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=17)


def _kill_the_victim_mid_generation(model_dir: Path, prefix: str, tmp_path: Path, client: redis.Redis,
                                    requests: dict[str, dict], kill_after_entries: int,
                                    extra_flags: tuple[str, ...] = (), stream: str | None = None) -> dict[str, int]:
    """Two workers take `requests`; once `kill_after_entries` reply entries exist and the victim
    holds some, it is killed with SIGKILL and a replacement starts. Returns every exit code.

    The survivor admits at most 2 requests at a time, so the victim takes the rest up to twice its
    batch: some wait in its queue, unstarted, until the kill. (Left to chance, the survivor could
    take nearly all, and the victim finish its few before the check saw them.) `stream`: where the
    requests are queued (default: the shared lane)."""
    workers = {"victim": start_worker(model_dir, prefix, "victim", tmp_path, extra_flags),
               "survivor": start_worker(model_dir, prefix, "survivor", tmp_path,
                                        (*extra_flags, "--max-in-flight", "2"))}
    try:
        wait_for(lambda: all(client.exists(f"{prefix}:worker:{n}") for n in workers), 60, "workers to start")
        for request in requests.values():
            client.xadd(stream or f"{prefix}:requests", {"data": msgpack.packb(request)})

        def victim_is_mid_generation() -> bool:
            """Enough entries out, and the victim owns a request less than half done: one it cannot
            finish in the moment before the kill (an entry it merely had not acked yet could be)."""
            emitted = {r: client.xlen(f"{prefix}:out:{r}") for r in requests}
            if sum(emitted.values()) < kill_after_entries:
                return False
            return any((client.get(f"{prefix}:owner:{r}") or b"").endswith(b"\nvictim")
                       and emitted[r] < requests[r]["params"]["max_tokens"] // 2 for r in requests)

        wait_for(victim_is_mid_generation, 60, "the victim to be generating")
        workers["victim"].send_signal(signal.SIGKILL)
        workers["victim"].wait(timeout=10)
        workers["replacement"] = start_worker(model_dir, prefix, "replacement", tmp_path, extra_flags)
        wait_for(lambda: client.exists(f"{prefix}:worker:replacement"), 60, "the replacement to start")
        wait_for(lambda: all_final(client, prefix, requests), 120, "every request to finish")
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        exit_codes = {name: process.wait(timeout=30) for name, process in workers.items()}
    return exit_codes


@pytest.mark.parametrize("kill_after_entries", [3, 60])  # early in the run, and well into it
def test_kill_9_mid_generation_loses_and_duplicates_nothing(model_dir, prefix, tmp_path, kill_after_entries):
    requests = make_requests(12)
    reference = reference_run(model_dir, requests)
    client = redis.Redis.from_url(REDIS_URL)
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, kill_after_entries)
    assert exit_codes["victim"] == -signal.SIGKILL
    assert exit_codes["survivor"] == 0 and exit_codes["replacement"] == 0, (tmp_path / "survivor.log").read_text()
    assert_answered_once(client, prefix, requests, reference)
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs


def test_kill_9_of_a_worker_holding_offers_loses_and_duplicates_nothing(model_dir, prefix, tmp_path):
    """Every request offered to the victim (prefix placement): those it had not read are taken by the
    survivor after the placement wait, those it was running are claimed from its affinity stream."""
    requests = make_requests(12)
    reference = reference_run(model_dir, requests)
    client = redis.Redis.from_url(REDIS_URL)
    offers = affinity_key(prefix, "normal", "victim")
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, 3, stream=offers)
    assert exit_codes["victim"] == -signal.SIGKILL
    assert exit_codes["survivor"] == 0 and exit_codes["replacement"] == 0, (tmp_path / "survivor.log").read_text()
    assert_answered_once(client, prefix, requests, reference)
    # Nothing left pending on the victim's offers: or its streams are gone already, which the survivor's
    # retirement of a gone worker's keys does only once none of its offers is unread or unacked.
    assert not client.exists(offers) or client.xpending(offers, "workers")["pending"] == 0
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs


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
    reference = reference_run(model_dir, requests)
    client = redis.Redis.from_url(REDIS_URL)
    exit_codes = _kill_the_victim_mid_generation(model_dir, prefix, tmp_path, client, requests, 40)
    assert exit_codes["victim"] == -signal.SIGKILL
    logs = "".join((tmp_path / f"{name}.log").read_text() for name in ("survivor", "replacement"))
    assert "claimed an orphaned request" in logs
    for request_id, request in requests.items():
        entries = reply_entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id
        for index in range(request["params"]["n"]):
            ours = [c for e in entries for c in e["choices"] if c["index"] == index]
            expected = reference[request_id]["choices"][index]
            assert [t for c in ours for t in c["token_ids"]] == expected["token_ids"], (request_id, index)
            assert ours[-1]["mirostat_mu"] == pytest.approx(expected["mirostat_mu"][-1], abs=1e-5)


def test_kill_9_resumed_lora_requests_keep_their_adapter(model_dir, prefix, tmp_path):
    adapters = make_adapters(model_dir, tmp_path / "adapters", ["attn8", "all16rs"])
    flags = ("--max-loras", "2", "--lora-modules", *[f"{name}={path}" for name, path in adapters.items()])
    requests = make_requests(9)
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
        entries = reply_entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries))), request_id
        tokens = [t for e in entries for choice in e["choices"] for t in choice["token_ids"]]
        assert tokens == reference[request_id]["tokens"], request_id


def test_sigterm_drains_in_flight_requests_and_leaves_the_rest_for_another_worker(model_dir, prefix, tmp_path):
    requests = make_requests(12)
    client = redis.Redis.from_url(REDIS_URL)
    first = start_worker(model_dir, prefix, "first", tmp_path)
    second = None
    try:
        wait_for(lambda: client.exists(f"{prefix}:worker:first"), 60, "the worker to start")
        for request in requests.values():
            client.xadd(f"{prefix}:requests", {"data": msgpack.packb(request)})
        wait_for(lambda: sum(client.xlen(f"{prefix}:out:{r}") for r in requests) >= 5, 60, "generation to start")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=90) == 0  # the drain may take up to its 60 s on a loaded box
        finished = [r for r in requests if any(is_final(e) for e in reply_entries(client, prefix, r))]
        started = [r for r in requests if reply_entries(client, prefix, r)]
        assert set(started) == set(finished), "a request was cut off mid-generation by the drain"
        assert len(finished) < len(requests), "nothing was left for the second worker: the test proves nothing"
        second = start_worker(model_dir, prefix, "second", tmp_path)
        wait_for(lambda: all_final(client, prefix, requests), 120, "every request to finish")
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
    for request_id in requests:
        entries = reply_entries(client, prefix, request_id)
        assert [e["seq"] for e in entries] == list(range(len(entries)))
        assert sum(len(c["token_ids"]) for e in entries for c in e["choices"]) == 150
