"""Time to first token of a burst by admission order: `--prefill-order arrival` (first come first
served), `burst` (a step's arrivals fewest prompt tokens first) and `shortest` (fewest prompt tokens
first), each at one or more token budgets, in one engine's step loop.

    python benchmarks/prefill_order.py [--model smollm2] [--requests 32] [--rounds 3]
        [--orders arrival burst shortest] [--budgets 2048 1024] [--serve-workload]

The workload of `aqueduct bench --serve`: --requests prompts of 40-400 words (seeded; with
--serve-workload the very prompts that command sends), all arriving at once, 128 greedy tokens each
(ignore_eos). Each round runs every order and budget on fresh engines, reversing the sequence every
other round; printed per run: time to first token p50 and p99 (from the burst's arrival), and output
tokens/s over the whole burst. The box's noise moves every figure: compare within a round.
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


def _prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 400))) for _ in range(count)]


def _run(model: str, order: str, budget: int, prompts: list[str], output_len: int) -> tuple[float, float, float]:
    scheduler = SchedulerConfig(prefill_order=order, max_num_batched_tokens=budget)
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=model), scheduler=scheduler))
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    engine.add_request("warm-up", "hello", SamplingParams(max_tokens=2, temperature=0.0))
    while engine.has_unfinished:
        engine.step()
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    first: dict[str, float] = {}
    while engine.has_unfinished:
        for delta in engine.step():
            if any(choice.token_ids for choice in delta.choices):
                first.setdefault(delta.request_id, time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    ttfts = sorted(first.values())
    p99 = ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]
    return statistics.median(ttfts), p99, len(prompts) * output_len / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--orders", nargs="+", default=list(PREFILL_ORDERS), choices=PREFILL_ORDERS)
    parser.add_argument("--budgets", nargs="+", type=int, default=[2048], help="--max-num-batched-tokens values")
    parser.add_argument("--serve-workload", action="store_true",
                        help="the prompts of `aqueduct bench --serve` (its corpus words), not this file's ten words")
    args = parser.parse_args()
    prompts = ([request.prompt for request in serve_workload(args.requests, (40, 400), (128, 128), args.seed)]
               if args.serve_workload else _prompts(args.requests, args.seed))
    runs = [(order, budget) for budget in args.budgets for order in args.orders]
    for round_index in range(args.rounds):
        for order, budget in runs if round_index % 2 == 0 else runs[::-1]:
            p50, p99, throughput = _run(args.model, order, budget, prompts, args.output_len)
            print(f"round {round_index + 1} {order:8s} budget {budget:5d}: TTFT p50 {p50:.2f} s, p99 {p99:.2f} s, "
                  f"{throughput:.1f} output tokens/s")


if __name__ == "__main__":
    main()
