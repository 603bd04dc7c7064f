"""What structured outputs cost a step: the same requests with and without a JSON-schema constraint.

    python benchmarks/structured_outputs.py --model smollm2 --num-requests 32 --output-len 64

Prints, for each run, output tokens per second and the share of the step spent filling the
grammar bitmasks (the scheduler's side), plus the cold compile time of the schema. The two runs
use the same prompts, seeds and sampling; only the constraint differs. The schema (an object
holding a list of at least 200 records) cannot be complete within --output-len tokens, so every
request of both runs generates exactly --output-len tokens and the batches are the same size.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()

import argparse
import time

from pipeline.config import EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling import scheduler as scheduler_module

RECORD = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}}}
SCHEMA = {"type": "object", "required": ["people"], "additionalProperties": False,
          "properties": {"people": {"type": "array", "items": RECORD, "minItems": 200}}}


def run(engine: LLMEngine, args: argparse.Namespace, constrained: bool) -> dict[str, float]:
    fill_seconds = 0.0
    original = scheduler_module.token_bitmasks

    def timed(*call_args):  # the scheduler's bitmask fill, timed where it runs
        nonlocal fill_seconds
        started = time.perf_counter()
        result = original(*call_args)
        fill_seconds += time.perf_counter() - started
        return result

    scheduler_module.token_bitmasks = timed
    extra = {"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"} if constrained else {}
    try:
        for index in range(args.num_requests):
            params = SamplingParams.from_dict({"max_tokens": args.output_len, "temperature": 0.8, "seed": index,
                                               "ignore_eos": True, **extra})
            engine.add_request(f"{'c' if constrained else 'u'}{index}", "Describe a person as JSON:", params)
        tokens, started = 0, time.perf_counter()
        step_seconds_before = engine.stats.step_seconds
        while engine.has_unfinished:
            tokens += sum(len(choice.token_ids) for delta in engine.step() for choice in delta.choices)
        elapsed = time.perf_counter() - started
    finally:
        scheduler_module.token_bitmasks = original
    return {"tokens": tokens, "tokens_per_s": tokens / elapsed,
            "fill_share": fill_seconds / max(engine.stats.step_seconds - step_seconds_before, 1e-9),
            "fill_ms_per_token": 1000 * fill_seconds / max(tokens, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=args.model)))
    assert engine.grammars is not None
    started = time.perf_counter()
    engine.grammars.compile(SamplingParams.from_dict({"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"})
                            .structured_outputs)
    compile_ms = 1000 * (time.perf_counter() - started)
    print(f"schema compile (cold, incl. the tokenizer's llguidance view): {compile_ms:.1f} ms")
    run(engine, args, constrained=False)  # warm-up
    for constrained in (False, True):
        figures = run(engine, args, constrained)
        print(f"{'json-schema' if constrained else 'unconstrained':>13}: {figures['tokens']:5d} tokens, "
              f"{figures['tokens_per_s']:7.1f} tokens/s, bitmask fill {100 * figures['fill_share']:.1f}% of the "
              f"step ({figures['fill_ms_per_token']:.3f} ms per token)")


if __name__ == "__main__":
    main()
