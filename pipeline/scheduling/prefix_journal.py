"""What a worker's prefix cache gained and lost since it last told the fleet (placement keys,
pipeline/scheduling/prefix_keys.py). The block pool records; the worker's publisher drains.

Each key ends in the set of its last change: cached then evicted between two drains -> `removed`
(an SREM of a key never published costs nothing; skipping it could leave one published earlier).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PrefixJournal:
    added: set[bytes] = field(default_factory=set)
    removed: set[bytes] = field(default_factory=set)
    cleared: bool = False  # the whole cache was reset: the published set starts over

    def add(self, key: bytes) -> None:
        self.removed.discard(key)
        self.added.add(key)

    def remove(self, key: bytes) -> None:
        self.added.discard(key)
        self.removed.add(key)

    def clear(self) -> None:
        self.added.clear()
        self.removed.clear()
        self.cleared = True

    def drain(self) -> tuple[bool, set[bytes], set[bytes]]:
        """(cleared, added, removed) since the last drain, and start afresh."""
        changes = (self.cleared, self.added, self.removed)
        self.added, self.removed, self.cleared = set(), set(), False
        return changes
