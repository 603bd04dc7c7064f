"""DraftLength: how many tokens one sequence drafts next, following its recent acceptance.

A fully accepted draft doubles the length (up to the configured most); a fully rejected one (or
no draft found) halves it. At 0 the sequence decodes plainly for a cool-down of decode steps
that doubles with each consecutive fall to 0 (8, 16, 32, 64 at most), then retries with 1.
So a stream whose drafts keep failing pays for about one verified token in 64 steps.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_COOLDOWN_STEPS = 8
MAX_COOLDOWN_STEPS = 64


@dataclass(slots=True)
class DraftLength:
    max_k: int
    k: int
    cooldown: int = 0  # plain decode steps left before a retry (while k == 0)
    num_falls: int = 0  # consecutive falls to 0, without a full acceptance since

    @classmethod
    def start(cls, max_k: int) -> DraftLength:
        return cls(max_k=max_k, k=max_k)

    def on_verified(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted > 0 and num_accepted == num_drafted:
            self.k = min(self.max_k, max(2 * self.k, 1))
            self.num_falls = 0
        elif num_accepted == 0:
            self.k //= 2
            if self.k == 0:
                self.cooldown = min(FIRST_COOLDOWN_STEPS << self.num_falls, MAX_COOLDOWN_STEPS)
                self.num_falls += 1

    def on_plain_step(self) -> None:
        """A decode step without a draft while k == 0: one step of the cool-down."""
        if self.k == 0:
            self.cooldown -= 1
            if self.cooldown <= 0:
                self.k = 1
