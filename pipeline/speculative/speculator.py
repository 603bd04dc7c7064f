"""Speculator: the scheduler's side of speculative decoding (docs/speculative.md).

A decoding sequence (one unconsumed token, no placeholder) gets a draft of up to k tokens from
its proposer: prompt lookup in its own context (pipeline/speculative/ngram.py) or a draft model's
greedy tokens (pipeline/speculative/draft_model.py); the scheduler computes its last token and the
draft in one chunk of 1 + k query tokens, and the sampler draws a token at each of the k + 1
positions, position j seeing the history up to draft j - 1 and the uniform of output position
j (docs/design.md §5). Verification keeps the target's own samples while they equal the draft:
draft j is accepted iff the token drawn at position j equals it, and the first mismatch's token
(or the bonus token after a fully accepted draft) ends the run. Each emitted token is exactly the
token a plain decode would have drawn at that position, greedy or sampled.

Excluded (they decode plainly): mirostat (its mu advances per token), beam search and structured
outputs (their state follows each token), and requests with `speculative: false`.
"""

from __future__ import annotations

from pipeline.config import SpeculativeConfig
from pipeline.request.request import Sequence
from pipeline.request.sampling_params import SamplingParams
from pipeline.speculative.adaptive import DraftLength
from pipeline.speculative.proposer import DraftProposer, PromptLookupProposer


def can_speculate(params: SamplingParams) -> bool:
    return (params.speculative and not params.uses_mirostat and not params.use_beam_search
            and params.structured_outputs is None)


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: DraftProposer | None = None) -> None:
        """proposer: the draft model's, for method "draft_model" (the engine loads it); prompt lookup's
        is built here."""
        if proposer is None:
            if config.uses_draft_model:
                raise ValueError("speculative_config.model: a draft model needs its proposer (the engine loads it)")
            proposer = PromptLookupProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.config = config
        self.proposer = proposer
        self.lengths: dict[int, DraftLength] = {}  # seq_id -> its adaptive draft length
        self.num_draft_tokens = 0  # drafted and verified
        self.num_accepted_tokens = 0
        self._prefetched: dict[int, list[int]] = {}  # seq_id -> this step's batched draft (prefetch)

    def active(self, num_running: int) -> bool:
        """Whether a batch of this many running sequences drafts at all (disable_by_batch_size)."""
        limit = self.config.disable_by_batch_size
        return limit is None or num_running <= limit

    def wants_draft(self, seq: Sequence) -> bool:
        """Whether the sequence's next decode would carry a draft (so it should not be planned ahead)."""
        return can_speculate(seq.params) and self._length(seq).drafting

    def holds_back_lookahead(self, running: list[Sequence]) -> bool:
        """A draft is being verified, or a sequence sampling now will draft next: the next step is
        planned once the tokens are known (a draft continues the last token)."""
        active = self.active(len(running))
        return any(seq.draft_token_ids or (active and seq.num_computed_tokens == seq.num_tokens
                                           and self.wants_draft(seq))
                   for seq in running)

    def prefetch(self, running: list[Sequence], budget: int, max_model_len: int) -> None:
        """Before a step is planned: the drafts its decoding sequences may ask for, in one batched call
        when the proposer drafts in batches (a draft model: one forward per draft position for all of
        them, instead of per sequence). draft() then takes a sequence's prefetched tokens, cut to the
        budget left at its turn (greedy drafts: a shorter draft is the longer one's start)."""
        self._prefetched.clear()
        propose_many = getattr(self.proposer, "propose_many", None)
        if propose_many is None:
            return
        requests = [(seq.seq_id, seq.token_ids, k) for seq in running
                    if self._wants_now(seq) and (k := self._draft_length(seq, budget, max_model_len)) >= 1]
        if requests:
            self._prefetched = propose_many(requests)

    def draft(self, seq: Sequence, budget: int, max_model_len: int) -> list[int]:
        """Draft tokens for a sequence about to decode, within the step's token budget, its
        max_tokens and the context length ([] for none)."""
        if not can_speculate(seq.params) or seq.num_computed_tokens != seq.num_tokens - 1:
            return []  # not decoding (a prefill chunk, a beam waiting) or not speculating at all
        length = self._length(seq)
        if not length.drafting:
            length.on_plain_step()
            return []
        k = self._draft_length(seq, budget, max_model_len)
        if k < 1 or seq.has_placeholder:  # (planned ahead: its last token is not known yet)
            return []
        prefetched = self._prefetched.pop(seq.seq_id, None)
        draft = prefetched[:k] if prefetched is not None else self.proposer.propose(seq.seq_id, seq.token_ids, k)
        if not draft:
            length.on_miss()
        return draft

    def _wants_now(self, seq: Sequence) -> bool:
        """Whether draft() would propose for the sequence now (without touching its adaptive length)."""
        return (can_speculate(seq.params) and seq.num_computed_tokens == seq.num_tokens - 1
                and not seq.has_placeholder and self._length(seq).drafting)

    def _draft_length(self, seq: Sequence, budget: int, max_model_len: int) -> int:
        k = min(self._length(seq).k, budget - 1, max_model_len - seq.num_tokens)
        if seq.params.max_tokens is not None:
            k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1)
        return k

    def on_verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self._length(seq).on_verified(num_drafted, num_accepted)

    def forget(self, seq_id: int) -> None:
        self.lengths.pop(seq_id, None)
        self.proposer.forget(seq_id)

    def _length(self, seq: Sequence) -> DraftLength:
        length = self.lengths.get(seq.seq_id)
        if length is None:
            length = self.lengths[seq.seq_id] = DraftLength.start(self.config.num_speculative_tokens)
        return length
