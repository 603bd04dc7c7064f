"""Which GGUF architectures we convert, and how each maps onto an HF architecture.

llama.cpp names one architecture per model family in `general.architecture` (Mistral files say
`llama`) and one set of tensor names for all of them. A family is added here with its HF class,
its model_type, whether llama.cpp permuted its Q/K rows, and any tensors or config fields of its
own; the engine must also know the HF class (pipeline/model/loader.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

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


@dataclass(frozen=True, slots=True)
class GgufArchitecture:
    hf_architecture: str  # config.json `architectures[0]`
    model_type: str  # config.json `model_type`
    # convert_hf_to_gguf.py permutes the Q/K rows of LlamaModel files from HF's rotate-half layout
    # to the interleaved pairs llama.cpp's rope uses; loading into HF's layout undoes it.
    permuted_qk: bool = False
    extra_layer_tensors: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    config_defaults: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def layer_tensors(self) -> dict[str, str]:
        return {**COMMON_LAYER_TENSORS, **self.extra_layer_tensors}


GGUF_ARCHITECTURES: MappingProxyType[str, GgufArchitecture] = MappingProxyType({
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    # Qwen2 always has Q/K/V biases (the HF class has no switch for them).
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2",
                              config_defaults=MappingProxyType({"use_sliding_window": False})),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", extra_layer_tensors=MappingProxyType({
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    })),
})


def gguf_architecture(name: str) -> GgufArchitecture:
    """The entry for a file's `general.architecture`; ValueError naming it and the supported ones."""
    if name not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {name!r} is not supported; supported GGUF architectures: "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    return GGUF_ARCHITECTURES[name]
