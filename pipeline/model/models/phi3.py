"""Phi-3 (Phi3ForCausalLM): the Llama decoder with fused projections stored as such.

Phi-3 checkpoints hold `self_attn.qkv_proj` (rows [q; k; v]) and `mlp.gate_up_proj` (rows
[gate; up]), exactly the fused parameters of llama.py, so they load with no renaming. HF's Phi-3
has no biases, whatever `attention_bias` says; every layer uses `sliding_window` when it is set
(Phi-3-mini-4k: 2047). pad_token_id is eos (32000); it only matters to HF's batched generate, the
engine never pads a prompt. The eos ids to stop on come from generation_config.json
(Phi-3-mini-instruct: 32000, 32001, 32007).

Rope: only the default rotary embedding. LongRoPE (`su`/`longrope`, the 128k and Phi-3.5/Phi-4-mini
checkpoints) is refused: HF picks its short or long factors per forward call from the largest
position in the whole batch, so a sequence's keys depend on what it was batched with and on the
call that computed them, which a paged cache that keeps keys across steps cannot reproduce.
A partial rotary factor below 1 (Phi-4-mini) is refused too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig, LlamaForCausalLM


def check_phi3_config(config: dict[str, Any]) -> None:
    """ValueError naming the setting when the config asks for something this module does not implement."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"Phi-3 rope type {rope_type!r} is not supported (only 'default'); LongRoPE ('su', "
                         "'longrope') switches factors per batch in HF and cannot be matched token for token")
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if float(factor) != 1.0:
        raise ValueError(f"Phi-3 partial_rotary_factor must be 1.0, got {factor}")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Phi-3 hidden_act must be 'silu', got {config['hidden_act']!r}")


def decoder_config(config: dict[str, Any], max_positions: int) -> DecoderConfig:
    check_phi3_config(config)
    return replace(llama.decoder_config(config, max_positions), qkv_bias=False, o_bias=False, mlp_bias=False)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    check_phi3_config(config)
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> LlamaForCausalLM:
    return LlamaForCausalLM(decoder_config(config, max_positions), backend)
