"""The nano-vllm workload on a random Qwen3-0.6B-shaped model: output tokens/s and share of roofline.

256 requests, prompt lengths uniform in 100-1024 and output lengths in 100-1024 (random token
ids, greedy, ignore_eos), all submitted at once; the model is built locally from a Qwen3Config
(random weights, saved with save_pretrained), so nothing is downloaded.

Roofline (printed with its inputs): the time an ideal engine needs on this GPU for the same
work, each part at the chip's peak:
- decode step t (every request with output_len > t decodes one token): it must read every weight
  once (all parameters but the input embedding, which is only gathered; a tied lm_head counts)
  plus the K/V of every active request's context (prompt_len + t tokens); time = bytes / HBM
  bandwidth;
- prefill: 2 FLOPs per layer parameter per prompt token at the peak bf16 matmul rate (attention
  scores and the lm_head of non-final tokens left out, so the bound is generous to us).
roofline tokens/s = total output tokens / (sum of decode step times + prefill time).
H200 peaks: 4.8e12 B/s HBM3e, 989e12 bf16 FLOP/s dense (spec sheet); --bandwidth / --flops override.

    python benchmarks/nano_vllm_shape.py                   # on a GPU machine
    python benchmarks/nano_vllm_shape.py --cpu-smoke       # tiny model and workload on CPU: checks the script
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actors.cli.bench import make_workload, run_engine
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine

QWEN3_0_6B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000.0}
SMOKE = {**QWEN3_0_6B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512}


def build_model(path: Path, shape: dict, device: str) -> Path:
    if (path / "config.json").exists():
        return path
    config = Qwen3Config(**shape, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return path


def roofline_tokens_per_s(shape: dict, prompt_lens: np.ndarray, output_lens: np.ndarray,
                          bandwidth: float, flops: float, dtype_bytes: int = 2) -> tuple[float, dict]:
    hidden, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    q_width = shape["num_attention_heads"] * shape["head_dim"]
    kv_width = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = hidden * (q_width + 2 * kv_width) + q_width * hidden + 3 * hidden * shape["intermediate_size"]
    weights_read = layers * per_layer + vocab * hidden  # the lm_head (tied or not) is read every step
    weight_bytes = weights_read * dtype_bytes
    kv_bytes_per_token = 2 * layers * kv_width * dtype_bytes
    decode_seconds = 0.0
    for step in range(int(output_lens.max())):
        active = output_lens > step
        context_tokens = int((prompt_lens[active] + step).sum())
        decode_seconds += (weight_bytes + context_tokens * kv_bytes_per_token) / bandwidth
    prefill_seconds = 2 * layers * per_layer * int(prompt_lens.sum()) / flops  # attention FLOPs left out
    rate = int(output_lens.sum()) / (decode_seconds + prefill_seconds)
    return rate, {"weight_bytes_per_step": weight_bytes, "kv_bytes_per_token": kv_bytes_per_token,
                  "decode_s": round(decode_seconds, 3), "prefill_s": round(prefill_seconds, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default="/tmp/aqueduct-qwen3-0.6b-shape")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, 8 requests, on CPU")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="HBM bytes/s (H200: 4.8e12)")
    parser.add_argument("--flops", type=float, default=989e12, help="bf16 dense FLOP/s (H200: 989e12)")
    args = parser.parse_args()
    smoke = args.cpu_smoke
    shape = SMOKE if smoke else QWEN3_0_6B
    device = "cpu" if smoke else "cuda"
    if not smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke to check the script on CPU", file=sys.stderr)
        return 2
    num_requests = 8 if smoke else args.num_requests
    lens = ((10, 60), (10, 40)) if smoke else ((100, 1024), (100, 1024))
    model_dir = build_model(Path(args.model_dir + ("-smoke" if smoke else "")), shape, device)
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), device=device, dtype="float32" if smoke else "bfloat16",
                          enforce_eager=args.enforce_eager, attention_backend=args.attention_backend),
        cache=CacheConfig(block_size=16, num_kv_blocks=256 if smoke else None, gpu_memory_utilization=0.9),
        scheduler=SchedulerConfig(max_num_batched_tokens=1024 if smoke else 16384, max_num_seqs=256)))
    workload = make_workload(num_requests, lens[0], lens[1], engine.vocab_size, seed=0)
    started = time.perf_counter()
    run_engine(engine, make_workload(4, (8, 16), (4, 8), engine.vocab_size, seed=1))  # warm-up
    warmup = time.perf_counter() - started
    seconds, forward_share, sample_share = run_engine(engine, workload)
    rate = workload.useful_tokens / seconds
    roofline, parts = roofline_tokens_per_s(shape, np.array([len(p) for p in workload.prompts]),
                                            np.array(workload.output_lens), args.bandwidth, args.flops)
    print(f"workload: {num_requests} requests, prompts {lens[0]}, outputs {lens[1]}, "
          f"{workload.useful_tokens} output tokens; warm-up {warmup:.1f} s")
    print(f"aqueduct: {seconds:.2f} s, {rate:.0f} output tokens/s, {engine.stats.num_steps} steps, "
          f"forward {forward_share:.0%}, sampling {sample_share:.0%}, preemptions {engine.scheduler.num_preemptions}, "
          f"cuda graphs {engine.runner.graph_runner is not None}, backend {type(engine.runner.backend).__name__}")
    print(f"roofline: {roofline:.0f} output tokens/s ({parts}; bandwidth {args.bandwidth:.3g} B/s, "
          f"{args.flops:.3g} FLOP/s)")
    print(f"share of roofline: {rate / roofline:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
