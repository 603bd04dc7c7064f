"""LoRA on the device: each projection of the Llama-class decoders wrapped with adapter slots.

A LoRALinear holds whatever module computed the projection before (nn.Linear, a packed or
quantized linear: anything with forward(x)) and adds, for tokens that use an adapter,
scale * (x A) B. Slots are fixed-size stacked tensors, zero-padded to the maximum rank:

    lora_a [slots, in_features, shards * max_rank]   shard k of slot s in columns k*r_s:(k+1)*r_s
    lora_b[k] [slots, max_rank, out_features_k]      rows :r_s used

Our fused projections (qkv_proj, gate_up_proj) are several PEFT modules side by side: one matmul
with the shards' A matrices gives [n, shards * r], then shard k's B writes its own output columns.

Per step the tokens are grouped by slot once (LoRAStep), and every wrapper loops over the distinct
adapters present (at most --max-loras), never over tokens. A step without adapter tokens takes the
plain path. A CUDA-graph variant would keep the tensors as they are, take the per-token slot as a
graph input and use the full max_rank; eager steps slice each slot to its adapter's rank instead.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pipeline.lora.adapter import LoRAAdapter, ModelShapes
from pipeline.model.models.llama import DecoderConfig, LlamaForCausalLM

# Our module name -> the PEFT target modules fused in it, in output-column order.
SHARDS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


def model_shapes(config: DecoderConfig) -> ModelShapes:
    """(in, out) features of each PEFT target module of a Llama-class decoder."""
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return ModelShapes(config.num_layers, {
        "q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
        "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    })


class LoRAStep:
    """The current step's tokens grouped by adapter slot, shared by every wrapper.

    slots per token [-1, 1, 0, 1, -1] -> perm [2, 1, 3], groups [(0, 0, 1), (1, 1, 3)]
    (slot, start, end): perm[start:end] are the tokens of that slot.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.perm: torch.Tensor | None = None
        self.groups: list[tuple[int, int, int]] = []

    def set(self, token_slots: np.ndarray | None) -> None:
        if token_slots is None:
            self.perm, self.groups = None, []
            return
        adapted = np.flatnonzero(token_slots >= 0)
        order = adapted[np.argsort(token_slots[adapted], kind="stable")]
        sorted_slots = token_slots[order]
        slots, starts = np.unique(sorted_slots, return_index=True)
        ends = np.append(starts[1:], len(order))
        self.perm = torch.from_numpy(order.astype(np.int64)).to(self.device)
        self.groups = [(int(s), int(a), int(b)) for s, a, b in zip(slots, starts, ends, strict=True)]


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, layer_index: int, module_name: str, shapes: ModelShapes, num_slots: int,
                 max_rank: int, step: LoRAStep, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.layer_index = layer_index
        self.shard_names = SHARDS[module_name]
        in_features = shapes.features[self.shard_names[0]][0]
        self.step = step
        self.max_rank = max_rank
        self.register_buffer("lora_a", torch.zeros(num_slots, in_features, len(self.shard_names) * max_rank,
                                                   dtype=dtype, device=device), persistent=False)
        self.lora_b = [torch.zeros(num_slots, max_rank, shapes.features[name][1], dtype=dtype, device=device)
                       for name in self.shard_names]
        self.ranks = [0] * num_slots  # 0: the slot's adapter leaves this module alone
        self.scales = [0.0] * num_slots

    def load_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy the adapter's shards of this module into `slot` (zeros where it has none)."""
        pairs = [adapter.weights.get((self.layer_index, name)) for name in self.shard_names]
        self.lora_a[slot].zero_()
        for lora_b in self.lora_b:
            lora_b[slot].zero_()
        if all(pair is None for pair in pairs):
            self.ranks[slot], self.scales[slot] = 0, 0.0
            return
        rank = adapter.rank
        for shard, pair in enumerate(pairs):
            if pair is not None:
                lora_a, lora_b = pair
                self.lora_a[slot, :, shard * rank:(shard + 1) * rank].copy_(lora_a)
                self.lora_b[shard][slot, :rank].copy_(lora_b)
        self.ranks[slot], self.scales[slot] = rank, adapter.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        perm = self.step.perm
        if perm is None:
            return out
        gathered = x[perm]
        for slot, start, end in self.step.groups:
            rank = self.ranks[slot]
            if rank == 0:
                continue
            xa = gathered[start:end] @ self.lora_a[slot, :, :len(self.lora_b) * rank]  # [n, shards * r]
            parts = [xa[:, k * rank:(k + 1) * rank] @ lora_b[slot, :rank] for k, lora_b in enumerate(self.lora_b)]
            delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            # As PEFT: base output + (x A B) * scale, added row by row.
            out.index_add_(0, perm[start:end], delta, alpha=self.scales[slot])
        return out


class LoRASlotTensors:
    """Every LoRALinear of a model and the step grouping they share; owned by the ModelRunner."""

    def __init__(self, model: nn.Module, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.shapes = lora_model_shapes(model)
        self.step = LoRAStep(device)
        self.modules: list[LoRALinear] = []
        for index, layer in enumerate(model.model.layers):
            for parent, name in ((layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"),
                                 (layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj")):
                wrapper = LoRALinear(getattr(parent, name), index, name, self.shapes, num_slots, max_rank,
                                     self.step, dtype, device)
                setattr(parent, name, wrapper)
                self.modules.append(wrapper)

    def load(self, slot: int, adapter: LoRAAdapter) -> None:
        for module in self.modules:
            module.load_slot(slot, adapter)


def lora_model_shapes(model: nn.Module) -> ModelShapes:
    """The target shapes of a model LoRA can wrap; ValueError naming the family otherwise."""
    config = getattr(model, "config", None)
    if not isinstance(model, LlamaForCausalLM) or not isinstance(config, DecoderConfig):
        raise ValueError(f"LoRA is not supported for {type(model).__name__} (supported: the Llama family "
                         "(Llama, Mistral, Qwen2, Qwen3) and Gemma 2)")
    if config.num_experts:
        raise ValueError(f"LoRA is not supported for mixture-of-experts models ({type(model).__name__})")
    return model_shapes(config)
