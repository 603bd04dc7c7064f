"""The scheduler's side of structured outputs: each choice's matcher and its mask for the next token.

A complete grammar allows only EOS next (and the request's stop tokens, allowed wherever the
grammar could end), so such a choice ends as any does, on EOS with finish_reason "stop" (the
order of docs/sampling.md, stage 0, and what HF's generate does with the same mask).

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
        masks[seq.seq_id] = matcher.fill_bitmask(seq.params.stop_token_ids if matcher.is_accepting else ())
    return masks, failed


def grammar_ends_here(seq: Sequence, token_id: int, can_end_with_eos: bool) -> bool:
    """Advance the choice's matcher by its new token. True when the choice must end now: its grammar
    is complete but EOS cannot end it, or the token broke the grammar (which the mask prevents)."""
    matcher = seq.grammar_matcher
    if matcher is None:
        return False
    matcher.accept(token_id)
    return matcher.error is not None or (matcher.is_finished and not can_end_with_eos)


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
