"""Stop strings over streamed text deltas.

A stop string may arrive split across deltas ("Hel" + "lo"), so the tail of the text that could
still grow into a stop string is held back until the next delta decides it. Only the longest
suffix that is a prefix of some stop string is held (at most max(len(stop)) - 1 characters), so
ordinary text streams out without delay.

When several stop strings occur, the one that is complete first in the text wins (earliest end;
on a tie, the longer one, which starts earlier). That is what a character-by-character stream
would see, so the result does not depend on how the text happens to be split into deltas.
"""

from __future__ import annotations


class StopStringMatcher:
    """Feed text deltas; get back the text safe to emit and the stop string once one matches."""

    def __init__(self, stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False) -> None:
        for index, stop_string in enumerate(stop):
            if not stop_string:
                raise ValueError(f"stop[{index}] must be a non-empty string, got {stop_string!r}")
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None
        self._held = ""

    @property
    def held_text(self) -> str:
        """Text received but not yet emitted because it may begin a stop string."""
        return self._held

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Return (text safe to emit now, the stop string matched by this delta or None).

        After a match, the sequence is over: later deltas are dropped and return ("", None).
        """
        if self.matched is not None:
            return "", None
        if not self.stop:
            return delta, None
        buffer = self._held + delta
        match = self._earliest_match(buffer)
        if match is not None:
            start, stop_string = match
            self.matched = stop_string
            self._held = ""
            end = start + len(stop_string) if self.include_stop_str_in_output else start
            return buffer[:end], stop_string
        hold = self._partial_match_length(buffer)
        self._held = buffer[len(buffer) - hold:] if hold else ""
        return buffer[: len(buffer) - hold], None

    def flush(self) -> str:
        """Release held-back text when the sequence ends for another reason (EOS, length, ...)."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buffer: str) -> tuple[int, str] | None:
        """(start, stop string) of the match that ends first; ties go to the earlier start."""
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for stop_string in self.stop:
            start = buffer.find(stop_string)
            if start < 0:
                continue
            candidate = (start + len(stop_string), start, stop_string)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop_string in self.stop:
            for length in range(min(len(stop_string) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop_string[:length]):
                    longest = length
                    break
        return longest
