"""Sampler micro-benchmark: one call on [rows, vocab] float32 logits, per configuration, median of runs.

    python benchmarks/sampler_micro.py [--rows 128] [--vocab 49152] [--runs 30] [--only NAME,...]

The "classic" configurations use only the samplers that existed before the Aphrodite set; they
show what the fast paths cost when every new sampler is off. The others cost what they cost.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.sampler import Sampler
from pipeline.step.sampling_batch import SamplingBatch

HISTORY_TOKENS = 512  # prompt + output per row, for penalties and DRY


def _batch(rows: int, vocab: int, params: SamplingParams) -> SamplingBatch:
    """A batch of identical rows built the way tensor prep builds it (through a PersistentBatch)."""
    from pipeline.step.plan import NewSequence, StepPlan
    from pipeline.tensor_prep.persistent_batch import PersistentBatch

    generator = np.random.default_rng(0)
    persistent = PersistentBatch(rows, HISTORY_TOKENS + 1, 16)
    plan = StepPlan(step_id=0)
    for seq_id in range(rows):
        tokens = generator.integers(0, vocab, HISTORY_TOKENS).tolist()
        plan.new_sequences.append(NewSequence(seq_id, tokens, HISTORY_TOKENS // 2, [], 0, params, seq_id, 0, (2,)))
    persistent.apply(plan)
    return persistent.sampling_batch(np.arange(rows))


CONFIGS: dict[str, dict[str, Any]] = {
    "classic greedy": {"temperature": 0.0},
    "classic greedy + logprobs 5": {"temperature": 0.0, "logprobs": 5},
    "classic random T=0.8": {"temperature": 0.8},
    "classic random top_p/top_k/min_p": {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05},
    "classic random + penalties": {"temperature": 0.8, "repetition_penalty": 1.1, "presence_penalty": 0.5},
    "tfs 0.9": {"temperature": 0.8, "tfs": 0.9},
    "typical_p 0.9 + eta 3": {"temperature": 0.8, "typical_p": 0.9, "eta_cutoff": 3.0},
    "xtc + smoothing + dynatemp": {"xtc_threshold": 0.1, "xtc_probability": 0.5, "smoothing_factor": 0.3,
                                   "dynatemp_min": 0.5, "dynatemp_max": 1.5},
    "mirostat v2": {"mirostat_mode": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1},
    "dry 0.8": {"temperature": 0.8, "dry_multiplier": 0.8},
    "min_p + smoothing + dry": {"temperature": 1.0, "min_p": 0.05, "smoothing_factor": 0.3, "dry_multiplier": 0.8},
    "logit_bias + bans": {"temperature": 0.8, "logit_bias": {5: 2.0, 9: -100.0}, "custom_token_bans": [7, 8]},
}


def _time(call: Callable[[], Any], runs: int) -> tuple[float, float, float]:
    """(median, min) wall seconds and the min CPU seconds (all threads of this process). On a
    shared machine the minimum is the steadier figure (other processes only ever add time), and
    CPU time the steadier still: a call longer than a time slice is stretched by every other
    runnable process, which CPU time does not count."""
    call()  # warm-up
    timings, cpu_timings = [], []
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        call()
        timings.append(time.perf_counter() - started)
        cpu_timings.append(time.process_time() - cpu_started)
    return statistics.median(timings), min(timings), min(cpu_timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--only", default=None, help="comma-separated configuration names")
    args = parser.parse_args()
    logits = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
    sampler = Sampler(args.vocab)
    wanted = set(args.only.split(",")) if args.only else None
    results = {}
    for name, knobs in CONFIGS.items():
        if wanted is not None and name not in wanted:
            continue
        try:
            batch = _batch(args.rows, args.vocab, SamplingParams(max_tokens=None, **knobs))
        except (TypeError, ValueError) as error:  # a knob this version does not have
            results[name] = {"n/a": str(error)}
            continue
        median, fastest, cpu = _time(lambda batch=batch: sampler(logits, batch), args.runs)
        results[name] = {"median_ms": round(median * 1000, 2), "min_ms": round(fastest * 1000, 2),
                         "min_cpu_ms": round(cpu * 1000, 2)}
    print(json.dumps({"rows": args.rows, "vocab": args.vocab, "threads": torch.get_num_threads(), "results": results},
                     indent=1))


if __name__ == "__main__":
    main()
