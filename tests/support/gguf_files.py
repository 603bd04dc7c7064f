"""Tiny GGUF files for tests, written the way llama.cpp's convert_hf_to_gguf.py writes them (the newer
families' metadata and tensor changes: tests/support/gguf_families.py).

From a tiny HF checkpoint (tests/support/hf_models.py): llama.cpp's tensor names, ggml's reversed shape
order (the writer's job), each family's metadata as its converter class writes it, the Q/K row
permutation of LlamaModel files (Llama, Mistral, Mixtral), Mixtral's experts stacked into one 3-D
tensor per kind, Gemma's norm weights stored as 1 + w, 2-D+ weights quantized (norms, biases and
MoE routers stay F32, as llama-quantize keeps them), llama3 rope scaling as a `rope_freqs` tensor,
Phi-3 LongRoPE as `rope_factors_long/short`, and a tokenizer (tests/support/gguf_tokenizers.py). Written
independently of pipeline/loading/gguf, so a convention wrong on one side shows up as a mismatch.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file, save_file

from tests.support import gguf_families, kquant_blocks
from tests.support.gguf_tokenizers import write_byte_level_tokenizer, write_gemma_tokenizer

_GGUF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "MixtralForCausalLM": "llama",
              "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2",
              "Phi3ForCausalLM": "phi3"}
_LLAMA_MODEL = {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"}  # convert_hf_to_gguf.py's LlamaModel
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3
    "block_sparse_moe.gate": "ffn_gate_inp",  # Mixtral's router, and its experts stacked by _stack_experts
    "block_sparse_moe.experts.w1": "ffn_gate_exps", "block_sparse_moe.experts.w3": "ffn_up_exps",
    "block_sparse_moe.experts.w2": "ffn_down_exps",
}
# Gemma 2's four norms per layer: its post_attention_layernorm is not llama.cpp's ffn_norm.
_GEMMA2_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm",
                       "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# MoE routers, which llama-quantize keeps in F32 (ffn_gate_inp, ffn_gate_inp_shexp), by HF name.
_ROUTERS = (".block_sparse_moe.gate.", ".mlp.gate.", ".mlp.router.", ".feed_forward.router.", ".shared_expert_gate.")


def gguf_name(hf_name: str, architecture: str = "LlamaForCausalLM") -> str:
    stem, kind = hf_name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, rest = stem.split(".", 3)
        names = _GEMMA2_LAYER_NAMES if architecture == "Gemma2ForCausalLM" else _LAYER_NAMES
        return f"blk.{layer}.{names[rest]}.{kind}"
    return f"{_GLOBAL_NAMES[stem]}.{kind}"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows (2, d/2) -> (d/2, 2)."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(hf_dir: Path, out_path: Path, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               *, architecture: str | None = None, add_bos_token: bool = True,
               record_sliding_window: bool = False,
               qtype_of: Callable[[str], gguf.GGMLQuantizationType] | None = None,
               family: gguf_families.Family | None = None) -> Path:
    """`hf_dir` (a tests/support/hf_models.py checkpoint) as a GGUF file at `out_path`.

    qtype_of: each quantized tensor's type by its GGUF name (a Q4_K_M-like mix), instead of `qtype`.

    record_sliding_window: write `llama.attention.sliding_window` for a Mistral/Mixtral checkpoint,
    which convert_hf_to_gguf.py's LlamaModel does not (gemma2 and phi3 files always record theirs).

    family: a newer family's layout other than its converter's current one (gguf_families).
    """
    config = json.loads((hf_dir / "config.json").read_text())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    family = family or gguf_families.FAMILIES.get(config["architectures"][0])
    writer = gguf.GGUFWriter(str(out_path), architecture or (family.gguf_arch if family is not None
                                                             else _GGUF_ARCH[config["architectures"][0]]))
    if family is not None:
        hparams = gguf_families.hparams_config(config)
        gguf_families.write_base_hparams(writer, hparams, family)
        family.hparams(writer, hparams)
    else:
        _write_hparams(writer, config, record_sliding_window)
    if config["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma4ForCausalLM"):
        write_gemma_tokenizer(writer, config["vocab_size"], "gemma4" if family and family.gguf_arch == "gemma4"
                              else "llama")
    else:
        write_byte_level_tokenizer(writer, config["vocab_size"], add_bos_token, config.get("pad_token_id"))
    weights = load_file(str(hf_dir / "model.safetensors"))
    tensors = _family_tensors(config, weights, family) if family is not None else _llama_cpp_tensors(config, weights)
    for name, array, stays_f32 in tensors:
        if stays_f32:
            _add_tensor(writer, name, array, gguf.GGMLQuantizationType.F32)
        else:
            _add_tensor(writer, name, array, qtype_of(name) if qtype_of is not None else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def write_rounded_checkpoint(hf_dir: Path, out_dir: Path, qtype: gguf.GGMLQuantizationType,
                             qtype_of: Callable[[str], gguf.GGMLQuantizationType] | None = None) -> Path:
    """A copy of `hf_dir` whose weights went through `qtype` and back, as write_gguf's file holds them:
    the reference for a quantized file transformers cannot read (Mixtral, the newer families).
    Quantizing works along rows, so a matrix rounds alike alone, stacked with other experts' or with
    its rows permuted; a matrix a converter transposed rounds along the file's rows (gguf_families).

    qtype_of: each tensor's type by its HF name (F32: kept), instead of `qtype`.
    """
    shutil.copytree(hf_dir, out_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    weights = load_file(str(hf_dir / "model.safetensors"))
    rounded = {}
    for name, array in weights.items():
        kind = qtype_of(name) if qtype_of is not None else qtype
        if _stays_f32(name, array) or kind == gguf.GGMLQuantizationType.F32:
            rounded[name] = array
            continue
        trip = functools.partial(_round_trip, qtype=kind)
        rounded[name] = np.ascontiguousarray(gguf_families.round_as_filed(config, name, array, trip))
    save_file(rounded, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def _round_trip(rows: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    qtype = _filed_type(rows, qtype)
    return gguf.quants.dequantize(gguf.quants.quantize(rows.astype(np.float32), qtype), qtype)


def _stays_f32(hf_name: str, array: np.ndarray) -> bool:
    """llama-quantize leaves 1-D tensors (norms, biases), every bias and the MoE routers unquantized."""
    return array.ndim < 2 or hf_name.endswith("bias") or any(router in hf_name for router in _ROUTERS)


def _family_tensors(config: dict, weights: dict[str, np.ndarray],
                    family: gguf_families.Family) -> Iterator[tuple[str, np.ndarray, bool]]:
    """The newer families' tensors (tests/support/gguf_families.py), kept F32 where the converter keeps
    them so (conversion/base.py prepare_tensors: 1-D, norms, routers, whatever is not a `.weight`)."""
    for name, array in gguf_families.family_tensors(config, weights, llama_cpp_permute, family):
        yield name, array, (array.ndim < 2 or name.endswith("_norm.weight") or ".ffn_gate_inp" in name
                            or not name.endswith(".weight"))
    yield from _rope_tensors(config)


def _write_hparams(writer: gguf.GGUFWriter, config: dict, record_sliding_window: bool) -> None:
    architecture = config["architectures"][0]
    if architecture == "Gemma2ForCausalLM":
        _write_gemma2_hparams(writer, config)
    elif architecture == "Phi3ForCausalLM":
        _write_phi3_hparams(writer, config)
    else:
        _write_llama_hparams(writer, config, record_sliding_window)


def _write_shared_hparams(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])


def _write_llama_hparams(writer: gguf.GGUFWriter, config: dict, record_sliding_window: bool) -> None:
    """TextModel's and LlamaModel's set_gguf_parameters (Llama, Mistral, Mixtral, Qwen2, Qwen3)."""
    head_dim = _head_dim(config)
    _write_shared_hparams(writer, config)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_vocab_size(config["vocab_size"])
    if head_dim != config["hidden_size"] // config["num_attention_heads"]:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    if "num_local_experts" in config:
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if record_sliding_window and config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])


def _write_gemma2_hparams(writer: gguf.GGUFWriter, config: dict) -> None:
    """Gemma2Model's: no rope base (llama.cpp's default 10000 is Gemma 2's), no vocab size, and no
    query_pre_attn_scalar (llama.cpp assumes head_dim, or hidden / heads at 46 layers)."""
    _write_shared_hparams(writer, config)
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
    writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_sliding_window(config["sliding_window"])


def _write_phi3_hparams(writer: gguf.GGUFWriter, config: dict) -> None:
    """Phi3MiniModel's; a window of 0 says "none" (Phi-4)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    _write_shared_hparams(writer, config)
    writer.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings")
                                         or config["max_position_embeddings"])
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * _head_dim(config)))
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_sliding_window(config.get("sliding_window") or 0)
    if rope.get("long_factor"):
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        original = config["original_max_position_embeddings"]
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _rope_theta(config: dict) -> float:
    return float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta"))


def _rope_scaling(config: dict) -> dict:
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _llama_cpp_tensors(config: dict, weights: dict[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray, bool]]:
    """(GGUF name, float32 array in HF dimension order, stays F32) for every tensor the file holds."""
    architecture = config["architectures"][0]
    if "num_local_experts" in config:
        weights = _stack_experts(weights, config["num_local_experts"])
    for hf_name, array in weights.items():
        array = array.astype(np.float32)
        if architecture in _LLAMA_MODEL and ".self_attn.q_proj." in hf_name:
            array = llama_cpp_permute(array, config["num_attention_heads"])
        elif architecture in _LLAMA_MODEL and ".self_attn.k_proj." in hf_name:
            array = llama_cpp_permute(array, config["num_key_value_heads"])
        elif architecture == "Gemma2ForCausalLM" and hf_name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        yield gguf_name(hf_name, architecture), array, _stays_f32(hf_name, array)
    yield from _rope_tensors(config)


def _stack_experts(weights: dict[str, np.ndarray], num_experts: int) -> dict[str, np.ndarray]:
    """LlamaModel.modify_tensors for Mixtral: experts.E.wK ([out, in] each) -> experts.wK [experts, out, in]."""
    stacked = {name: array for name, array in weights.items() if ".experts." not in name}
    for name in weights:
        prefix, marker, rest = name.partition(".experts.0.")
        if marker:
            matrices = [weights[f"{prefix}.experts.{expert}.{rest}"] for expert in range(num_experts)]
            stacked[f"{prefix}.experts.{rest}"] = np.stack(matrices)
    return stacked


def _rope_tensors(config: dict) -> Iterator[tuple[str, np.ndarray, bool]]:
    scaling = _rope_scaling(config)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "llama3":
        yield "rope_freqs.weight", _llama3_rope_freqs(scaling, _rope_theta(config), _head_dim(config)), True
    elif scaling.get("long_factor"):  # Phi-3 LongRoPE: both factor lists, as convert_hf_to_gguf.py stores them
        yield "rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32), True
        yield "rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32), True


def _filed_type(array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    """`qtype`, or F16 where rows do not split into its blocks: the converter's fallback (QuantError),
    e.g. DeepSeek's k_b, whose rows are qk_nope_head_dim long."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if array.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def _add_tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    qtype = _filed_type(array, qtype)
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, array)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        writer.add_tensor(name, kquant_blocks.quantize(array, qtype), raw_dtype=qtype)


def _llama3_rope_freqs(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """What convert_hf_to_gguf.py's LlamaModel stores for llama3 rope: one divisor per frequency."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    divisors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            divisors.append(1.0)
        elif wavelen > old_context / low:
            divisors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def write_minimal_gguf(out_path: Path, architecture: str) -> Path:
    """A file that is a valid GGUF of `architecture` and nothing more (for error paths)."""
    writer = gguf.GGUFWriter(str(out_path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def hf_model_from_gguf(path: Path) -> object:
    """HF transformers' own reading of a GGUF file: its config and its dequantized tensors.

    This is what `AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)` does for llama, qwen2
    and qwen3 files (transformers' legacy GGUF loader), minus its requirement of `accelerate`, which
    the project does not install.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}, result
    model.tie_weights()
    return model.eval()
