"""KV blocks held by a long generation on a sliding-window model (a tiny random Mistral).

Generates --output-len greedy tokens after a --prompt-len prompt and prints the peak number of
KV blocks in use against the bound the window implies and against what full attention would hold.
Optionally checks the tokens against HF transformers (--check-hf).

    python benchmarks/sliding_window_kv.py --window 256 --output-len 2000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.kv_cache_manager import cdiv
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine
from tests.support.hf_models import make_tiny_hf_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--output-len", type=int, default=2000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget", type=int, default=64, help="max_num_batched_tokens")
    parser.add_argument("--check-hf", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_hf_model("mistral", Path(tmp) / "mistral", seed=1, sliding_window=args.window,
                                  max_position_embeddings=args.prompt_len + args.output_len + 16)
        engine = make_engine(path, block_size=args.block_size, num_kv_blocks=4096,
                             max_num_batched_tokens=args.budget, max_num_seqs=4)
        prompt = [random.Random(0).randrange(3, 512) for _ in range(args.prompt_len)]
        engine.add_request("long", prompt, SamplingParams(max_tokens=args.output_len, temperature=0.0,
                                                          ignore_eos=True))
        tokens: list[int] = []
        peak = 0
        started = time.perf_counter()
        while engine.has_unfinished:
            for delta in engine.step():
                tokens += delta.choices[0].token_ids
            peak = max(peak, engine.scheduler.kv_cache.num_used_blocks)
        seconds = time.perf_counter() - started
        bound = engine.scheduler.kv_cache.max_blocks_per_sequence(args.budget)
        full = cdiv(args.prompt_len + args.output_len, args.block_size)
        print(f"window {args.window}, block size {args.block_size}, budget {args.budget}: "
              f"{len(tokens)} tokens in {seconds:.1f} s")
        print(f"peak KV blocks in use: {peak} (bound {bound}; "
              f"window alone {cdiv(args.window, args.block_size)}; full attention would hold {full})")
        if args.check_hf:
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(path).eval()
            theirs, logits = hf_greedy(hf, prompt, args.output_len)
            assert_greedy_equal(tokens, theirs, logits, "long generation")
            print("greedy tokens equal HF transformers'")


if __name__ == "__main__":
    main()
