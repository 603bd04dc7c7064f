"""The scheduler's side of structured outputs: each choice's matcher, its mask for the next token,
and the end of a choice whose grammar is complete.

A choice's matcher is made when it first samples, by replaying its output tokens, which is also how
a choice resumed after a crash or recomputed after preemption gets its state back. Before a step,
every scheduled choice that samples in it sends its allowed-token bitmask with the plan (bytes, so
the plan can cross a process); a choice's mask for step N + 1 depends on step N's token, which is
why such choices are never planned ahead (pipeline/scheduling/lookahead.py).
"""

from __future__ import annotations

from pipeline.grammar.compiler import GrammarCompiler
from pipeline.grammar.matcher import GrammarMatcher
from pipeline.request.request import Sequence


def token_bitmasks(scheduled: list[Sequence], grammars: GrammarCompiler | None
                   ) -> tuple[dict[int, bytes], list[tuple[Sequence, str]]]:
    """(seq_id -> bitmask for the sequences that sample this step, (sequence, error) for those whose
    grammar cannot be built)."""
    masks: dict[int, bytes] = {}
    failed: list[tuple[Sequence, str]] = []
    for seq in scheduled:
        constraint = seq.params.structured_outputs
        if constraint is None or seq.num_computed_tokens < seq.num_tokens:
            continue
        try:
            matcher = _matcher(seq, grammars)
        except ValueError as error:
            failed.append((seq, str(error)))
            continue
        masks[seq.seq_id] = matcher.fill_bitmask()
    return masks, failed


def grammar_finished(seq: Sequence, token_id: int) -> bool:
    """Advance the choice's matcher by its new token; True when its grammar can take no more."""
    matcher = seq.grammar_matcher
    if matcher is None:
        return False
    matcher.accept(token_id)
    return matcher.is_finished


def _matcher(seq: Sequence, grammars: GrammarCompiler | None) -> GrammarMatcher:
    if seq.grammar_matcher is None:
        if grammars is None:
            raise ValueError("structured outputs are not available on this engine (no tokenizer)")
        constraint = seq.params.structured_outputs
        assert constraint is not None
        matcher = grammars.matcher(constraint)
        matcher.replay(seq.token_ids[seq.num_prompt_tokens:])
        seq.grammar_matcher = matcher
    return seq.grammar_matcher
