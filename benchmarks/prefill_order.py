"""Time to first token of a burst by admission order: `--prefill-order arrival` (first come first
served), `burst` (a step's arrivals fewest prompt tokens first) and `shortest` (fewest prompt tokens
first), each at one or more token budgets and `--long-prefill-token-threshold` values (a prompt
chunk's cap per step, 0: none), in one engine's step loop.

    python benchmarks/prefill_order.py [--model smollm2] [--requests 32] [--rounds 3]
        [--orders arrival burst shortest] [--budgets 2048 1024] [--thresholds 0 256] [--serve-workload]
        [--long-first WORDS]

The workload of `aqueduct bench --serve`: --requests prompts of 40-400 words (seeded; with
--serve-workload the very prompts that command sends), all arriving at once, 128 greedy tokens each
(ignore_eos). With --long-first, one prompt of that many words arrives a step before the burst (a
long document already in prefill when the burst comes), its TTFT printed apart. Each round runs
every order, budget and threshold on fresh engines, reversing the sequence every other round;
printed per run: the burst's time to first token p50 and p99 (from its arrival), and the burst's
output tokens/s (the long prompt's own not counted). The box's noise moves every figure: compare
within a round.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import random
import statistics
import time

from actors.cli.bench_serve.workload import serve_workload
from pipeline.config import PREFILL_ORDERS, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams

WORDS = ("river", "stone", "bridge", "water", "light", "city", "morning", "garden", "voice", "table")


def _prompts(count: int, seed: int, words: int | None = None) -> list[str]:
    """`count` prompts of `words` words each (default: 40-400, drawn)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words or rng.randint(40, 400))) for _ in range(count)]


def _run(model: str, order: str, budget: int, threshold: int, prompts: list[str], output_len: int,
         long_prompt: str | None) -> tuple[float, float, float, float | None]:
    scheduler = SchedulerConfig(prefill_order=order, max_num_batched_tokens=budget,
                                long_prefill_token_threshold=threshold)
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=model), scheduler=scheduler))
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    engine.add_request("warm-up", "hello", SamplingParams(max_tokens=2, temperature=0.0))
    while engine.has_unfinished:
        engine.step()
    first: dict[str, float] = {}
    long_started = time.perf_counter()
    if long_prompt is not None:
        engine.add_request("long", long_prompt, params)
        _record_first_tokens(engine.step(), first, long_started)
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    while engine.has_unfinished:
        _record_first_tokens(engine.step(), first, started)
    elapsed = time.perf_counter() - started
    long_ttft = first.pop("long", None)
    if long_ttft is not None:
        long_ttft += started - long_started  # first recorded it from the burst's arrival
    ttfts = sorted(first.values())
    p99 = ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]
    return statistics.median(ttfts), p99, len(prompts) * output_len / elapsed, long_ttft


def _record_first_tokens(deltas: list, first: dict[str, float], since: float) -> None:
    for delta in deltas:
        if any(choice.token_ids for choice in delta.choices):
            first.setdefault(delta.request_id, time.perf_counter() - since)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--orders", nargs="+", default=list(PREFILL_ORDERS), choices=PREFILL_ORDERS)
    parser.add_argument("--budgets", nargs="+", type=int, default=[2048], help="--max-num-batched-tokens values")
    parser.add_argument("--thresholds", nargs="+", type=int, default=[0],
                        help="--long-prefill-token-threshold values (0: no cap)")
    parser.add_argument("--long-first", type=int, default=0,
                        help="words of one prompt that arrives a step before the burst (0: none)")
    parser.add_argument("--serve-workload", action="store_true",
                        help="the prompts of `aqueduct bench --serve` (its corpus words), not this file's ten words")
    args = parser.parse_args()
    prompts = ([request.prompt for request in serve_workload(args.requests, (40, 400), (128, 128), args.seed)]
               if args.serve_workload else _prompts(args.requests, args.seed))
    long_prompt = _prompts(1, args.seed + 1, args.long_first)[0] if args.long_first else None
    runs = [(order, budget, threshold) for budget in args.budgets for threshold in args.thresholds
            for order in args.orders]
    for round_index in range(args.rounds):
        for order, budget, threshold in runs if round_index % 2 == 0 else runs[::-1]:
            p50, p99, throughput, long_ttft = _run(args.model, order, budget, threshold, prompts, args.output_len,
                                                   long_prompt)
            print(f"round {round_index + 1} {order:8s} budget {budget:5d} threshold {threshold:4d}: "
                  f"TTFT p50 {p50:.2f} s, p99 {p99:.2f} s, {throughput:.1f} output tokens/s"
                  + (f", the long prompt's TTFT {long_ttft:.2f} s" if long_ttft is not None else ""))


if __name__ == "__main__":
    main()
