"""Which GGUF architectures we convert, and how each maps onto an HF architecture.

llama.cpp names one architecture per model family in `general.architecture` and one set of
tensor names for all of them; Mistral and Mixtral files say `llama`, and only their metadata tells
them apart (a recorded window, an expert count). A family is added here with its HF class, its
model_type, whether llama.cpp permuted its Q/K rows or shifted its norm weights, any tensors or
config fields of its own and any tensors its converter split (joins.py); the engine must also know
the HF class (pipeline/model/models). Each family's layout is the one its llama.cpp converter
(conversion/<family>.py, formerly convert_hf_to_gguf.py) writes, named by gguf-py's tensor map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pipeline.loading.gguf.family_config import (
    gemma2_fields,
    gemma3_fields,
    gemma4_fields,
    glm4_fields,
    granite_fields,
    mistral_fields,
    mixtral_fields,
    olmo2_fields,
    phi3_fields,
    smollm3_fields,
)
from pipeline.loading.gguf.joins import DEEPSEEK_JOINS, GPT_OSS_JOINS, LLAMA4_JOINS, QWEN2MOE_JOINS, Join
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.gguf.moe_config import deepseek2_fields, gpt_oss_fields, llama4_fields, qwen_moe_fields

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


# (metadata, config built so far, the file's tensor names) -> the family's own config.json fields
# (pipeline/loading/gguf/family_config.py, moe_config.py)
FamilyFields = Callable[[GgufMetadata, dict[str, Any], set[str]], dict[str, Any]]
# How rope.dimension_count relates to the head size: "full" (equal, checked), "partial" (a leading part
# of each head rotates: partial_rotary_factor), "latent" (DeepSeek's MLA: the family sets the sizes),
# "proportional" (Gemma 4's global layers: rope_freqs freezes the trailing frequency pairs).
Rotary = Literal["full", "partial", "latent", "proportional"]


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
    # A key with its kind ("attn_sinks.weight") names that tensor whole, for HF names without a
    # `.weight`/`.bias` suffix.
    extra_layer_tensors: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    extra_global_tensors: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    config_values: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    family_fields: FamilyFields | None = None
    joins: tuple[Join, ...] = ()
    rotary: Rotary = "full"
    # Whether transformers' GGUF reader knows the architecture and so picks the tokenizer class for
    # it (AutoTokenizer); for the others the file's tokenizer is built architecture-blind.
    transformers_tokenizer: bool = True
    # head_count_kv and feed_forward_length may differ between layers (lists): the family reads them.
    per_layer_shapes: bool = False

    def layer_tensors(self) -> dict[str, str]:
        return {**COMMON_LAYER_TENSORS, **self.extra_layer_tensors}

    def global_tensors(self) -> dict[str, str]:
        return {**GLOBAL_TENSORS, **self.extra_global_tensors}


_GELU_TANH = "gelu_pytorch_tanh"
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Gemma's four norms per layer: llama.cpp's ffn_norm is Gemma's pre-feedforward one, not post_attention.
_GEMMA_NORMS = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}


def _routed_experts(mlp: str) -> dict[str, str]:
    """The router and the stacked experts, split per expert into HF's saved names (Qwen MoE, DeepSeek)."""
    return {"ffn_gate_inp": f"{mlp}.gate", **{f"ffn_{kind}_exps": f"{mlp}.experts.{{expert}}.{kind}_proj"
                                               for kind in ("gate", "up", "down")}}


def _shared_expert(module: str) -> dict[str, str]:
    return {f"ffn_{kind}_shexp": f"{module}.{kind}_proj" for kind in ("gate", "up", "down")}


def _stacked_experts(mlp: str) -> dict[str, str]:
    """Stacked experts kept whole, as join parts (joins.py: gpt-oss, Llama 4)."""
    return {f"ffn_{kind}_exps": f"{mlp}.experts.{kind}_proj" for kind in ("gate", "up", "down")}


_DEEPSEEK_ATTENTION = {
    "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj", "attn_k_b": "self_attn.k_b_proj", "attn_v_b": "self_attn.v_b_proj",
}


def _names(*parts: dict[str, str]) -> MappingProxyType[str, str]:
    return MappingProxyType({key: value for part in parts for key, value in part.items()})


GGUF_ARCHITECTURES: MappingProxyType[str, GgufArchitecture] = MappingProxyType({
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    # Qwen2 always has Q/K/V biases (the HF class has no switch for them).
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2",
                              config_values=MappingProxyType({"use_sliding_window": False})),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", extra_layer_tensors=_names(_QK_NORMS)),
    "gemma2": GgufArchitecture(
        "Gemma2ForCausalLM", "gemma2", norm_weight_offset=1.0, extra_layer_tensors=_names(_GEMMA_NORMS),
        config_values=MappingProxyType({"hidden_act": _GELU_TANH, "hidden_activation": _GELU_TANH}),
        family_fields=gemma2_fields),
    # Phi-3 keeps its fused projections in the file as in HF: attn_qkv rows [q; k; v], ffn_up rows [gate; up].
    "phi3": GgufArchitecture("Phi3ForCausalLM", "phi3", extra_layer_tensors=MappingProxyType({
        "attn_qkv": "self_attn.qkv_proj",
        "ffn_up": "mlp.gate_up_proj",
    }), family_fields=phi3_fields),
    # Gemma 2's norms plus (1 + w) q/k norms, all stored as 1 + w; a text-only file of either HF class.
    "gemma3": GgufArchitecture(
        "Gemma3ForCausalLM", "gemma3_text", norm_weight_offset=1.0,
        extra_layer_tensors=_names(_GEMMA_NORMS, _QK_NORMS),
        config_values=MappingProxyType({"hidden_act": _GELU_TANH, "hidden_activation": _GELU_TANH}),
        family_fields=gemma3_fields),
    "qwen3moe": GgufArchitecture("Qwen3MoeForCausalLM", "qwen3_moe",
                                 extra_layer_tensors=_names(_QK_NORMS, _routed_experts("mlp")),
                                 family_fields=qwen_moe_fields),
    "qwen2moe": GgufArchitecture("Qwen2MoeForCausalLM", "qwen2_moe", extra_layer_tensors=_names(
        _routed_experts("mlp"), _shared_expert("mlp.shared_expert"),
        {"ffn_gate_inp_shexp": "mlp.shared_expert_gate"}), joins=QWEN2MOE_JOINS, family_fields=qwen_moe_fields),
    "gpt-oss": GgufArchitecture("GptOssForCausalLM", "gpt_oss", extra_layer_tensors=_names(
        {"post_attention_norm": "post_attention_layernorm", "attn_sinks.weight": "self_attn.sinks",
         "ffn_gate_inp": "mlp.router", "ffn_down_exps.bias": "mlp.experts.down_proj_bias"},
        _stacked_experts("mlp")), joins=GPT_OSS_JOINS, family_fields=gpt_oss_fields,
        # transformers 5's GGUF config reader fails on gpt-oss's rope.scaling keys; its class is this one anyway.
        transformers_tokenizer=False),
    # GLM-4 (0414): ffn_up is HF's fused gate_up_proj (rows [gate; up]); a sandwich norm after each sublayer.
    "glm4": GgufArchitecture("Glm4ForCausalLM", "glm4", extra_layer_tensors=MappingProxyType({
        "ffn_up": "mlp.gate_up_proj", "post_attention_norm": "post_self_attn_layernorm",
        "post_ffw_norm": "post_mlp_layernorm",
    }), rotary="partial", family_fields=glm4_fields, transformers_tokenizer=False),
    # OLMo 2: post-norms only (no attn_norm/ffn_norm), q/k norms over whole projections; no permutation.
    "olmo2": GgufArchitecture("Olmo2ForCausalLM", "olmo2", extra_layer_tensors=_names(_QK_NORMS, {
        "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    }), family_fields=olmo2_fields, transformers_tokenizer=False),
    "granite": GgufArchitecture("GraniteForCausalLM", "granite", permuted_qk=True, family_fields=granite_fields,
                                transformers_tokenizer=False),
    "smollm3": GgufArchitecture("SmolLM3ForCausalLM", "smollm3", permuted_qk=True, family_fields=smollm3_fields,
                                transformers_tokenizer=False),
    # DeepSeek-V2 and V3 alike (the family fields tell them apart); no Q/K permutation.
    "deepseek2": GgufArchitecture("DeepseekV2ForCausalLM", "deepseek_v2", extra_layer_tensors=_names(
        _DEEPSEEK_ATTENTION, _routed_experts("mlp"), _shared_expert("mlp.shared_experts"),
        {"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}), joins=DEEPSEEK_JOINS, rotary="latent",
        family_fields=deepseek2_fields, transformers_tokenizer=False),
    # Llama 4 text: llama.cpp keeps HF's adjacent-pair rope rows (no permutation).
    "llama4": GgufArchitecture("Llama4ForCausalLM", "llama4_text", extra_layer_tensors=_names(
        {f"ffn_{kind}": f"feed_forward.{kind}_proj" for kind in ("gate", "up", "down")},
        {"ffn_gate_inp": "feed_forward.router"}, _shared_expert("feed_forward.shared_expert"),
        _stacked_experts("feed_forward")), joins=LLAMA4_JOINS, family_fields=llama4_fields,
        transformers_tokenizer=False),
    # Gemma 4 text: Gemma 3's norms and q/k norms (stored as w: Gemma 4 scales by w), per-layer input
    # embeddings, a per-layer output scale; layer kinds, head sizes and KV heads per layer in the metadata.
    "gemma4": GgufArchitecture(
        "Gemma4ForCausalLM", "gemma4_text", extra_layer_tensors=_names(_GEMMA_NORMS, _QK_NORMS, {
            "layer_output_scale.weight": "layer_scalar", "inp_gate": "per_layer_input_gate",
            "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm"}),
        extra_global_tensors=MappingProxyType({
            "per_layer_token_embd": "model.embed_tokens_per_layer",
            "per_layer_model_proj": "model.per_layer_model_projection",
            "per_layer_proj_norm": "model.per_layer_projection_norm"}),
        config_values=MappingProxyType({"hidden_activation": _GELU_TANH}), family_fields=gemma4_fields,
        rotary="proportional", per_layer_shapes=True,
        # transformers 5's GGUF config reader fails on per-layer feed_forward_length lists; the
        # tokenizer (`gemma4`: SentencePiece pieces in Gemma's tokenizer) is built by its type alone.
        transformers_tokenizer=False),
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
