"""Multi-LoRA throughput, side by side in one process on the built-in model (or --model).

Two ratios, each from runs interleaved in this process (best of --repeats):
  1. LoRA enabled (4 adapters loaded) but no request using one, vs LoRA disabled: the wrappers'
     plain path should cost nothing (target: within 3%).
  2. The same requests spread over 4 rank-16 adapters on all seven projections, vs on the base
     model, both on the LoRA engine (target: >= 0.7x).

Adapters are written as PEFT directories with random weights (no peft needed). The box may be
shared: read the ratios, not the absolute figures.

    python benchmarks/lora_throughput.py --requests 128 --max-tokens 32
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.lora.adapter import TARGET_MODULES
from pipeline.request.sampling_params import SamplingParams


def write_adapter(path: Path, engine: LLMEngine, rank: int, seed: int) -> Path:
    """A PEFT-layout adapter of `rank` on every projection of every layer of the engine's model."""
    assert engine.runner.lora is not None
    shapes = engine.runner.lora.shapes
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shapes.num_layers):
        for module in TARGET_MODULES:
            in_features, out_features = shapes.features[module]
            group = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * in_features**-0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.1 * rank**-0.5
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGET_MODULES)}))
    return path


def make_engine(model: str | None, lora: LoRAConfig | None, max_num_seqs: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(model=model), cache=CacheConfig(num_kv_blocks=4096),
                                  scheduler=SchedulerConfig(max_num_seqs=max_num_seqs), lora=lora))


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, loras: list[str | None]) -> float:
    """Output tokens per second for all prompts at once (prefix cache reset, so every run computes all)."""
    engine.scheduler.kv_cache.pool.reset_prefix_cache()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}-{started}", prompt, params, lora=loras[index % len(loras)])
    while engine.has_unfinished:
        engine.step()
    return len(prompts) * max_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    plain = make_engine(args.model, None, args.requests)
    names = [f"adapter{i}" for i in range(4)]
    probe = make_engine(args.model, LoRAConfig(), args.requests)
    paths = [write_adapter(root / name, probe, args.rank, i) for i, name in enumerate(names)]
    del probe
    lora = make_engine(args.model, LoRAConfig(modules=tuple(zip(names, map(str, paths), strict=True)), max_loras=4,
                                              max_lora_rank=max(args.rank, 16)), args.requests)
    rng = random.Random(0)
    vocab = plain.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    run(plain, prompts[:4], 4, [None])  # warm-up (oneDNN primitives, kernels)
    run(lora, prompts[:4], 4, [None, *names])
    best = {"disabled": 0.0, "enabled_unused": 0.0, "base_on_lora_engine": 0.0, "four_adapters": 0.0}
    for _ in range(args.repeats):
        best["disabled"] = max(best["disabled"], run(plain, prompts, args.max_tokens, [None]))
        best["enabled_unused"] = max(best["enabled_unused"], run(lora, prompts, args.max_tokens, [None]))
        best["four_adapters"] = max(best["four_adapters"], run(lora, prompts, args.max_tokens, names))
        best["base_on_lora_engine"] = max(best["base_on_lora_engine"], run(lora, prompts, args.max_tokens, [None]))
    print(f"torch threads {torch.get_num_threads()}; model {args.model}, {args.requests} requests x "
          f"({args.prompt_len} prompt + {args.max_tokens} output) tokens, "
          f"4 adapters of rank {args.rank} on all 7 projections, best of {args.repeats}")
    for name, value in best.items():
        print(f"  {name:22s} {value:9.1f} output tokens/s")
    print(f"LoRA enabled, unused / disabled:  {best['enabled_unused'] / best['disabled']:.3f}x  (target >= 0.97)")
    print(f"4 adapters / base model:          {best['four_adapters'] / best['base_on_lora_engine']:.3f}x  "
          "(target >= 0.70)")


if __name__ == "__main__":
    main()
