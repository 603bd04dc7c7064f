"""Greedy fidelity against HF transformers on one device: float32 token-exact, bf16 agreement share.

For each tiny random model (tests/support/hf_models.py) a batch of random prompts runs through the engine
(continuous batching, chunked prefill, prefix hits, the device's default attention backend and
CUDA graphs) and each prompt through HF `generate` alone, on the same device and dtype.
- float32: every request must equal HF token for token; a divergence passes only at a near-tie
  of HF's logits (top-2 margin < 1e-3). Exit status 1 otherwise.
- bfloat16: rounding differs between any two implementations, so the share of output tokens
  that agree before each request's first divergence is reported, not asserted.

    python benchmarks/gpu_fidelity.py                          # cuda, all archs
    python benchmarks/gpu_fidelity.py --device cpu --archs llama --dtypes float32 --attention-backend torch
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import NEAR_TIE_MARGIN, run_requests
from tests.support.hf_models import make_tiny_hf_model


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new: int) -> tuple[list[int], torch.Tensor]:
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=max_new, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float().cpu()


def agreeing_prefix(ours: list[int], theirs: list[int]) -> int:
    for position, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return position
    return min(len(ours), len(theirs))


def check(arch: str, dtype: str, args: argparse.Namespace, workdir: Path) -> tuple[int, int, list[str]]:
    """(agreeing tokens, total tokens, failures) of one model in one dtype."""
    path = make_tiny_hf_model(arch, workdir / arch)
    torch_dtype = getattr(torch, dtype)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(args.device).eval()
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=str(path), device=args.device, dtype=dtype, attention_backend=args.attention_backend,
                          enforce_eager=args.enforce_eager),
        cache=CacheConfig(block_size=16, num_kv_blocks=512),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)))
    rng = random.Random(f"{arch}-{dtype}")
    shared = [rng.randrange(3, 512) for _ in range(40)]  # some prompts share a prefix (prefix-cache hits)
    requests = {}
    for index in range(args.num_requests):
        tail = [rng.randrange(3, 512) for _ in range(rng.randint(1, 150))]
        prompt = [*shared, *tail] if index % 3 == 0 else tail
        requests[f"{arch}-{index}"] = (prompt, SamplingParams(max_tokens=rng.randint(8, 48), temperature=0.0,
                                                              ignore_eos=True))
    results = run_requests(engine, requests)
    agreed = total = 0
    failures = []
    for request_id, (prompt, params) in requests.items():
        ours = results[request_id]["choices"][0]["token_ids"]
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        prefix = agreeing_prefix(ours, theirs)
        agreed, total = agreed + prefix, total + len(theirs)
        if prefix < len(theirs) and dtype == "float32":
            top2 = torch.topk(logits[prefix], 2).values
            if float(top2[0] - top2[1]) >= NEAR_TIE_MARGIN:
                failures.append(f"{request_id}: diverged at output {prefix} (ours {ours[prefix]}, HF {theirs[prefix]})")
    return agreed, total, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--archs", nargs="+", default=["llama", "qwen3", "mistral", "gemma2", "mixtral"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=12)
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            for arch in args.archs:
                agreed, total, failures = check(arch, dtype, args, Path(tmp) / dtype)
                verdict = ("token-exact" if not failures else "FAILED") if dtype == "float32" else "reported"
                print(f"{dtype} {arch}: {agreed}/{total} tokens agree with HF ({agreed / total:.1%}), {verdict}")
                for failure in failures:
                    print(f"  {failure}")
                failed |= bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
