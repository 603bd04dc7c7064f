"""LoRASlots: which adapter sits in which device slot, decided by the scheduler.

The device holds `num_slots` adapters at once (--max-loras). A sequence that uses an adapter
holds it while it runs; an adapter with no running sequence may be replaced, least recently used
first (empty slots before any). So at most num_slots distinct adapters run in one step, and an
adapter in use is never evicted. A slot (re)assigned to an adapter is reported in the next plan
(`take_loads`), and the runner copies the weights in before that step's forward.

    slots [a, b], a used by 2 sequences, b by none:
    acquire(c) -> evicts b, slot 1 -> c (load {1: c});  acquire(d) -> None (a and c are in use)
"""

from __future__ import annotations

from collections import OrderedDict


class LoRASlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"max_loras must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._adapter_in: list[int | None] = [None] * num_slots
        self._slot_of: dict[int, int] = {}
        self._users: dict[int, int] = {}  # adapter id -> running sequences using it
        self._recency: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_slots))  # LRU first
        self._pending_loads: dict[int, int] = {}
        self.num_loads = 0  # slot (re)assignments so far (metrics, tests)

    def slot_of(self, adapter_id: int) -> int | None:
        return self._slot_of.get(adapter_id)

    def can_acquire(self, adapter_id: int) -> bool:
        return adapter_id in self._slot_of or self._victim() is not None

    def acquire(self, adapter_id: int) -> int:
        """A slot holding `adapter_id` for one more user (loading it if needed); call can_acquire first."""
        slot = self._slot_of.get(adapter_id)
        if slot is None:
            slot = self._victim()
            if slot is None:
                raise RuntimeError(f"no free LoRA slot for adapter {adapter_id}")
            evicted = self._adapter_in[slot]
            if evicted is not None:
                del self._slot_of[evicted]
            self._adapter_in[slot] = adapter_id
            self._slot_of[adapter_id] = slot
            self._pending_loads[slot] = adapter_id
            self.num_loads += 1
        self._users[adapter_id] = self._users.get(adapter_id, 0) + 1
        self._recency.move_to_end(slot)
        return slot

    def release(self, adapter_id: int) -> None:
        count = self._users.get(adapter_id, 0) - 1
        if count > 0:
            self._users[adapter_id] = count
        else:
            self._users.pop(adapter_id, None)

    def take_loads(self) -> dict[int, int]:
        """Slot -> adapter id assigned since the last call (the runner loads them)."""
        loads, self._pending_loads = self._pending_loads, {}
        return loads

    def resident(self) -> list[int]:
        """Adapter ids in the slots, slot order."""
        return [adapter_id for adapter_id in self._adapter_in if adapter_id is not None]

    def num_users(self, adapter_id: int) -> int:
        return self._users.get(adapter_id, 0)

    def _victim(self) -> int | None:
        empty = [slot for slot in self._recency if self._adapter_in[slot] is None]
        if empty:
            return empty[0]
        for slot in self._recency:
            if self._users.get(self._adapter_in[slot], 0) == 0:  # type: ignore[arg-type]
                return slot
        return None
