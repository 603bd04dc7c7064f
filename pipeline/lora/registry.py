"""LoRARegistry: adapter names -> adapters, with an LRU of adapters kept in host memory.

Each load of a name gets a fresh adapter id (never reused): the id is what requests, prefix-cache
hashes and device slots refer to, so reloading a name with other weights can never mix the two.
An id's path is kept after its name is unloaded or replaced, because a request admitted before
may still need its weights. Host memory holds at most `max_cpu_loras` adapters; others are read
from disk again when a device slot needs them.

Shared by the event loop (names, readiness) and the device thread (reading weights): a lock
guards the maps, never the disk reads.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from pipeline.lora.adapter import LoRAAdapter, LoRAError, ModelShapes, read_adapter


@dataclass(slots=True)
class _Entry:
    name: str
    path: str
    ready: bool = False  # read and validated; a reserved one is still being loaded


class LoRARegistry:
    def __init__(self, shapes: ModelShapes, max_rank: int, max_cpu_loras: int) -> None:
        if max_cpu_loras < 1:
            raise ValueError(f"max_cpu_loras must be >= 1, got {max_cpu_loras}")
        self.shapes = shapes
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self._lock = threading.Lock()
        self._next_id = itertools.count(1)  # 0 is never an adapter (cache salt None = base model)
        self._id_of_name: dict[str, int] = {}
        self._entries: dict[int, _Entry] = {}
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()

    # ---- names -----------------------------------------------------------------------------------

    def load(self, name: str, path: str | Path) -> int:
        """Register and read `name` now; LoRAError (and the name stays unknown) if it cannot be served."""
        adapter_id = self.reserve(name, path)
        self.complete(adapter_id)
        return adapter_id

    def reserve(self, name: str, path: str | Path) -> int:
        """Make `name` known at once (requests for it wait) before `complete` reads it."""
        if not name:
            raise LoRAError("lora adapter name must not be empty")
        with self._lock:
            adapter_id = next(self._next_id)
            self._entries[adapter_id] = _Entry(name, str(path))
            self._id_of_name[name] = adapter_id
        return adapter_id

    def complete(self, adapter_id: int) -> LoRAAdapter:
        """Read a reserved adapter; on failure its name is forgotten and the error re-raised."""
        entry = self._entries[adapter_id]
        try:
            adapter = read_adapter(entry.name, entry.path, self.shapes, self.max_rank)
        except LoRAError:
            self._forget(adapter_id)
            raise
        except Exception as error:  # whatever the files make the reader raise is the adapter's fault
            self._forget(adapter_id)
            raise LoRAError(f"lora adapter {entry.name!r}: {type(error).__name__}: {error}") from error
        with self._lock:
            entry.ready = True
            self._remember(adapter_id, adapter)
        return adapter

    def unload(self, name: str) -> bool:
        """Forget `name` for new requests; False if it was not known."""
        with self._lock:
            return self._id_of_name.pop(name, None) is not None

    def _forget(self, adapter_id: int) -> None:
        with self._lock:
            name = self._entries[adapter_id].name
            if self._id_of_name.get(name) == adapter_id:
                del self._id_of_name[name]

    def id_of(self, name: str) -> int:
        """The current id of `name`; ValueError naming the known adapters otherwise."""
        adapter_id = self._id_of_name.get(name)
        if adapter_id is None:
            known = ", ".join(sorted(self._id_of_name)) or "none"
            raise ValueError(f"lora: unknown adapter {name!r} (loaded: {known})")
        return adapter_id

    def names(self) -> list[str]:
        return sorted(self._id_of_name)

    def name_of(self, adapter_id: int) -> str:
        return self._entries[adapter_id].name

    def is_ready(self, adapter_id: int) -> bool:
        entry = self._entries.get(adapter_id)
        return entry is not None and entry.ready

    def is_servable(self, adapter_id: int) -> bool:
        """Read already, or still loading: False only when its load failed. (An unloaded name's
        admitted requests still run: its weights stay readable.)"""
        entry = self._entries.get(adapter_id)
        return entry is not None and (entry.ready or self._id_of_name.get(entry.name) == adapter_id)

    # ---- weights -----------------------------------------------------------------------------------

    def adapter(self, adapter_id: int) -> LoRAAdapter:
        """The weights of a ready adapter, from host memory or read from disk again (LRU)."""
        with self._lock:
            adapter = self._host.get(adapter_id)
            if adapter is not None:
                self._host.move_to_end(adapter_id)
                return adapter
            entry = self._entries[adapter_id]
        adapter = read_adapter(entry.name, entry.path, self.shapes, self.max_rank)
        with self._lock:
            self._remember(adapter_id, adapter)
        return adapter

    @property
    def num_in_host_memory(self) -> int:
        return len(self._host)

    def _remember(self, adapter_id: int, adapter: LoRAAdapter) -> None:
        self._host[adapter_id] = adapter
        self._host.move_to_end(adapter_id)
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
