"""The scheduler's side of structured outputs: each choice's matcher and its mask for the next token.

A complete grammar allows only EOS next (and the request's stop tokens, allowed wherever the
grammar could end), so such a choice ends as any does, on EOS with finish_reason "stop" (the
order of docs/sampling.md, stage 0, and what HF's generate does with the same mask).

A choice's matcher is made when it first samples, by replaying its output tokens, which is also how
a choice resumed after a crash or recomputed after preemption gets its state back. Before a step,
every scheduled choice that samples in it sends its allowed-token bitmask with the plan (bytes, so
the plan can cross a process); a choice's mask for step N + 1 depends on step N's token, which is
why such choices are never planned ahead (pipeline/scheduling/lookahead.py).

A JSON constraint closes within its budget: once a choice's remaining max_tokens hold no more than
the text that completes its JSON (pipeline/grammar/json_closing.py) and the EOS after it, its mask
allows only the next token of that text. So an answer that would run to max_tokens inside an object
(a small model writing ever more keys) ends as valid JSON, with every earlier token the model's own;
a closing token the grammar does not allow (a schema wanting more) leaves the grammar's mask as is.
"""

from __future__ import annotations

import functools

import numpy as np

from pipeline.grammar.compiler import GrammarCompiler
from pipeline.grammar.json_closing import closing_suffix
from pipeline.grammar.matcher import GrammarMatcher
from pipeline.request.request import Sequence

CLOSING_HORIZON = 64  # remaining tokens below which a JSON choice's closing text is worked out


def token_bitmasks(scheduled: list[Sequence], grammars: GrammarCompiler | None, max_model_len: int | None = None,
                   ) -> tuple[dict[int, bytes], list[tuple[Sequence, str]]]:
    """(seq_id -> bitmask for the sequences that sample this step, (sequence, error) for those whose
    grammar cannot be built). `max_model_len` bounds the budget of choices without max_tokens."""
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
        mask = matcher.fill_bitmask(seq.params.stop_token_ids if matcher.is_accepting else ())
        closing = _closing_token(seq, grammars, max_model_len)
        masks[seq.seq_id] = _only(closing, len(mask) // 4) if closing is not None and _allows(mask, closing) else mask
    return masks, failed


def _closing_token(seq: Sequence, grammars: GrammarCompiler | None, max_model_len: int | None) -> int | None:
    """The next token of the text that closes the choice's JSON, once its budget (max_tokens, else
    the context left) holds just that text and an EOS; None while the model may still write freely
    (or nothing needs closing)."""
    constraint = seq.params.structured_outputs
    if grammars is None or constraint is None or constraint[0] != "json":
        return None
    budgets = [limit for limit in (seq.params.max_tokens and seq.params.max_tokens - seq.num_output_tokens,
                                   max_model_len and max_model_len - seq.num_tokens) if limit is not None]
    if not budgets:
        return None
    remaining = min(budgets)
    if remaining > CLOSING_HORIZON:
        return None
    suffix = closing_suffix(grammars.tokenizer.decode(seq.output_token_ids))
    if not suffix:
        return None
    closing = _suffix_tokens(grammars, suffix)
    return closing[0] if closing and remaining <= len(closing) + 1 else None


@functools.lru_cache(maxsize=256)
def _suffix_tokens(grammars: GrammarCompiler, suffix: str) -> tuple[int, ...]:
    return tuple(grammars.tokenizer.encode(suffix, add_special_tokens=False))


def _allows(mask: bytes, token_id: int) -> bool:
    words = np.frombuffer(mask, dtype="<u4")
    return token_id // 32 < len(words) and bool(words[token_id // 32] >> np.uint32(token_id % 32) & np.uint32(1))


def _only(token_id: int, num_words: int) -> bytes:
    words = np.zeros(num_words, dtype="<u4")
    words[token_id // 32] = np.uint32(1) << np.uint32(token_id % 32)
    return words.tobytes()


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
