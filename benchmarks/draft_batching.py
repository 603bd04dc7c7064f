"""Draft-model speculation with several sequences at once: a step's drafts in one batched call
(`DraftModelProposer.propose_many`) against each sequence drafted in turn, side by side in one process.

    python benchmarks/draft_batching.py [--model smollm2] [--draft-model smollm2] [--requests 4]
                                        [--output-len 64] [--rounds 2] [--k 4]

One engine (the CPU defaults: dtype and quantization auto) with the draft model; each round runs
`--requests` greedy copy-300 requests together (benchmarks/speculative.py's prompt, EOS ignored)
once batched and once with the step's prefetch turned off, so every sequence drafts in turn as
Speculator.draft asks. Prints useful tokens/s (prefill included) per round and the ratios.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import time

from speculative import PROMPTS

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SpeculativeConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams
from pipeline.speculative.speculator import Speculator

BATCHED_PREFETCH = Speculator.prefetch


def _in_turn(speculator: Speculator, *_args: object) -> None:
    speculator._prefetched.clear()  # nothing prefetched: each sequence's draft() proposes on its own


def _rate(engine: LLMEngine, prompt: str, requests: int, output_len: int, tag: str, batched: bool) -> float:
    Speculator.prefetch = BATCHED_PREFETCH if batched else _in_turn
    for index in range(requests):
        engine.add_request(f"{tag}-{index}", prompt,
                           SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True))
    started, tokens = time.perf_counter(), 0
    while engine.has_unfinished:
        for delta in engine.step():
            tokens += sum(len(choice.token_ids) for choice in delta.choices)
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft-model", default="smollm2")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=args.model), cache=CacheConfig(num_kv_blocks=512, enable_prefix_caching=False),
        speculative=SpeculativeConfig.from_dict({"model": args.draft_model, "num_speculative_tokens": args.k})))
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS["copy-300"]}],
                                                  tokenize=False, add_generation_prompt=True)
    _rate(engine, prompt, 1, 8, "warm-up", batched=True)
    print(f"{args.requests} requests x {args.output_len} tokens, draft {args.draft_model}, k={args.k} "
          f"(useful tokens/s)")
    for round_index in range(args.rounds):
        batched = _rate(engine, prompt, args.requests, args.output_len, f"batched-{round_index}", batched=True)
        in_turn = _rate(engine, prompt, args.requests, args.output_len, f"in-turn-{round_index}", batched=False)
        print(f"round {round_index + 1}: batched {batched:.1f}, in turn {in_turn:.1f}, ratio {batched / in_turn:.2f}")
    Speculator.prefetch = BATCHED_PREFETCH


if __name__ == "__main__":
    main()
