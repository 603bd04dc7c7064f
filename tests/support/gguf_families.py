"""The newer families' GGUF files, written as llama.cpp's converters write them (tests/support/gguf_files.py
writes the older ones and calls this for these).

Each family's metadata and tensor changes follow its converter class in llama.cpp
(conversion/base.py TextModel.set_gguf_parameters, then conversion/{gemma,qwen,gpt_oss,glm,olmo,
granite,llama,deepseek,llama4}.py); tensor names come from gguf-py's own map
(gguf.get_tensor_name_map, what the converters call), not from pipeline/loading/gguf, so a
convention wrong on one side shows up as a mismatch. Where a converter reads a key the tiny
configs lack (a released config.json's `scoring_func`, Gemma 4's `global_head_dim` that transformers 5
holds as `per_layer_config`), the comment says what is taken instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np

Tensors = dict[str, np.ndarray]
_ARCH_BY_NAME = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


@dataclass(frozen=True)
class Family:
    gguf_arch: str  # general.architecture
    hparams: Callable[[gguf.GGUFWriter, dict[str, Any]], None]  # what set_gguf_parameters adds to the base's
    tensors: Callable[[dict[str, Any], Tensors], Tensors] = lambda _config, weights: weights  # modify_tensors
    permute_qk: bool = False  # LlamaModel.permute (undo_permute)
    norm_shift: float = 0.0  # Gemma: + 1 on every `norm.weight`
    base_head_dim: bool = True  # the base writes key/value_length from head_dim (Granite pops it first)
    kv_heads: Callable[[dict[str, Any]], int] = field(default=lambda config: config["num_key_value_heads"])
    # generate_extra_tensors: GGUF name -> array (Gemma 4's rope_freqs)
    extra_tensors: Callable[[dict[str, Any]], Tensors] = lambda _config: {}


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def write_base_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], family: Family) -> None:
    """conversion/base.py TextModel.set_gguf_parameters."""
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(family.kv_heads(config))
    rope = _rope(config)
    full = rope.get("full_attention", rope)
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    elif full.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        if "beta_fast" in full:
            writer.add_rope_scaling_yarn_beta_fast(full["beta_fast"])
        if "beta_slow" in full:
            writer.add_rope_scaling_yarn_beta_slow(full["beta_slow"])
    writer.add_rope_freq_base(full.get("rope_theta", config.get("rope_theta", 10000.0)))
    if "sliding_attention" in rope:
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if (experts := config.get("num_local_experts") or config.get("num_experts")) is not None:
        writer.add_expert_count(experts)
    if (used := config.get("num_experts_per_tok")) is not None:
        writer.add_expert_used_count(used)
    if config.get("n_group") is not None:
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
    if config.get("head_dim") is not None and family.base_head_dim:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])


def _gemma3(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if config.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(config["sliding_window"])


def _gemma4_global(config: dict[str, Any]) -> tuple[int, int | None]:
    """(global_head_dim, num_global_key_value_heads), the keys Gemma4Model reads; transformers 5 holds
    them as per_layer_config, which the converter predates."""
    per_layer = config.get("per_layer_config") or {}
    full = next((per_layer[str(index)] for index, kind in enumerate(config["layer_types"])
                 if kind == "full_attention" and str(index) in per_layer), {})
    return full.get("head_dim", config.get("global_head_dim", 512)), full.get(
        "num_key_value_heads", config.get("num_global_key_value_heads"))


def _gemma4(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """Gemma4Model.set_gguf_parameters (after Gemma 3's): per-layer kinds, sizes and KV heads."""
    _gemma3(writer, config)
    sliding = [kind == "sliding_attention" for kind in config["layer_types"]]
    head_dim, (full_dim, full_kv) = config["head_dim"], _gemma4_global(config)
    layers, shared = config["num_hidden_layers"], config["num_kv_shared_layers"]
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(config.get("hidden_size_per_layer_input") or 0)
    writer.add_sliding_window_pattern(sliding)
    writer.add_key_length(full_dim)
    writer.add_value_length(full_dim)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    if config.get("use_double_wide_mlp"):
        width = config["intermediate_size"]
        writer.add_feed_forward_length([width if index < layers - shared else 2 * width for index in range(layers)])
    if full_kv is not None:
        writer.add_head_count_kv([config["num_key_value_heads"] if is_sliding else full_kv for is_sliding in sliding])
    writer.add_rope_dimension_count(full_dim)
    writer.add_rope_dimension_count_swa(int(head_dim * config.get("partial_rotary_factor", 1.0)))


def _gemma4_tensors(_config: dict[str, Any], weights: Tensors) -> Tensors:
    """filter_tensors: layer_scalar gains `.weight`."""
    return {f"{name}.weight" if name.endswith("layer_scalar") else name: array for name, array in weights.items()}


def _gemma4_rope_freqs(config: dict[str, Any]) -> Tensors:
    """generate_extra_tensors: proportional rope as divisors, 1 for the turning pairs, 1e30 for the rest."""
    full_dim, _ = _gemma4_global(config)
    turning = int(full_dim * _rope(config)["full_attention"]["partial_rotary_factor"] / 2)
    return {"rope_freqs.weight": np.array([1.0] * turning + [1e30] * (full_dim // 2 - turning), dtype=np.float32)}


def _qwen_moe(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config.get("shared_expert_intermediate_size") is not None:
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _stack_experts(config: dict[str, Any], weights: Tensors) -> Tensors:
    """Qwen2MoeModel / DeepseekV2Model.modify_tensors: mlp.experts.E.w_proj.weight -> mlp.experts.w_proj.weight
    [experts, out, in]."""
    count = config.get("num_local_experts") or config.get("num_experts") or config["n_routed_experts"]
    stacked = {name: array for name, array in weights.items() if ".mlp.experts." not in name}
    for name in weights:
        prefix, marker, rest = name.partition(".mlp.experts.0.")
        if marker:
            stacked[f"{prefix}.mlp.experts.{rest}"] = np.stack(
                [weights[f"{prefix}.mlp.experts.{expert}.{rest}"] for expert in range(count)])
    return stacked


def _gpt_oss(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])


def _gpt_oss_tensors(_config: dict[str, Any], weights: Tensors) -> Tensors:
    """GptOssModel.modify_tensors for an unquantized checkpoint: sinks get `.weight`; gate_up_proj
    [E, H, 2I] is transposed and split by every other row; down_proj [E, I, H] transposed."""
    out: Tensors = {}
    for name, array in weights.items():
        if name.endswith(".sinks"):
            out[f"{name}.weight"] = array
        elif name.endswith("gate_up_proj_bias"):
            out[name.replace("gate_up_proj_bias", "gate_proj.bias")] = array[..., ::2]
            out[name.replace("gate_up_proj_bias", "up_proj.bias")] = array[..., 1::2]
        elif name.endswith("gate_up_proj"):
            transposed = array.swapaxes(-1, -2)
            out[name.replace("gate_up_proj", "gate_proj.weight")] = transposed[:, ::2, :]
            out[name.replace("gate_up_proj", "up_proj.weight")] = transposed[:, 1::2, :]
        elif name.endswith("down_proj_bias"):
            out[name.replace("down_proj_bias", "down_proj.bias")] = array
        elif name.endswith("down_proj"):
            out[f"{name}.weight"] = array.swapaxes(-1, -2)
        else:
            out[name] = array
    return out


def _glm4(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_rope_dimension_count(int(head_dim * _rope(config).get("partial_rotary_factor", 0.5)))


def _llama(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """LlamaModel.set_gguf_parameters (SmolLM3)."""
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _granite(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    _llama(writer, {**config, "head_dim": None})  # GraniteModel pops head_dim
    for add, key in ((writer.add_attention_scale, "attention_multiplier"), (writer.add_embedding_scale,
                     "embedding_multiplier"), (writer.add_residual_scale, "residual_multiplier"),
                     (writer.add_logit_scale, "logits_scaling")):
        if config.get(key):
            add(config[key])


def _deepseek(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """DeepseekV2Model.set_gguf_parameters: MLA as MQA over the latent. The tiny V3 config has no
    `scoring_func` (transformers' DeepseekV3Config drops it); the released config.json says sigmoid."""
    rank, rope_dims = config["kv_lora_rank"], config["qk_rope_head_dim"]
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_vocab_size(config["vocab_size"])
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_key_length(rank + rope_dims)
    writer.add_value_length(rank)
    writer.add_key_length_mla(config["qk_nope_head_dim"] + rope_dims)
    writer.add_value_length_mla(config["v_head_dim"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    if config["architectures"][0] == "DeepseekV3ForCausalLM":
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_rope_dimension_count(rope_dims)
    if (mscale_all_dim := _rope(config).get("mscale_all_dim")) is not None:
        writer.add_rope_scaling_yarn_log_mul(0.1 * mscale_all_dim)


def _deepseek_before_mla_split(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """DeepseekV2Model before mid-2025 (the V2-Lite and early R1 files): per-head K/V sizes, all heads."""
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_vocab_size(config["vocab_size"])
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(config["kv_lora_rank"])
    writer.add_key_length(config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    writer.add_value_length(config["v_head_dim"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_rope_dimension_count(config["qk_rope_head_dim"])


def _deepseek_tensors(config: dict[str, Any], weights: Tensors) -> Tensors:
    """Experts stacked; kv_b_proj split per head into k_b (transposed) and v_b; the routing bias renamed."""
    heads, nope, v_dim = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
    out: Tensors = {}
    for name, array in _stack_experts(config, weights).items():
        if name.endswith("kv_b_proj.weight"):
            per_head = array.reshape(heads, nope + v_dim, array.shape[-1])
            out[name.replace("kv_b_proj", "k_b_proj")] = per_head[:, :nope, :].swapaxes(1, 2)
            out[name.replace("kv_b_proj", "v_b_proj")] = per_head[:, nope:, :]
        else:
            out[name.replace("e_score_correction_bias", "e_score_correction.bias")] = array
    return out


def _llama4(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """Llama4Model: feed_forward_length is intermediate_size_mlp (write_base_hparams is given that)."""
    _llama(writer, config)
    writer.add_interleave_moe_layer_step(config["interleave_moe_layer_step"])
    writer.add_expert_feed_forward_length(config["intermediate_size_moe"])


def _llama4_tensors(_config: dict[str, Any], weights: Tensors) -> Tensors:
    """gate_up_proj [E, H, 2I] transposed and cut in halves (gate first); down_proj [E, I, H] transposed."""
    out: Tensors = {}
    for name, array in weights.items():
        if name.endswith("gate_up_proj"):
            gate, up = np.split(array.swapaxes(-1, -2), 2, axis=-2)
            out[name.replace("gate_up_proj", "gate_proj.weight")] = gate
            out[name.replace("gate_up_proj", "up_proj.weight")] = up
        elif name.endswith("experts.down_proj"):
            out[f"{name}.weight"] = array.swapaxes(-1, -2)
        else:
            out[name] = array
    return out


FAMILIES: dict[str, Family] = {
    "Gemma3ForCausalLM": Family("gemma3", _gemma3, norm_shift=1.0),
    "Gemma4ForCausalLM": Family("gemma4", _gemma4, _gemma4_tensors, extra_tensors=_gemma4_rope_freqs),
    "Qwen3MoeForCausalLM": Family("qwen3moe", _qwen_moe, _stack_experts),
    "Qwen2MoeForCausalLM": Family("qwen2moe", _qwen_moe, _stack_experts),
    "GptOssForCausalLM": Family("gpt-oss", _gpt_oss, _gpt_oss_tensors),
    "Glm4ForCausalLM": Family("glm4", _glm4),
    "Olmo2ForCausalLM": Family("olmo2", lambda _writer, _config: None),
    "GraniteForCausalLM": Family("granite", _granite, permute_qk=True, base_head_dim=False),
    "SmolLM3ForCausalLM": Family("smollm3", _llama, permute_qk=True),
    "DeepseekV2ForCausalLM": Family("deepseek2", _deepseek, _deepseek_tensors, base_head_dim=False,
                                    kv_heads=lambda _config: 1),
    "DeepseekV3ForCausalLM": Family("deepseek2", _deepseek, _deepseek_tensors, base_head_dim=False,
                                    kv_heads=lambda _config: 1),
    "Llama4ForCausalLM": Family("llama4", _llama4, _llama4_tensors),
}
# A DeepSeek-V2 file as converters wrote it before they split kv_b: write_gguf(..., family=...).
DEEPSEEK_BEFORE_MLA_SPLIT = Family("deepseek2", _deepseek_before_mla_split, _stack_experts, base_head_dim=False)


def hparams_config(config: dict[str, Any]) -> dict[str, Any]:
    """The hparams a converter reads: Llama4Model swaps intermediate_size to the dense one."""
    if config["architectures"][0] == "Llama4ForCausalLM":
        return {**config, "intermediate_size_moe": config["intermediate_size"],
                "intermediate_size": config["intermediate_size_mlp"]}
    return config


def family_tensors(config: dict[str, Any], weights: Tensors, permute: Callable[[np.ndarray, int], np.ndarray],
                   family: Family) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in HF dimension order) for every tensor the family's file holds."""
    names = gguf.get_tensor_name_map(_ARCH_BY_NAME[family.gguf_arch], config["num_hidden_layers"])
    for hf_name, array in family.tensors(config, weights).items():
        array = array.astype(np.float32)
        if family.permute_qk and ".self_attn.q_proj." in hf_name:
            array = permute(array, config["num_attention_heads"])
        elif family.permute_qk and ".self_attn.k_proj." in hf_name:
            array = permute(array, config["num_key_value_heads"])
        elif family.norm_shift and hf_name.endswith("norm.weight"):
            array = array + np.float32(family.norm_shift)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"gguf-py's {family.gguf_arch} map has no name for {hf_name}")
        yield gguf_name, array
    yield from family.extra_tensors(config).items()


def round_as_filed(config: dict[str, Any], hf_name: str, array: np.ndarray,
                   round_rows: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`array` after a trip through the file's type, rounded along the rows the file holds it in:
    the experts gpt-oss's and Llama 4's converters transpose, and DeepSeek's kv_b, whose k part is
    filed transposed per head (k_b); every other tensor's rows are the file's."""
    architecture = config["architectures"][0]
    transposed_experts = architecture in ("GptOssForCausalLM", "Llama4ForCausalLM") and hf_name.endswith(
        ("experts.gate_up_proj", "experts.down_proj"))
    if transposed_experts:
        return round_rows(array.swapaxes(1, 2)).swapaxes(1, 2)
    if architecture.startswith("Deepseek") and hf_name.endswith("kv_b_proj.weight"):
        nope, rank = config["qk_nope_head_dim"], array.shape[-1]
        per_head = array.reshape(config["num_attention_heads"], -1, rank)
        k_part = round_rows(per_head[:, :nope].swapaxes(1, 2)).swapaxes(1, 2)
        return np.concatenate([k_part, round_rows(per_head[:, nope:])], axis=1).reshape(array.shape)
    return round_rows(array)
