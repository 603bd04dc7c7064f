"""Phi-3 configs the engine refuses (clearly), and the checkpoint layouts Mixtral loads.

Fidelity against HF for both families is in test_fidelity.py and test_model_forward.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from pipeline.model.models import family_of
from tests.pipeline.model.family_checks import load_float32
from tests.support.hf_models import make_tiny_hf_model

_PHI3: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
    "rope_theta": 10000.0, "sliding_window": 2047,
}
_LONGROPE = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 256}


@pytest.mark.parametrize("rope", [
    {"rope_scaling": {"type": "su", **_LONGROPE}},
    {"rope_scaling": {"type": "longrope", **_LONGROPE}},
    {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, **_LONGROPE}},
    {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
])
def test_phi3_rope_scaling_is_refused_naming_its_type(rope: dict[str, Any]) -> None:
    config = {**_PHI3, **rope}
    rope_type = next(iter(rope.values())).get("rope_type") or next(iter(rope.values()))["type"]
    with pytest.raises(ValueError, match=f"Phi-3 rope type '{rope_type}' is not supported"):
        family_of("Phi3ForCausalLM").attention_shape(config)


@pytest.mark.parametrize("rope", [
    {"partial_rotary_factor": 0.75},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
])
def test_phi3_partial_rotary_factor_is_refused(rope: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be 1\.0"):
        family_of("Phi3ForCausalLM").attention_shape({**_PHI3, **rope})


def test_phi3_uses_its_window_on_every_layer_and_never_biases() -> None:
    phi3 = family_of("Phi3ForCausalLM")
    config = {**_PHI3, "attention_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                     "partial_rotary_factor": 1.0}}
    assert phi3.attention_shape(config).layer_windows == (2047, 2047)
    decoder = phi3.decoder_config(config, max_positions=8)
    assert not (decoder.qkv_bias or decoder.o_bias or decoder.mlp_bias)


@pytest.fixture(scope="module")
def mixtral_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model("mixtral", tmp_path_factory.mktemp("mixtral"))


def _copy_with_weights(source: Path, target: Path, weights: dict[str, torch.Tensor]) -> Path:
    shutil.copytree(source, target)
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_mixtral_checkpoints_store_one_tensor_per_expert(mixtral_path: Path) -> None:
    names = load_file(mixtral_path / "model.safetensors").keys()
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in names
    assert json.loads((mixtral_path / "config.json").read_text())["num_local_experts"] == 4


def test_mixtral_fused_expert_names_load_the_same_weights(mixtral_path: Path, tmp_path: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(mixtral_path, dtype=torch.float32)
    fused = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused  # HF v5's in-memory names
    fused_path = _copy_with_weights(mixtral_path, tmp_path / "fused", fused)
    per_expert, from_fused = load_float32(mixtral_path).state_dict(), load_float32(fused_path).state_dict()
    assert per_expert.keys() == from_fused.keys()
    for name, tensor in per_expert.items():
        assert torch.equal(tensor, from_fused[name]), name
    torch.testing.assert_close(per_expert["model.layers.0.mlp.experts.gate_up_proj"],
                               fused["model.layers.0.mlp.experts.gate_up_proj"], rtol=0, atol=0)


def test_mixtral_missing_expert_weight_is_an_error(mixtral_path: Path, tmp_path: Path) -> None:
    weights = load_file(mixtral_path / "model.safetensors")
    del weights["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    path = _copy_with_weights(mixtral_path, tmp_path / "m", weights)
    with pytest.raises(ValueError, match=r"missing weights: \['model.layers.1.mlp.experts.gate_up_proj'\]"):
        load_float32(path)


def test_mixtral_expert_beyond_the_config_is_an_error(mixtral_path: Path, tmp_path: Path) -> None:
    weights = load_file(mixtral_path / "model.safetensors")
    weights["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = torch.zeros(128, 64)
    path = _copy_with_weights(mixtral_path, tmp_path / "m", weights)
    with pytest.raises(ValueError, match=r"unexpected weight in checkpoint: .*experts\.4\.w1\.weight"):
        load_float32(path)


def test_wrongly_shaped_weight_is_an_error(mixtral_path: Path, tmp_path: Path) -> None:
    weights = load_file(mixtral_path / "model.safetensors")
    weights["model.layers.0.block_sparse_moe.experts.0.w2.weight"] = torch.zeros(128, 64)  # transposed
    path = _copy_with_weights(mixtral_path, tmp_path / "m", weights)
    with pytest.raises(ValueError, match=r"experts.0.w2.weight has shape \(128, 64\), expected \(64, 128\)"):
        load_float32(path)
