"""What N engine processes on one host do to each other's throughput: default threads vs --cpu-threads.

    python benchmarks/workers_on_one_host.py --model builtin --workers 4 --seconds 10

Each process is what an `aqueduct worker` runs (the engine on its own torch threads), fed from a
local queue instead of Redis so only the CPU is shared. Processes load their model, then start
together at one wall-clock instant and step for a fixed time with 16 greedy requests in flight
(prompts 16-128, outputs 16-64 tokens, replaced as they finish); each reports its tokens/s. The
four settings run one after another: one process alone and N at once, with the default thread
count (sized from the CPUs the process may use) and with 1 thread each.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import multiprocessing as mp
import time

IN_FLIGHT = 16


def _engine_process(model: str, threads: int | None, start_at: float, seconds: float, index: int,
                    results: mp.Queue) -> None:
    from actors.cli.bench import make_workload
    from actors.cli.logging_setup import configure_logging
    from actors.kit.process_tuning import set_compute_threads, tune_glibc_malloc
    from pipeline.config import EngineConfig, ModelConfig
    from pipeline.engine import LLMEngine
    from pipeline.request.sampling_params import SamplingParams

    configure_logging("WARNING")
    tune_glibc_malloc()
    used_threads = set_compute_threads(threads)
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=model)))
    workload = make_workload(4096, (16, 128), (16, 64), engine.vocab_size, seed=index)
    next_request = 0

    def top_up() -> None:
        nonlocal next_request
        while len(engine.scheduler.requests) < IN_FLIGHT:
            params = SamplingParams(max_tokens=workload.output_lens[next_request], temperature=0.0, ignore_eos=True)
            engine.add_request(f"r{next_request}", workload.prompts[next_request], params)
            next_request += 1

    top_up()
    engine.step()  # warm-up
    time.sleep(max(0.0, start_at - time.time()))
    tokens_before = engine.scheduler.num_generated_tokens
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        top_up()
        engine.step()
    elapsed = time.perf_counter() - started
    results.put((used_threads, (engine.scheduler.num_generated_tokens - tokens_before) / elapsed))


def run_setting(model: str, workers: int, threads: int | None, seconds: float, load_s: float) -> list[tuple]:
    context = mp.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + load_s
    processes = [context.Process(target=_engine_process, args=(model, threads, start_at, seconds, i, results))
                 for i in range(workers)]
    for process in processes:
        process.start()
    rates = [results.get(timeout=load_s + seconds * 20 + 120) for _ in processes]
    for process in processes:
        process.join()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per setting")
    parser.add_argument("--load-seconds", type=float, default=20.0, help="head start for loading the models")
    args = parser.parse_args()
    print(f"model {args.model}, {IN_FLIGHT} requests in flight per process, {args.seconds:g} s per setting")
    for threads in (None, 1):
        label = "default threads" if threads is None else f"--cpu-threads {threads}"
        solo = run_setting(args.model, 1, threads, args.seconds, args.load_seconds)
        crowd = run_setting(args.model, args.workers, threads, args.seconds, args.load_seconds)
        per_process = [rate for _, rate in crowd]
        print(f"  {label} ({solo[0][0]} per process):")
        print(f"    1 process alone: {solo[0][1]:8.1f} tokens/s")
        print(f"    {args.workers} at once: " + " ".join(f"{rate:.1f}" for rate in per_process)
              + f" tokens/s; total {sum(per_process):.1f} = {sum(per_process) / solo[0][1]:.2f}x one alone")


if __name__ == "__main__":
    main()
