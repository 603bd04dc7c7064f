"""Greedy `aqueduct batch` vs HF transformers on tiny random models no test has seen.

Each case draws an architecture (any of tests/support/hf_models.py: llama, llama3, qwen2, qwen3, mistral,
phi3, mixtral, gemma2, gemma3, gemma4, olmo2, granite, smollm3, glm4, deepseek_v2, deepseek_v3, gpt_oss, llama4,
qwen3_next, qwen3_5, qwen3_5_moe, with a sliding
window drawn for the families that have one and latent sizes for DeepSeek's), a head layout,
sizes, a weight
seed and tight engine limits (KV blocks, token budget, sequences per step, block size) from
--seed, runs a batch file of mixed-length greedy requests through `aqueduct batch --dtype float32`, and
compares every request with HF `generate` (float32) on that request alone. A divergence passes only at a near-tie of
HF's logits (top-2 margin < 1e-3). Exit status 1 if any divergence is not a near-tie.

    python benchmarks/check_fidelity.py --seed 7 --cases 4
    python benchmarks/check_fidelity.py --seed 41 --cases 4 --tensor-parallel-size 2

With --tensor-parallel-size N the engine runs N ranks, and cases are drawn among the dense
families with a head count N divides (mixture-of-experts models and OLMo 2 are not sharded).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.hf_models import ARCHS, RECURRENT_ARCHS, make_tiny_hf_model

NEAR_TIE_MARGIN = 1e-3
WINDOWED_ARCHS = ("mistral", "gemma2", "gemma3", "gemma4", "phi3", "mixtral", "gpt_oss")  # configs carry sliding_window
# A window is drawn, never None (Gemma 3's and gpt-oss's sliding layers need one).
ALWAYS_WINDOWED_ARCHS = ("mistral", "gemma3", "gemma4", "gpt_oss")
# Their layer_types name each layer, so the layer count is tests/support/hf_models.py's (Gemma 4: 6).
FIXED_DEPTH_ARCHS = ("gemma4", *RECURRENT_ARCHS)
# Every case runs `--dtype float32`, as HF does here: `--dtype auto` is bfloat16 on CPUs that multiply
# it (AVX512-BF16, AMX), and over 40 greedy tokens of a random model bfloat16 parts from float32 at
# margins far from a near-tie (seed 23 on a Zen 4: 72 of 108 requests equal in bfloat16, 108 of 108
# in float32). bfloat16 against HF's own bfloat16 is the tests' business (tests/pipeline/model/models).
UNSHARDED_ARCHS = ("mixtral", "olmo2", "gpt_oss")  # tensor parallelism refuses them
# (experts; q/k norms over all heads)
UNSHARDED_ARCHS += ("gemma4",)  # layers of several head sizes, reused keys and values: not sharded yet
UNSHARDED_ARCHS += RECURRENT_ARCHS  # a recurrent state per sequence: not sharded yet
MLA_ARCHS = ("deepseek_v2", "deepseek_v3")
MAX_PROMPT, MAX_OUTPUT = 70, 40


@dataclass
class Case:
    arch: str
    seed: int
    config: dict[str, Any]
    flags: list[str]


def draw_case(rng: random.Random) -> Case:
    arch = rng.choice(ARCHS)
    head_dim = rng.choice([16, 32, 48, 64])
    num_kv_heads = rng.choice([1, 2, 4])
    num_heads = num_kv_heads * rng.choice([1, 2, 3])
    hidden = num_heads * head_dim if arch != "qwen3" else rng.choice([64, 96, 128])
    config: dict[str, Any] = {"hidden_size": hidden, "num_attention_heads": num_heads,
                              "num_key_value_heads": num_kv_heads, "num_hidden_layers": rng.randint(1, 3),
                              "intermediate_size": rng.choice([96, 160, 256])}
    if arch == "qwen3":
        config["head_dim"] = head_dim
    if arch in FIXED_DEPTH_ARCHS:
        del config["num_hidden_layers"]
    if arch in MLA_ARCHS:  # HF expands the latent into one KV head per query head
        config.update(num_key_value_heads=num_heads, kv_lora_rank=rng.choice([16, 32, 64]),
                      qk_rope_head_dim=rng.choice([8, 16]), qk_nope_head_dim=rng.choice([16, 24, 32]),
                      v_head_dim=rng.choice([16, 24, 32]))
    if arch in WINDOWED_ARCHS:
        config["sliding_window"] = rng.choice([None, rng.randint(3, MAX_PROMPT)]) \
            if arch not in ALWAYS_WINDOWED_ARCHS else rng.randint(3, MAX_PROMPT)
    block_size = rng.choice([4, 8, 16, 32])
    min_blocks = -(-(MAX_PROMPT + MAX_OUTPUT) // block_size) + 1  # the longest request fits alone
    flags = ["--block-size", str(block_size), "--num-kv-blocks", str(rng.randint(min_blocks, 3 * min_blocks)),
             "--max-num-batched-tokens", str(rng.randint(16, 96)), "--max-num-seqs", str(rng.randint(2, 8))]
    flags += ["--dtype", "float32"]
    return Case(arch, rng.randrange(1000), config, flags)


def draw_case_for(rng: random.Random, tensor_parallel_size: int) -> Case:
    """A case the engine can shard over `tensor_parallel_size` ranks (redrawn until it can)."""
    while True:
        case = draw_case(rng)
        if tensor_parallel_size == 1:
            return case
        if case.arch not in UNSHARDED_ARCHS and case.config["num_attention_heads"] % tensor_parallel_size == 0:
            case.flags += ["--tensor-parallel-size", str(tensor_parallel_size)]
            return case


def write_requests(path: Path, rng: random.Random, count: int) -> list[tuple[str, list[int], int]]:
    requests = [(f"r{i}", [rng.randrange(3, 512) for _ in range(rng.randint(2, MAX_PROMPT))],
                 rng.randint(4, MAX_OUTPUT)) for i in range(count)]
    path.write_text("".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                                        "body": {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                                 "ignore_eos": True}}) + "\n"
                            for custom_id, prompt, max_tokens in requests))
    return requests


def run_aqueduct(model: Path, requests_file: Path, flags: list[str]) -> dict[str, list[int]]:
    output = requests_file.with_suffix(".out.jsonl")
    aqueduct = Path(sys.executable).parent / "aqueduct"  # the console script beside this interpreter
    subprocess.run([str(aqueduct), "batch", "-i", str(requests_file), "-o", str(output),
                    "--model", str(model), "--no-progress", *flags], check=True, capture_output=True)
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    return {line["custom_id"]: line["response"]["body"]["choices"][0]["token_ids"] for line in lines}


def first_divergence_margin(hf: torch.nn.Module, prompt: list[int], max_tokens: int,
                            ours: list[int]) -> float | None:
    """None if HF generates `ours`; else HF's top-2 logit margin where the two first differ."""
    with torch.no_grad():
        generated = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                eos_token_id=None, pad_token_id=0, output_scores=True,
                                return_dict_in_generate=True)
    theirs = generated.sequences[0, len(prompt):].tolist()
    if ours == theirs:
        return None
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                    min(len(ours), len(theirs)))
    if position >= len(generated.scores):
        return float("inf")  # a length mismatch is never a near-tie
    top2 = torch.topk(generated.scores[position][0], 2).values
    return float(top2[0] - top2[1])


def check_case(case: Case, workdir: Path, rng: random.Random, num_requests: int) -> int:
    """Print the case's result; returns how many divergences were not near-ties."""
    model = make_tiny_hf_model(case.arch, workdir / "model", seed=case.seed, **case.config)
    requests = write_requests(workdir / "requests.jsonl", rng, num_requests)
    ours = run_aqueduct(model, workdir / "requests.jsonl", case.flags)
    hf = AutoModelForCausalLM.from_pretrained(model).float().eval()
    equal = failures = 0
    for custom_id, prompt, max_tokens in requests:
        margin = first_divergence_margin(hf, prompt, max_tokens, ours[custom_id])
        if margin is None:
            equal += 1
            continue
        failures += margin >= NEAR_TIE_MARGIN
        verdict = "near-tie" if margin < NEAR_TIE_MARGIN else "NOT A NEAR-TIE"
        print(f"  {custom_id}: diverges; HF top-2 margin {margin:.2e} ({verdict})")
    print(f"{case.arch} weights seed {case.seed} {case.config} {' '.join(case.flags)}: "
          f"{equal}/{len(requests)} equal")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--requests", type=int, default=18, help="requests per case")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    for index in range(args.cases):
        with tempfile.TemporaryDirectory(prefix=f"fidelity-{index}-") as workdir:
            failures += check_case(draw_case_for(rng, args.tensor_parallel_size), Path(workdir), rng, args.requests)
    print("FAIL" if failures else "OK: every divergence (if any) is at a near-tie")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
