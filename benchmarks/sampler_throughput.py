"""Side-by-side `aqueduct batch` throughput: an older checkout vs this one, samplers off and on.

Runs, alternating, `repeats` rounds of:
  old      the older tree (--old-tree) on the greedy workload (make_workload.py)
  new      this tree on the same file
  new+t1   this tree, every request temperature 1 (seeded): the plain random path
  new+smp  this tree, every request temperature 1 + min_p + smoothing + DRY
and prints each run's wall time (whole process, start-up included), output tokens/s, and the
medians with their ratios. Old and new must produce the same tokens on the greedy file.

    python benchmarks/sampler_throughput.py --old-tree /work/wt-a535 --repeats 3

The built-in 5M model is built in each tree's own cache dir (--cache-root/old, /new) first.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

NEW_TREE = Path(__file__).resolve().parents[1]
SAMPLERS = {"temperature": 1.0, "min_p": 0.05, "smoothing_factor": 0.3, "dry_multiplier": 0.8}


THREADS: dict[str, str] = {}  # OMP_NUM_THREADS for every run, when --threads is given


def run_python(tree: Path, cache: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "AQUEDUCT_CACHE_DIR": str(cache), **THREADS}
    return subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, check=True)


@functools.cache
def model_dir(tree: Path, cache: Path) -> Path:
    code = "from pipeline.loading.default_model import default_model_dir; print(default_model_dir())"
    return Path(run_python(tree, cache, ["-c", code]).stdout.strip().splitlines()[-1])


def write_variant(source: Path, target: Path, extra: dict[str, float]) -> None:
    with source.open() as lines, target.open("w") as out:
        for line in lines:
            record = json.loads(line)
            record["body"].update(extra, seed=int(record["custom_id"][1:]))
            out.write(json.dumps(record) + "\n")


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_batch(tree: Path, cache: Path, workload: Path, output: Path) -> tuple[float, float, int, list[list[int]]]:
    """One whole `aqueduct batch` process on the tree's built-in model (given as a directory: older
    checkouts have no `--model builtin`): wall seconds, CPU seconds, output tokens, token ids.
    CPU seconds (user + system of the process) are less disturbed than wall time when other
    processes compete for the cores."""
    directory = model_dir(tree, cache)
    start, cpu_start = time.perf_counter(), child_cpu_seconds()
    run_python(tree, cache, ["-m", "actors.cli", "batch", "-i", str(workload), "-o", str(output),
                             "--model", str(directory), "--no-progress"])
    seconds, cpu_seconds = time.perf_counter() - start, child_cpu_seconds() - cpu_start
    token_ids = [choice["token_ids"] for line in output.open()
                 for choice in json.loads(line)["response"]["body"]["choices"]]
    return seconds, cpu_seconds, sum(len(ids) for ids in token_ids), token_ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-tree", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", "--num-requests", type=int, default=128)
    parser.add_argument("--cache-root", type=Path, default=Path("/tmp/aq-sampler-throughput"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of every run (OMP_NUM_THREADS); on a crowded box 1 keeps CPU time "
                             "free of spin-waiting")
    args = parser.parse_args()
    if args.threads is not None:
        THREADS["OMP_NUM_THREADS"] = str(args.threads)
    caches = {"old": args.cache_root / "old", "new": args.cache_root / "new"}
    trees = {"old": args.old_tree.resolve(), "new": NEW_TREE}
    work = args.cache_root / "work"
    work.mkdir(parents=True, exist_ok=True)
    directory = model_dir(trees["new"], caches["new"])
    model_dir(trees["old"], caches["old"])
    greedy = work / "greedy.jsonl"
    run_python(NEW_TREE, caches["new"], ["benchmarks/make_workload.py", "--model", str(directory), "-n",
                                         str(args.num_requests), "--prompt-len", "16", "256", "--output-len", "16",
                                         "256", "-o", str(greedy)])
    write_variant(greedy, work / "t1.jsonl", {"temperature": 1.0})
    write_variant(greedy, work / "samplers.jsonl", SAMPLERS)
    variants = {"old": ("old", greedy), "new": ("new", greedy), "new+t1": ("new", work / "t1.jsonl"),
                "new+smp": ("new", work / "samplers.jsonl")}
    for side in ("old", "new"):  # warm-up: compiled kernel, tokenizer snapshot
        timed_batch(trees[side], caches[side], greedy, work / f"warm-{side}.jsonl")
    rates: dict[str, dict[str, list[float]]] = {clock: {name: [] for name in variants} for clock in ("wall", "cpu")}
    for round_index in range(args.repeats):
        outputs = {}
        for name, (side, workload) in variants.items():
            seconds, cpu_seconds, tokens, outputs[name] = timed_batch(trees[side], caches[side], workload,
                                                                      work / f"{name}.out")
            rates["wall"][name].append(tokens / seconds)
            rates["cpu"][name].append(tokens / cpu_seconds)
            print(f"round {round_index + 1} {name:8s} wall {seconds:7.2f} s  cpu {cpu_seconds:7.2f} s  "
                  f"{tokens:6d} tokens  {tokens / seconds:8.1f} tok/s wall  {tokens / cpu_seconds:8.1f} tok/cpu-s",
                  flush=True)
        if outputs["old"] != outputs["new"]:
            sys.exit("old and new produced different tokens on the greedy workload")
    for clock, per_variant in rates.items():
        print_summary(clock, per_variant)


def print_summary(clock: str, rates: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) for name, values in rates.items()}
    unit = "tok/s" if clock == "wall" else "tok/cpu-s"
    print(f"\n[{clock}] median {unit}: " + ", ".join(f"{name} {value:.1f}" for name, value in medians.items()))
    for top, bottom in (("new", "old"), ("new+t1", "new"), ("new+smp", "new"), ("new+smp", "new+t1")):
        # Runs next to each other in time share the box's load, so the paired ratio is the figure.
        ratios = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
        print(f"[{clock}] {top} / {bottom}: median of round ratios {statistics.median(ratios):.3f} "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}; ratio of medians "
              f"{medians[top] / medians[bottom]:.3f})")


if __name__ == "__main__":
    main()
