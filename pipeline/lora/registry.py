"""LoRARegistry: adapter names -> adapters, with an LRU of adapters kept in host memory.

Each load of a name gets a fresh adapter id (never reused): the id is what requests, prefix-cache
hashes and device slots refer to, so reloading a name with other weights can never mix the two.
An id's weights stay available after its name is unloaded or replaced, because a request admitted
before may still need them.

The adapter's own files are read once, at load, through their real path (under --lora-root when
set); what was validated is written to a private copy (private_copy.py). Host memory holds at most
`max_cpu_loras` adapters, plus those assigned to a device slot that the device has not taken yet;
an evicted one is read back from its private copy when the scheduler gives it a slot again
(`prepare`), so a copy gone or changed fails that adapter's requests ("lora_unavailable"), never the
step. The device thread's `adapter` never raises.

Shared by the event loop (names, readiness, `prepare`) and the device thread (`complete`,
`adapter`): a lock guards the maps, never the disk reads.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import structlog

from pipeline.lora.adapter import LoRAAdapter, LoRAError, ModelShapes, read_adapter
from pipeline.lora.private_copy import PrivateCopy, read_private_copy, write_private_copy

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Entry:
    name: str
    path: str  # the directory the load named: read once, by complete()
    root: Path | None  # its real path must lie under this (--lora-root), if given
    ready: bool = False  # read and validated; a reserved one is still being loaded
    copy: PrivateCopy | None = None  # set once ready
    broken: bool = False  # its private copy could not be read back: requests for it fail


class LoRARegistry:
    def __init__(self, shapes: ModelShapes, max_rank: int, max_cpu_loras: int, *, copies_dir: Path) -> None:
        if max_cpu_loras < 1:
            raise ValueError(f"max_cpu_loras must be >= 1, got {max_cpu_loras}")
        self.shapes = shapes
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self.copies_dir = copies_dir
        self._lock = threading.Lock()
        self._next_id = itertools.count(1)  # 0 is never an adapter (cache salt None = base model)
        self._id_of_name: dict[str, int] = {}
        self._entries: dict[int, _Entry] = {}
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self._held: dict[int, int] = {}  # slot loads the device has not taken yet, per id: never evicted

    # ---- names -----------------------------------------------------------------------------------

    def load(self, name: str, path: str | Path, root: Path | None = None) -> int:
        """Register and read `name` now; LoRAError (and the name stays unknown) if it cannot be served."""
        adapter_id = self.reserve(name, path, root)
        self.complete(adapter_id)
        return adapter_id

    def reserve(self, name: str, path: str | Path, root: Path | None = None) -> int:
        """Make `name` known at once (requests for it wait) before `complete` reads it."""
        if not name:
            raise LoRAError("lora adapter name must not be empty")
        with self._lock:
            adapter_id = next(self._next_id)
            self._entries[adapter_id] = _Entry(name, str(path), root)
            self._id_of_name[name] = adapter_id
        return adapter_id

    def complete(self, adapter_id: int) -> LoRAAdapter:
        """Read a reserved adapter and write its private copy; on failure its name is forgotten and
        the error re-raised."""
        entry = self._entries[adapter_id]
        try:
            adapter = read_adapter(entry.name, entry.path, self.shapes, self.max_rank, entry.root)
            copy = write_private_copy(adapter, self.copies_dir)
        except LoRAError:
            self._forget(adapter_id)
            raise
        except Exception as error:  # whatever the files make the reader raise is the adapter's fault
            self._forget(adapter_id)
            raise LoRAError(f"lora adapter {entry.name!r}: {type(error).__name__}: {error}") from error
        with self._lock:
            entry.copy, entry.ready = copy, True
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
        return entry is not None and entry.ready and not entry.broken

    def is_servable(self, adapter_id: int) -> bool:
        """Read already, or still loading: False when its load failed or its private copy could not be
        read back. (An unloaded name's admitted requests still run: its weights stay readable.)"""
        entry = self._entries.get(adapter_id)
        if entry is None or entry.broken:
            return False
        return entry.ready or self._id_of_name.get(entry.name) == adapter_id

    def private_copy(self, adapter_id: int) -> Path | None:
        """Where a ready adapter's private copy lies (None while it loads)."""
        copy = self._entries[adapter_id].copy
        return copy.path if copy is not None else None

    # ---- weights -----------------------------------------------------------------------------------

    def prepare(self, adapter_id: int) -> bool:
        """Have a ready adapter's weights in host memory before the scheduler gives it a slot, read
        back from its private copy if evicted; False (it is broken from now on) when that fails."""
        with self._lock:
            if adapter_id in self._host:
                self._host.move_to_end(adapter_id)
                return True
        return self._read_back(adapter_id) is not None

    def hold(self, adapter_id: int) -> None:
        """Keep its weights in host memory until the device takes them (`adapter`): it got a slot."""
        with self._lock:
            if adapter_id in self._host:
                self._held[adapter_id] = self._held.get(adapter_id, 0) + 1

    def adapter(self, adapter_id: int) -> LoRAAdapter:
        """The weights for a device slot (device thread). Never raises: the scheduler held them in
        host memory when it assigned the slot; were they missing anyway, they are read back, and an
        adapter that cannot be gives no delta (and is broken from now on) rather than stop the step."""
        with self._lock:
            self._release_hold(adapter_id)
            adapter = self._host.get(adapter_id)
            if adapter is not None:
                self._host.move_to_end(adapter_id)
                self._evict()
                return adapter
        adapter = self._read_back(adapter_id)
        return adapter if adapter is not None else LoRAAdapter(self.name_of(adapter_id), 1, 0.0, {})

    @property
    def num_in_host_memory(self) -> int:
        return len(self._host)

    def _read_back(self, adapter_id: int) -> LoRAAdapter | None:
        entry = self._entries[adapter_id]
        if entry.broken or entry.copy is None:
            return None
        try:
            adapter = read_private_copy(entry.copy)
        except Exception as error:  # a LoRAError, or whatever else reading raised: the adapter's failure
            entry.broken = True
            log.error("lora adapter unavailable: its requests fail", adapter=entry.name, adapter_id=adapter_id,
                      error=str(error))
            return None
        with self._lock:
            self._remember(adapter_id, adapter)
        return adapter

    def _release_hold(self, adapter_id: int) -> None:
        count = self._held.pop(adapter_id, 0) - 1
        if count > 0:
            self._held[adapter_id] = count

    def _remember(self, adapter_id: int, adapter: LoRAAdapter) -> None:
        self._host[adapter_id] = adapter
        self._host.move_to_end(adapter_id)
        self._evict()

    def _evict(self) -> None:
        """Least recently used first, down to max_cpu_loras, skipping held adapters."""
        for adapter_id in list(self._host):
            if len(self._host) <= self.max_cpu_loras:
                return
            if adapter_id not in self._held:
                del self._host[adapter_id]
