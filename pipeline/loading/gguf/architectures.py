"""Which GGUF architectures we convert, and how each maps onto an HF architecture.

llama.cpp names one architecture per model family in `general.architecture` and one set of
tensor names for all of them; Mistral and Mixtral files say `llama`, and only their metadata tells
them apart (a recorded window, an expert count). A family is added here with its HF class, its
model_type, whether llama.cpp permuted its Q/K rows or shifted its norm weights, and any tensors or
config fields of its own; the engine must also know the HF class (pipeline/model/models).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pipeline.loading.gguf.family_config import gemma2_fields, mistral_fields, mixtral_fields, phi3_fields
from pipeline.loading.gguf.metadata import GgufMetadata

# llama.cpp's per-layer tensor names (`blk.N.<name>.weight|bias`) -> HF's (`model.layers.N.<name>...`).
COMMON_LAYER_TENSORS: MappingProxyType[str, str] = MappingProxyType({
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
})
# Tensors outside the blocks.
GLOBAL_TENSORS: MappingProxyType[str, str] = MappingProxyType({
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
})


# (metadata, config built so far) -> the family's own config.json fields (pipeline/loading/gguf/family_config.py)
FamilyFields = Callable[[GgufMetadata, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class GgufArchitecture:
    hf_architecture: str  # config.json `architectures[0]`
    model_type: str  # config.json `model_type`
    # convert_hf_to_gguf.py permutes the Q/K rows of LlamaModel files from HF's rotate-half layout
    # to the interleaved pairs llama.cpp's rope uses; loading into HF's layout undoes it.
    permuted_qk: bool = False
    # What convert_hf_to_gguf.py added to every norm weight: Gemma's RMSNorm scales by (1 + w), and
    # llama.cpp's by its stored weight, so Gemma files hold 1 + w.
    norm_weight_offset: float = 0.0
    # Names a family adds to, or changes in, COMMON_LAYER_TENSORS. `{expert}` in an HF name: the GGUF
    # tensor stacks one matrix per expert ([experts, out, in]) and is split into HF's per-expert ones.
    extra_layer_tensors: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    config_values: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    family_fields: FamilyFields | None = None

    def layer_tensors(self) -> dict[str, str]:
        return {**COMMON_LAYER_TENSORS, **self.extra_layer_tensors}


_GELU_TANH = "gelu_pytorch_tanh"

GGUF_ARCHITECTURES: MappingProxyType[str, GgufArchitecture] = MappingProxyType({
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    # Qwen2 always has Q/K/V biases (the HF class has no switch for them).
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2",
                              config_values=MappingProxyType({"use_sliding_window": False})),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", extra_layer_tensors=MappingProxyType({
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    })),
    # Four norms per layer: llama.cpp's ffn_norm is Gemma's pre-feedforward one, not post_attention.
    "gemma2": GgufArchitecture(
        "Gemma2ForCausalLM", "gemma2", norm_weight_offset=1.0,
        extra_layer_tensors=MappingProxyType({
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        }),
        config_values=MappingProxyType({"hidden_act": _GELU_TANH, "hidden_activation": _GELU_TANH}),
        family_fields=gemma2_fields),
    # Phi-3 keeps its fused projections in the file as in HF: attn_qkv rows [q; k; v], ffn_up rows [gate; up].
    "phi3": GgufArchitecture("Phi3ForCausalLM", "phi3", extra_layer_tensors=MappingProxyType({
        "attn_qkv": "self_attn.qkv_proj",
        "ffn_up": "mlp.gate_up_proj",
    }), family_fields=phi3_fields),
})

# `llama` files that are not plain Llama. Mixtral's experts get HF's per-expert names, the ones
# save_pretrained writes and pipeline/model/models/mixtral.py loads (w1 gate, w3 up, w2 down).
_MISTRAL = GgufArchitecture("MistralForCausalLM", "mistral", permuted_qk=True, family_fields=mistral_fields)
_MIXTRAL = GgufArchitecture("MixtralForCausalLM", "mixtral", permuted_qk=True, extra_layer_tensors=MappingProxyType({
    "ffn_gate_inp": "block_sparse_moe.gate",  # the router
    "ffn_gate_exps": "block_sparse_moe.experts.{expert}.w1",
    "ffn_up_exps": "block_sparse_moe.experts.{expert}.w3",
    "ffn_down_exps": "block_sparse_moe.experts.{expert}.w2",
}), family_fields=mixtral_fields)


def gguf_architecture(metadata: GgufMetadata) -> GgufArchitecture:
    """The entry for a file; ValueError naming its `general.architecture` and the supported ones."""
    name = metadata.architecture
    if name not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {name!r} is not supported; supported GGUF architectures: "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    if name == "llama":
        return _llama_variant(metadata)
    return GGUF_ARCHITECTURES[name]


def _llama_variant(metadata: GgufMetadata) -> GgufArchitecture:
    """convert_hf_to_gguf.py writes Llama, Mistral and Mixtral alike as `llama`. Experts make it
    Mixtral; a recorded window makes it Mistral (llama.cpp records none for Mistral 7B v0.1, whose
    4096-token window it ignores, so such a file is served as llama.cpp serves it: as Llama)."""
    if int(metadata.arch("expert_count") or 0) > 0:
        return _MIXTRAL
    if metadata.arch("attention.sliding_window"):
        return _MISTRAL
    return GGUF_ARCHITECTURES["llama"]
