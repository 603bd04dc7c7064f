"""LoRA on the device: each projection of the Llama-class decoders wrapped with adapter slots.

A LoRALinear holds whatever module computed the projection before (nn.Linear, a packed or
quantized linear: anything with forward(x)) and adds scale_i * (x A_i) B_i for each token's
adapter i. Our fused projections (qkv_proj, gate_up_proj) are several PEFT modules side by side
("shards"); each shard's delta is written into its own output columns.

Each step's adapter tokens are grouped by slot once (LoRAStep) into a padded [groups, G] layout,
G the largest group, so every wrapper runs the same five ops whatever the mix of adapters (no loop
over adapters, none over tokens):

    lora_a [slots, in, shards * R]    shard k of slot s in columns k*R:(k+1)*R (R: the largest resident rank)
    lora_b [slots, shards * R, out]   block-diagonal over shards: shard k's rows feed only its own columns
    xs = x[gather]                    [groups, G, in]; padding points at token 0
    xa = bmm(xs, lora_a[present]) * row_scale   adapter scale per real row, 0 for padding
    out.index_add_(0, gather, bmm(xa, lora_b[present]))

Example: tokens using slots [1, -1, 1, 0] (-1: base) -> present [0, 1], G 2,
gather [[3, 0], [0, 2]], row_scale [[s0, 0], [s1, s1]]: the padding rows add exact zeros.

The FLOPs are those of each token's own adapter (plus padding, none for an even mix), and a step
costs a handful of ops per projection: on CPU that mattered more than the matmul shapes (one
small matmul per adapter and shard, or computing every slot for every token, were both slower).
The slot tensors have fixed shapes for a given R; a CUDA-graph variant would use R = max rank,
all slots and the gather/row_scale arrays as graph inputs. A step without adapter tokens takes
the plain path. Scaling before B rather than after, as PEFT does, changes only the last bits.
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
    """The current step's adapter tokens grouped by slot, shared by every wrapper (None: plain step)."""

    def __init__(self, num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.scales = np.zeros(num_slots)  # per slot (0 for an empty one)
        self.gather: torch.Tensor | None = None  # [groups * G] token index per padded row
        self.row_scale: torch.Tensor | None = None  # [groups, G, 1]
        self.present: torch.Tensor | None = None  # slots of the groups; None when every slot is present

    @property
    def active(self) -> bool:
        return self.gather is not None

    def set(self, token_slots: np.ndarray | None) -> None:
        adapted = np.zeros(0, np.int64) if token_slots is None else np.flatnonzero(token_slots >= 0)
        if len(adapted) == 0:
            self.gather = self.row_scale = self.present = None
            return
        order = adapted[np.argsort(token_slots[adapted], kind="stable")]
        present, starts, counts = np.unique(token_slots[order], return_index=True, return_counts=True)
        num_groups, group_size = len(present), int(counts.max())
        # token k of the sorted order -> (its group, its row in the group)
        group_of = np.repeat(np.arange(num_groups), counts)
        row_in_group = np.arange(len(order)) - np.repeat(starts, counts)
        gather = np.zeros((num_groups, group_size), np.int64)
        row_scale = np.zeros((num_groups, group_size), np.float64)
        gather[group_of, row_in_group] = order
        row_scale[group_of, row_in_group] = self.scales[present][group_of]
        self.gather = torch.from_numpy(gather.reshape(-1)).to(self.device)
        self.row_scale = torch.from_numpy(row_scale).to(self.device, self.dtype).unsqueeze(-1)
        every_slot = num_groups == self.num_slots
        self.present = None if every_slot else torch.from_numpy(present.astype(np.int64)).to(self.device)


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, layer_index: int, module_name: str, shapes: ModelShapes,
                 step: LoRAStep) -> None:
        super().__init__()
        self.base = base
        self.layer_index = layer_index
        self.shard_names = SHARDS[module_name]
        self.in_features = shapes.features[self.shard_names[0]][0]
        self.out_features = [shapes.features[name][1] for name in self.shard_names]
        self.step = step
        self.lora_a: torch.Tensor | None = None  # None: no resident adapter touches this module
        self.lora_b: torch.Tensor | None = None

    def repack(self, adapters: list[LoRAAdapter | None], rank: int, dtype: torch.dtype, device: torch.device) -> None:
        """Lay out the slots' matrices for this module (see the module docstring); after any slot change."""
        num_slots, num_shards = len(adapters), len(self.shard_names)
        lora_a = torch.zeros(num_slots, self.in_features, num_shards * rank, dtype=dtype, device=device)
        lora_b = torch.zeros(num_slots, num_shards * rank, sum(self.out_features), dtype=dtype, device=device)
        columns = np.cumsum([0, *self.out_features])
        used = False
        for slot, adapter in enumerate(adapters):
            for shard, name in enumerate(self.shard_names):
                pair = None if adapter is None else adapter.weights.get((self.layer_index, name))
                if pair is not None:
                    rows = slice(shard * rank, shard * rank + adapter.rank)
                    lora_a[slot, :, rows] = pair[0]
                    lora_b[slot, rows, columns[shard]:columns[shard + 1]] = pair[1]
                    used = True
        self.lora_a, self.lora_b = (lora_a, lora_b) if used else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        step = self.step
        if step.gather is None or step.row_scale is None or self.lora_a is None or self.lora_b is None:
            return out
        lora_a, lora_b = self.lora_a, self.lora_b
        if step.present is not None:
            lora_a, lora_b = lora_a.index_select(0, step.present), lora_b.index_select(0, step.present)
        num_groups, group_size = step.row_scale.shape[:2]
        xs = x.index_select(0, step.gather).view(num_groups, group_size, -1)
        xa = torch.bmm(xs, lora_a).mul_(step.row_scale)  # [groups, G, shards * R]
        delta = torch.bmm(xa, lora_b).view(num_groups * group_size, -1)
        return out.index_add_(0, step.gather, delta)


class LoRASlotTensors:
    """Every LoRALinear of a model, the adapters in the device slots and the shared step state;
    owned by the ModelRunner (loads run on the device thread, between steps)."""

    def __init__(self, model: nn.Module, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.shapes = lora_model_shapes(model)
        self.max_rank = max_rank
        self.dtype, self.device = dtype, device
        self.step = LoRAStep(num_slots, dtype, device)
        self.adapters: list[LoRAAdapter | None] = [None] * num_slots
        self.modules: list[LoRALinear] = []
        for index, layer in enumerate(model.model.layers):
            for parent, name in ((layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"),
                                 (layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj")):
                wrapper = LoRALinear(getattr(parent, name), index, name, self.shapes, self.step)
                setattr(parent, name, wrapper)
                self.modules.append(wrapper)

    def load(self, loads: dict[int, LoRAAdapter]) -> None:
        """Put adapters into slots (slot -> adapter), then repack every module once."""
        if not loads:
            return
        for slot, adapter in loads.items():
            self.adapters[slot] = adapter
        rank = max((adapter.rank for adapter in self.adapters if adapter is not None), default=0)
        self.step.scales = np.array([0.0 if adapter is None else adapter.scale for adapter in self.adapters])
        for module in self.modules:
            module.repack(self.adapters, rank, self.dtype, self.device)


def lora_model_shapes(model: nn.Module) -> ModelShapes:
    """The target shapes of a model LoRA can wrap; ValueError naming the family otherwise."""
    config = getattr(model, "config", None)
    if not isinstance(model, LlamaForCausalLM) or not isinstance(config, DecoderConfig):
        raise ValueError(f"LoRA is not supported for {type(model).__name__} (supported: the dense decoder "
                         "families, docs/models.md)")
    if config.num_experts:
        raise ValueError(f"LoRA is not supported for mixture-of-experts models ({type(model).__name__})")
    return model_shapes(config)
