"""One piece of an answer split into its reasoning and its content (what every reasoning machine returns)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Split:
    reasoning: str = ""
    content: str = ""

    def __add__(self, other: Split) -> Split:
        return Split(self.reasoning + other.reasoning, self.content + other.content)
