"""Whether a sequence stops after a sampled token, and why: the stop rules in their order.

EOS (unless ignored) and stop token ids count only once `min_tokens` output tokens are there (before
that they are banned anyway); a grammar that is complete ends the choice where EOS could not; then
`max_tokens` and the model's length. Stop strings are found later, on text (pipeline/output/).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.request.request import FinishReason, Sequence
from pipeline.scheduling.grammar_masks import grammar_ends_here


@dataclass(frozen=True, slots=True)
class Stop:
    reason: FinishReason
    stop_reason: int | str | None = None  # the stop token id that ended it, if one did
    grammar_complete: bool = False


def check_stop(seq: Sequence, token_id: int, max_model_len: int) -> Stop | None:
    """The stop `token_id`, just appended to `seq`, triggers; None when the sequence goes on."""
    params = seq.params
    num_output = seq.num_output_tokens
    if num_output > params.min_tokens:
        if not params.ignore_eos and token_id in seq.request.eos_token_ids:
            return Stop(FinishReason.STOP)
        if token_id in params.stop_token_ids:
            return Stop(FinishReason.STOP, token_id)
    # A complete grammar allows only EOS (or a stop token) next; where EOS cannot end the choice
    # (min_tokens bans it, ignore_eos ignores it) the choice ends here instead.
    if grammar_ends_here(seq, token_id, can_end_with_eos=not params.ignore_eos and num_output >= params.min_tokens):
        return Stop(FinishReason.STOP, grammar_complete=True)
    if (params.max_tokens is not None and num_output >= params.max_tokens) or seq.num_tokens >= max_model_len:
        return Stop(FinishReason.LENGTH)
    return None
