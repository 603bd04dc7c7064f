"""DraftLength: how many tokens one sequence drafts next, following its recent acceptance.

A fully accepted draft doubles the length (up to the configured most); a fully rejected one
halves it. At 0 the sequence decodes plainly for a cool-down of decode steps that doubles with
each consecutive fall to 0 (8, 16, 32, 64 at most), then retries with 1. So a stream whose drafts
keep failing pays for about one verified token in 64 steps. A context where no suffix recurs
costs nothing to draft from, but a sequence that wants a draft is not planned ahead
(pipeline/scheduling/lookahead.py); so after MAX_MISSES lookups in a row find nothing, the
sequence pauses (keeping its length) for the first cool-down.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_COOLDOWN_STEPS = 8
MAX_COOLDOWN_STEPS = 64
MAX_MISSES = 3


@dataclass(slots=True)
class DraftLength:
    max_k: int
    k: int
    cooldown: int = 0  # plain decode steps left before drafting again
    num_falls: int = 0  # consecutive falls to 0, without a full acceptance since
    num_misses: int = 0  # consecutive lookups that found no draft

    @classmethod
    def start(cls, max_k: int) -> DraftLength:
        return cls(max_k=max_k, k=max_k)

    @property
    def drafting(self) -> bool:
        return self.k > 0 and self.cooldown == 0

    def on_verified(self, num_drafted: int, num_accepted: int) -> None:
        self.num_misses = 0
        if num_accepted == num_drafted:
            self.k = min(self.max_k, 2 * self.k)
            self.num_falls = 0
        elif num_accepted == 0:
            self.k //= 2
            if self.k == 0:
                self.cooldown = min(FIRST_COOLDOWN_STEPS << self.num_falls, MAX_COOLDOWN_STEPS)
                self.num_falls += 1

    def on_miss(self) -> None:
        """A lookup found no draft."""
        self.num_misses += 1
        if self.num_misses >= MAX_MISSES:
            self.num_misses = 0
            self.cooldown = FIRST_COOLDOWN_STEPS

    def on_plain_step(self) -> None:
        """A decode step without a draft while not drafting: one step of the cool-down."""
        if self.cooldown > 0:
            self.cooldown -= 1
            if self.cooldown == 0 and self.k == 0:
                self.k = 1
