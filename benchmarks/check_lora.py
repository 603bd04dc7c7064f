"""Multi-LoRA greedy output vs PEFT on base models, adapters and mixes no test has seen.

Each case draws from --seed a family (llama, qwen2, qwen3, mistral, gemma2, in a shuffled
cycle), a tiny random base model (head layout, sizes, weight seed), 2-4 PEFT adapters (rank 1-32,
alpha, rslora on/off, a random subset of q/k/v/o/gate/up/down_proj, random non-zero A and B) and
tight engine limits (a small token budget so prefills are chunked, few KV blocks so requests are
preempted, sometimes fewer adapter slots than adapters). A batch of mixed greedy requests (the base and every adapter,
prompts sharing a prefix so prefix-cache hits occur) runs through one engine; each request is
compared with `PeftModel.from_pretrained(base, dir)` generating that request alone. A divergence
passes only at a near-tie of PEFT's logits (top-2 margin < 1e-3). Exit status 1 otherwise.

    python benchmarks/check_lora.py --seed 101 --cases 3
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.config import LoRAConfig
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import NEAR_TIE_MARGIN, hf_greedy, make_engine
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ALL_PROJECTIONS, make_peft_adapter, peft_model, run_with_adapters

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2")
SHARED_PREFIX, MAX_TAIL, MAX_OUTPUT = 24, 40, 24


@dataclass
class Case:
    family: str
    seed: int
    config: dict[str, Any]
    adapters: dict[str, dict[str, Any]]  # name -> LoraConfig arguments
    max_loras: int
    engine: dict[str, int]  # make_engine limits


def draw_base(rng: random.Random, family: str) -> dict[str, Any]:
    head_dim = rng.choice([16, 32])
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * rng.choice([1, 2])
    config: dict[str, Any] = {"num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
                              "num_hidden_layers": rng.randint(1, 3), "intermediate_size": rng.choice([96, 160])}
    if family in ("qwen3", "gemma2"):  # head_dim is a config field, free of hidden_size
        config.update(head_dim=head_dim, hidden_size=rng.choice([64, 96]))
    else:
        config["hidden_size"] = num_heads * head_dim
    if family == "mistral":
        config["sliding_window"] = rng.randint(8, SHARED_PREFIX + MAX_TAIL)
    if family == "gemma2":
        config["num_hidden_layers"] = 2 * rng.randint(1, 2)  # both layer types
        config["query_pre_attn_scalar"] = head_dim
    return config


def draw_adapter(rng: random.Random) -> dict[str, Any]:
    rank = rng.randint(1, 32)
    return {"r": rank, "lora_alpha": rng.choice([1, 2, 4, 8, 16, 32, 64]), "use_rslora": rng.random() < 0.5,
            "target_modules": sorted(rng.sample(ALL_PROJECTIONS, rng.randint(1, len(ALL_PROJECTIONS))))}


def draw_case(rng: random.Random, family: str) -> Case:
    adapters = {f"a{index}": draw_adapter(rng) for index in range(rng.randint(2, 4))}
    block_size = rng.choice([4, 8, 16])
    min_blocks = -(-(SHARED_PREFIX + MAX_TAIL + MAX_OUTPUT) // block_size) + 1  # the longest fits alone
    engine = {"block_size": block_size, "num_kv_blocks": rng.randint(min_blocks, 2 * min_blocks),
              "max_num_batched_tokens": rng.randint(16, 64), "max_num_seqs": rng.randint(3, 8)}
    return Case(family, rng.randrange(1000), draw_base(rng, family), adapters,
                rng.randint(1, len(adapters)), engine)


def draw_requests(rng: random.Random, names: list[str | None], count: int) -> dict:
    """id -> (prompt, params, adapter): every name at least once; half the prompts share a prefix."""
    shared = [rng.randrange(3, 512) for _ in range(SHARED_PREFIX)]
    lora_of = names + [rng.choice(names) for _ in range(count - len(names))]
    rng.shuffle(lora_of)
    requests = {}
    for index, lora in enumerate(lora_of):
        tail = [rng.randrange(3, 512) for _ in range(rng.randint(1, MAX_TAIL))]
        prompt = shared + tail if rng.random() < 0.6 else tail
        params = SamplingParams(max_tokens=rng.randint(4, MAX_OUTPUT), temperature=0.0, ignore_eos=True)
        requests[f"r{index}"] = (prompt, params, lora)
    return requests


def divergence_margin(ours: list[int], theirs: list[int], logits: torch.Tensor) -> float | None:
    """None if equal; else PEFT's top-2 logit margin at the first difference (inf for a length mismatch)."""
    if ours == theirs:
        return None
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if position is None:
        return float("inf")
    top2 = torch.topk(logits[position], 2).values
    return float(top2[0] - top2[1])


def check_case(case: Case, workdir: Path, rng: random.Random, num_requests: int) -> int:
    """Print the case's line; returns how many divergences were not near-ties."""
    base = make_tiny_hf_model(case.family, workdir / "base", seed=case.seed, **case.config)
    paths = {name: make_peft_adapter(base, workdir / name, seed=case.seed + index + 1, **spec)
             for index, (name, spec) in enumerate(case.adapters.items())}
    requests = draw_requests(rng, [None, *paths], num_requests)
    lora = LoRAConfig(modules=tuple((name, str(path)) for name, path in paths.items()), max_loras=case.max_loras)
    engine = make_engine(base, lora=lora, **case.engine)
    results = run_with_adapters(engine, requests)
    models = {None: AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()}
    models.update({name: peft_model(base, path) for name, path in paths.items()})
    equal = failures = changed = 0
    for request_id, (prompt, params, name) in requests.items():
        theirs, logits = hf_greedy(models[name], prompt, params.max_tokens)
        if name is not None:  # the adapter must matter: count the requests where it changes the base's tokens
            changed += theirs != hf_greedy(models[None], prompt, params.max_tokens)[0]
        margin = divergence_margin(results[request_id]["tokens"], theirs, logits)
        if margin is None:
            equal += 1
            continue
        failures += margin >= NEAR_TIE_MARGIN
        verdict = "near-tie" if margin < NEAR_TIE_MARGIN else "NOT A NEAR-TIE"
        print(f"  {request_id} ({name or 'base'}): diverges; PEFT top-2 margin {margin:.2e} ({verdict})")
    adapted = sum(name is not None for _, _, name in requests.values())
    cached = sum(results[r]["usage"].cached_tokens for r in requests)
    adapters = " ".join(f"{name}(r{s['r']} a{s['lora_alpha']}{' rs' if s['use_rslora'] else ''} "
                        f"{'/'.join(m.removesuffix('_proj') for m in s['target_modules'])})"
                        for name, s in case.adapters.items())
    print(f"{case.family} seed {case.seed} {case.config} | {adapters} | max_loras {case.max_loras} "
          f"{case.engine} | preemptions {engine.scheduler.num_preemptions}, cached tokens {cached}: "
          f"{equal}/{len(requests)} equal, adapter changed the tokens in {changed}/{adapted} "
          f"{'FAIL' if failures else 'OK'}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--requests", type=int, default=12, help="requests per case")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    families = rng.sample(FAMILIES, len(FAMILIES))  # a shuffled cycle: consecutive cases differ in family
    failures = 0
    for index in range(args.cases):
        with tempfile.TemporaryDirectory(prefix=f"lora-check-{index}-") as workdir:
            case = draw_case(rng, families[index % len(families)])
            failures += check_case(case, Path(workdir), rng, args.requests)
    print("FAIL" if failures else "OK: every divergence (if any) is at a near-tie")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
