"""LoRA adapters at the scheduler: whether a waiting sequence's adapter can be served and run now, its
device slot while it runs, and the output tokens each adapter generated (metrics).

A sequence may start only when its adapter is read into host memory and a device slot is free or can
be freed; the slots' loads travel in the step plan (pipeline/lora/slots.py), and the registry keeps
their weights in host memory until the device has copied them.
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
        """Its adapter is read and resident, or a slot can be freed for it and its weights are in host
        memory (read back here if evicted, so a private copy that is gone fails the request, not the step)."""
        lora_id = seq.request.lora_id
        if lora_id is None:
            return True
        if not (self.registry.is_ready(lora_id) and self.slots.can_acquire(lora_id)):
            return False
        return self.slots.slot_of(lora_id) is not None or self.registry.prepare(lora_id)

    def acquire(self, seq: Sequence) -> None:
        lora_id = seq.request.lora_id
        if lora_id is not None:
            if self.slots.slot_of(lora_id) is None:  # a slot load: held in host memory until the device copies it
                self.registry.hold(lora_id)
            seq.lora_slot = self.slots.acquire(lora_id)

    def release(self, seq: Sequence) -> None:
        if seq.lora_slot is not None and seq.request.lora_id is not None:
            self.slots.release(seq.request.lora_id)
        seq.lora_slot = None

    def count_token(self, seq: Sequence) -> None:
        name = seq.request.lora_name
        if name is not None:
            self.token_counts[name] = self.token_counts.get(name, 0) + 1
