"""One tenant floods, another trickles: the trickling tenant's latency beside the flood, against alone.

    python benchmarks/tenant_fairness.py --flood 150 --few 10 --workers 1

`aqueduct worker`s and one `aqueduct serve` gateway with `--api-keys` (keys for tenants `flood` and
`few`) on a fresh Redis prefix, the default model unless --model. Rounds:
- alone: the few requests, sent together, on an idle deployment;
- beside the flood: the flood's requests sent together, then after --lead-s the few, each tenant
  with its own key (the gateway's fair gate and the workers' fair share keep them apart);
- the same with the workers' step shares off (`--fair-step-tokens 0`: seats and order only);
- one key: the same, both with the flood's key (one tenant: first come, first served).
Every request is a completion of --max-tokens greedy tokens (ignore_eos). Printed: the few's
end-to-end latency p50 and max, and p50 as a multiple of alone; the flood's last answer (what the
shares cost it). With --kill-after-s and 2+ workers,
worker 0 is killed with SIGKILL that long into each loaded round and every request must still come
back whole, exactly once. Figures depend on the machine and on what else runs on it: compare the
ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from gateway_deployment import Deployment

KEYS = {"flood": "key-flood", "few": "key-few"}


async def _complete(http: httpx.AsyncClient, base_url: str, key: str, tag: str, args: argparse.Namespace) -> float:
    started = time.perf_counter()
    response = await http.post(f"{base_url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": args.model_name, "prompt": " ".join(f"{tag} line {word}" for word in range(args.prompt_words)),
        "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}, timeout=1800)
    body = response.json()
    if response.status_code != 200 or body["usage"]["completion_tokens"] != args.max_tokens:
        raise RuntimeError(f"{tag}: {response.status_code} {str(body)[:300]}")
    return time.perf_counter() - started


async def _round(base_url: str, args: argparse.Namespace, flood_key: str | None, few_key: str,
                 deployment: Deployment) -> tuple[list[float], float | None]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1000)) as http:
        flood = [asyncio.create_task(_complete(http, base_url, flood_key, f"flood {i}", args))
                 for i in range(args.flood if flood_key else 0)]
        if flood:
            await asyncio.sleep(args.lead_s)
        killer = asyncio.create_task(_kill_later(deployment, args)) if flood and args.kill_after_s else None
        few = await asyncio.gather(*(_complete(http, base_url, few_key, f"few {i}", args) for i in range(args.few)))
        flood_latencies = await asyncio.gather(*flood)  # every one whole (each checks its tokens), or it fails
        if killer is not None:
            await killer
    return few, max(flood_latencies, default=None)


async def _kill_later(deployment: Deployment, args: argparse.Namespace) -> None:
    await asyncio.sleep(args.kill_after_s)
    victim = deployment.workers[0]
    if victim.alive():
        victim.kill_hard()


def _keys_file() -> Path:
    path = Path(tempfile.mkdtemp(prefix="aq-tenants-")) / "keys.csv"
    path.write_text("".join(f"{key},{tenant}\n" for tenant, key in KEYS.items()))
    return path


def _report(label: str, latencies: list[float], flood_last: float | None, alone_p50: float | None) -> float:
    p50 = statistics.median(latencies)
    ratio = f" ({p50 / alone_p50:.1f}x alone)" if alone_p50 else ""
    flood = f"; the flood's last answer at {flood_last:.2f} s" if flood_last is not None else ""
    print(f"{label}: the few's latency p50 {p50:.2f} s{ratio}, max {max(latencies):.2f} s{flood}")
    return p50


def _fresh(args: argparse.Namespace, worker_flags: tuple[str, ...]) -> tuple[Deployment, str]:
    deployment = Deployment(args.redis_url, args.model)
    for _ in range(args.workers):
        deployment.start_worker(*worker_flags)
    gateway = deployment.start_gateway("--api-keys", str(_keys_file()), "--max-pending", "1000")
    return deployment, gateway.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--flood", type=int, default=150)
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=20)
    parser.add_argument("--lead-s", type=float, default=1.0, help="the flood's head start")
    parser.add_argument("--kill-after-s", type=float, default=0.0, help="kill worker 0 this long into loaded rounds")
    args = parser.parse_args()
    args.model_name = args.model
    rounds = (("alone", None, KEYS["few"], ()),
              ("beside the flood, own key", KEYS["flood"], KEYS["few"], ()),
              ("beside the flood, own key, --fair-step-tokens 0", KEYS["flood"], KEYS["few"],
               ("--fair-step-tokens", "0")),
              ("beside the flood, one key", KEYS["flood"], KEYS["flood"], ()))
    alone_p50 = None
    for label, flood_key, few_key, worker_flags in rounds:
        deployment, base_url = _fresh(args, worker_flags)  # fresh processes: no cache or state carries over
        try:
            args.model_name = httpx.get(f"{base_url}/v1/models", headers={
                "Authorization": f"Bearer {KEYS['few']}"}).json()["data"][0]["id"]
            latencies, flood_last = asyncio.run(_round(base_url, args, flood_key, few_key, deployment))
        finally:
            deployment.close()
        p50 = _report(label, latencies, flood_last, alone_p50)
        alone_p50 = alone_p50 or p50


if __name__ == "__main__":
    main()
