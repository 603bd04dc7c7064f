"""CPU: the torch attention backend (SDPA + the native decode kernel) vs FlexAttention compiled for
CPU, side by side on one engine workload (the built-in model unless --model is given).

Each backend runs the workload twice: the first pass includes torch.compile's kernel builds (a
new shape compiles once per process), the second is steady state. Prints output tokens/s per
pass and the flex / torch ratios.

    python benchmarks/cpu_attention_backends.py --num-requests 16 --prompt-len 16 128 --output-len 16 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actors.cli.bench import make_workload, run_engine
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 128])
    parser.add_argument("--output-len", type=int, nargs=2, default=[16, 64])
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    for backend in ("torch", "flex"):
        engine = LLMEngine(EngineConfig(model=ModelConfig(model=args.model, device="cpu", attention_backend=backend),
                                        cache=CacheConfig(num_kv_blocks=1024),
                                        scheduler=SchedulerConfig(max_num_seqs=32)))
        workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len),
                                 engine.vocab_size, seed=0)
        rates[backend] = []
        for label in ("first pass (with compiles)", "second pass"):
            seconds, forward_share, _ = run_engine(engine, workload)
            rates[backend].append(workload.useful_tokens / seconds)
            print(f"{backend:5s} {label}: {seconds:.2f} s, {rates[backend][-1]:.1f} output tokens/s, "
                  f"forward {forward_share:.0%}")
    print(f"flex / torch: first pass {rates['flex'][0] / rates['torch'][0]:.2f}x, "
          f"second pass {rates['flex'][1] / rates['torch'][1]:.2f}x")


if __name__ == "__main__":
    main()
