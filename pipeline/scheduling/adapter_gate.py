"""LoRA adapters at the scheduler: whether a waiting sequence's adapter can be served and run now, its
device slot while it runs, and the output tokens each adapter generated (metrics).

A sequence may start only when its adapter is read into host memory and a device slot is free or can
be freed; the slots' loads travel in the step plan (pipeline/lora/slots.py).
"""

from __future__ import annotations

from pipeline.lora.registry import LoRARegistry
from pipeline.lora.slots import LoRASlots
from pipeline.request.request import Sequence


class AdapterGate:
    def __init__(self, registry: LoRARegistry, slots: LoRASlots) -> None:
        self.registry = registry
        self.slots = slots
        self.token_counts: dict[str, int] = {}  # adapter name -> output tokens generated

    def failed(self, seq: Sequence) -> bool:
        """Its adapter failed to load (or was unloaded): the request cannot be served."""
        lora_id = seq.request.lora_id
        return lora_id is not None and not self.registry.is_servable(lora_id)

    def can_run(self, seq: Sequence) -> bool:
        """Its adapter is read and resident, or a slot can be freed for it."""
        lora_id = seq.request.lora_id
        return lora_id is None or (self.registry.is_ready(lora_id) and self.slots.can_acquire(lora_id))

    def acquire(self, seq: Sequence) -> None:
        if seq.request.lora_id is not None:
            seq.lora_slot = self.slots.acquire(seq.request.lora_id)

    def release(self, seq: Sequence) -> None:
        if seq.lora_slot is not None and seq.request.lora_id is not None:
            self.slots.release(seq.request.lora_id)
        seq.lora_slot = None

    def count_token(self, seq: Sequence) -> None:
        name = seq.request.lora_name
        if name is not None:
            self.token_counts[name] = self.token_counts.get(name, 0) + 1
