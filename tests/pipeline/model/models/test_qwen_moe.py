"""Qwen3-MoE and Qwen2-MoE beyond float32 fidelity: the sparse-layer plan (against transformers' own
layers), the checkpoint layouts that load, the bfloat16 rounding of the routing weights, and LoRA and
tensor parallelism refusing them.

Float32 logits, greedy tokens and logprobs against HF under chunked prefill, prefix caching and
preemption are in test_model_forward.py and tests/system/test_fidelity.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from pipeline.model.layers.moe import SharedExpertMoE, SparseMoE
from pipeline.model.loader import attention_shape, read_config
from pipeline.model.lora import lora_model_shapes
from pipeline.model.models.qwen2_moe import qwen2_moe_config
from pipeline.model.models.qwen3_moe import qwen3_moe_config
from pipeline.model.parallel.sharding import shard_model
from tests.pipeline.model.family_checks import load_float32
from tests.support.hf_models import make_tiny_hf_model

FAMILIES = ["qwen3_moe", "qwen2_moe"]
_A_SPARSE_LAYER = {"qwen3_moe": 2, "qwen2_moe": 1}  # tests/support/hf_models.py's plans
_SMALL: dict[str, Any] = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 6,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                          "shared_expert_intermediate_size": 24}
_HF_BLOCKS = {"Qwen3Moe": Qwen3MoeSparseMoeBlock, "Qwen2Moe": Qwen2MoeSparseMoeBlock}


@pytest.fixture(scope="module", params=FAMILIES)
def family_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, make_tiny_hf_model(request.param, tmp_path_factory.mktemp(request.param))


# --- settings from config.json ---------------------------------------------------------------------

@pytest.mark.parametrize("plan", [{}, {"decoder_sparse_step": 2}, {"decoder_sparse_step": 3, "mlp_only_layers": [5]},
                                  {"mlp_only_layers": [0, 3]}, {"num_experts": 0}])
@pytest.mark.parametrize("arch", ["Qwen3Moe", "Qwen2Moe"])
def test_sparse_layers_are_transformers_sparse_layers(arch: str, plan: dict[str, Any]) -> None:
    hf_config = getattr(transformers, f"{arch}Config")(**{**_SMALL, **plan})
    hf = getattr(transformers, f"{arch}ForCausalLM")(hf_config)
    theirs = tuple(isinstance(layer.mlp, _HF_BLOCKS[arch]) for layer in hf.model.layers)
    config = {**hf_config.to_dict(), "architectures": [f"{arch}ForCausalLM"]}
    parse = qwen3_moe_config if arch == "Qwen3Moe" else qwen2_moe_config
    assert parse(config, max_positions=8).sparse_layers == theirs


def test_attention_flags_follow_each_family() -> None:
    base = {**_SMALL, "head_dim": 32}
    qwen3 = qwen3_moe_config({**base, "architectures": ["Qwen3MoeForCausalLM"]}, max_positions=8)
    assert qwen3.qk_norm and not (qwen3.qkv_bias or qwen3.o_bias) and qwen3.head_dim == 32
    assert not qwen3.norm_topk_prob  # Qwen3MoeConfig's default
    qwen2 = qwen2_moe_config({**base, "architectures": ["Qwen2MoeForCausalLM"]}, max_positions=8)
    assert qwen2.qkv_bias and not (qwen2.o_bias or qwen2.qk_norm)  # qkv_bias defaults to True
    no_bias = qwen2_moe_config({**base, "qkv_bias": False, "architectures": ["Qwen2MoeForCausalLM"]}, 8)
    assert not no_bias.qkv_bias


def test_qwen3_moe_expert_count_under_either_name() -> None:
    config = {key: value for key, value in _SMALL.items() if key != "num_experts"}
    parsed = qwen3_moe_config({**config, "num_local_experts": 4, "architectures": ["Qwen3MoeForCausalLM"]}, 8)
    assert parsed.num_experts == 4


def test_other_activations_are_refused() -> None:
    with pytest.raises(ValueError, match="Qwen2-MoE hidden_act must be 'silu', got 'gelu'"):
        qwen2_moe_config({**_SMALL, "hidden_act": "gelu", "architectures": ["Qwen2MoeForCausalLM"]}, 8)


# --- checkpoint layouts ----------------------------------------------------------------------------

def test_fused_expert_names_load_the_same_weights(family_path: tuple[str, Path], tmp_path: Path) -> None:
    arch, path = family_path
    layer = _A_SPARSE_LAYER[arch]
    assert f"model.layers.{layer}.mlp.experts.3.down_proj.weight" in load_file(path / "model.safetensors")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    fused = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    assert f"model.layers.{layer}.mlp.experts.gate_up_proj" in fused  # HF v5's in-memory names
    fused_path = shutil.copytree(path, tmp_path / "fused")
    save_file(fused, fused_path / "model.safetensors", metadata={"format": "pt"})
    per_expert, from_fused = load_float32(path).state_dict(), load_float32(fused_path).state_dict()
    assert per_expert.keys() == from_fused.keys()
    for name, tensor in per_expert.items():
        assert torch.equal(tensor, from_fused[name]), name


def test_expert_beyond_the_config_is_an_error(family_path: tuple[str, Path], tmp_path: Path) -> None:
    arch, path = family_path
    weights = load_file(path / "model.safetensors")
    experts = 8 if arch == "qwen3_moe" else 4
    weights[f"model.layers.{_A_SPARSE_LAYER[arch]}.mlp.experts.{experts}.gate_proj.weight"] = torch.zeros(32, 64)
    broken = shutil.copytree(path, tmp_path / "m")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"unexpected weight in checkpoint: .*experts\.{experts}\.gate_proj"):
        load_float32(broken)


# --- bfloat16 routing --------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize("arch", ["Qwen3Moe", "Qwen2Moe"])
def test_bfloat16_block_equals_transformers_block(arch: str, norm_topk_prob: bool) -> None:
    """The routing weights are rounded to bfloat16 before they scale the experts (Mixtral keeps float32)."""
    config = getattr(transformers, f"{arch}Config")(**_SMALL, norm_topk_prob=norm_topk_prob)
    config._experts_implementation = "grouped_mm"  # v5's default in a whole model
    generator = torch.Generator().manual_seed(0)
    hf = _HF_BLOCKS[arch](config)
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)
    hf = hf.to(torch.bfloat16)
    ours: SparseMoE
    if arch == "Qwen3Moe":
        ours = SparseMoE(64, 16, 4, 2, norm_topk_prob=norm_topk_prob, round_weights=True)
    else:
        ours = SharedExpertMoE(64, 16, 4, 2, 24, norm_topk_prob=norm_topk_prob)
    ours = ours.to(torch.bfloat16)
    state = {"gate.weight": hf.gate.weight, "experts.gate_up_proj": hf.experts.gate_up_proj,
             "experts.down_proj": hf.experts.down_proj}
    if arch == "Qwen2Moe":
        shared = hf.shared_expert
        state |= {"shared_expert.gate_up_proj.weight": torch.cat([shared.gate_proj.weight, shared.up_proj.weight]),
                  "shared_expert.down_proj.weight": shared.down_proj.weight,
                  "shared_expert_gate.weight": hf.shared_expert_gate.weight}
    ours.load_state_dict(state)
    x = torch.randn(1, 37, 64, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(ours(x[0]), hf(x)[0])


# --- LoRA and tensor parallelism -------------------------------------------------------------------

def test_lora_is_refused(family_path: tuple[str, Path]) -> None:
    with pytest.raises(ValueError, match="LoRA is not supported for mixture-of-experts models"):
        lora_model_shapes(load_float32(family_path[1]))


def test_tensor_parallel_is_refused_when_sharding(family_path: tuple[str, Path]) -> None:
    path = family_path[1]
    shape = attention_shape(read_config(path))
    with pytest.raises(ValueError, match="mixture-of-experts models run with tensor_parallel_size 1"):
        shard_model(load_float32(path), shape, rank=0, world=2)
