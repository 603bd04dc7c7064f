"""Tiny PEFT LoRA adapters for tests, made with peft itself on the tiny HF models (tests/support/hf_models.py).

The A and B matrices are re-drawn (PEFT initialises B to zero, which would test nothing) so that an
adapter changes the greedy continuation of most prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name -> LoraConfig arguments: different ranks, alphas and target sets, rslora on one.
ADAPTER_SPECS: dict[str, dict[str, Any]] = {
    "attn8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "mlp4": {"r": 4, "lora_alpha": 8, "target_modules": ["gate_proj", "down_proj", "o_proj"]},
    "all16rs": {"r": 16, "lora_alpha": 8, "target_modules": ALL_PROJECTIONS, "use_rslora": True},
    "kv2": {"r": 2, "lora_alpha": 4, "target_modules": ["k_proj", "up_proj"]},
    "qo6": {"r": 6, "lora_alpha": 3, "target_modules": ["q_proj", "o_proj", "down_proj"]},
}


def make_peft_adapter(base_dir: Path, out_dir: Path, *, seed: int, strength: float = 1.0, **config: Any) -> Path:
    """Save a PEFT LoRA adapter for the model in base_dir to out_dir, with random non-zero A and B."""
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:  # [r, in]
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[1] ** -0.5)
            elif "lora_B" in name:  # [out, r]
                param.copy_(torch.randn(param.shape, generator=generator) * strength * param.shape[1] ** -0.5)
    model.save_pretrained(out_dir)
    return out_dir


def make_adapters(base_dir: Path, root: Path, names: list[str]) -> dict[str, Path]:
    return {name: make_peft_adapter(base_dir, root / name, seed=index + 1, **ADAPTER_SPECS[name])
            for index, name in enumerate(names)}


def peft_model(base_dir: Path, adapter_dir: Path) -> torch.nn.Module:
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()


def run_with_adapters(engine: Any, requests: dict) -> dict[str, dict]:
    """requests: id -> (prompt ids, params, adapter name or None); per id: tokens, logprobs, usage."""
    results = {request_id: {"tokens": [], "logprobs": [], "usage": None} for request_id in requests}
    for request_id, (prompt, params, lora) in requests.items():
        engine.add_request(request_id, prompt, params, lora=lora)
    while engine.has_unfinished:
        for delta in engine.step():
            result = results[delta.request_id]
            for choice in delta.choices:
                result["tokens"] += choice.token_ids
                result["logprobs"] += choice.logprobs or []
            if delta.usage is not None:
                result["usage"] = delta.usage
    return results
