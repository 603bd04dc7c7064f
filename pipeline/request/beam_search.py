"""Beam search bookkeeping of one request: HF transformers' semantics (docs/sampling.md "Several choices").

Pure decisions, no sequences or blocks: each step gets every running beam's cumulative score and
its best next tokens with their logprobs, and says which (parent, token) pairs run on and which
hypotheses are finished. It follows `GenerationMixin._beam_search` (transformers 5):

- Each step keeps the best K = max(2, 1 + #eos) * W continuations over all beams (a beam's own
  best W + #eos tokens always contain every one of them that can be chosen, so the sampler only
  returns that many per beam).
- A continuation "hits a stop" when its token is an EOS / stop token or it reaches the length
  limit. The best W that do not run on; those among the overall best W that do become finished
  hypotheses with score = cumulative logprob / (generated tokens, the last one included)^length_penalty,
  kept in a W-best list, unless the list is full under early_stopping=True or the early-stop
  heuristic already said no improvement is possible.
- The search ends when no improvement is possible (heuristic below), when the list is full under
  early_stopping=True, or when every continuation hit a stop (the length limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Hypothesis:
    output_token_ids: list[int]
    score: float  # length-penalized: what HF returns as sequences_scores
    ends_with_stop_token: bool


@dataclass(slots=True)
class RunningBeam:
    key: int  # the caller's name for the beam (a sequence id)
    output_token_ids: list[int]
    score: float  # cumulative logprob of output_token_ids
    candidates: list[tuple[int, float]]  # its best next tokens, (token id, logprob), best first


@dataclass(slots=True)
class Continuation:
    parent_key: int
    token_id: int
    score: float


@dataclass(slots=True)
class BeamSearch:
    width: int
    num_return: int
    length_penalty: float
    early_stopping: bool | str  # True, False or "never"
    max_new_tokens: int  # the length limit of an output
    stop_token_ids: frozenset[int]
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most `width`
    improvement_possible: bool = True  # HF's early-stop heuristic; once False it stays False
    done: bool = False
    # Kept by the scheduler: beam key -> cumulative logprob of each running beam, and while the beams
    # of one step report, beam key -> its best next tokens.
    scores: dict[int, float] = field(default_factory=dict)
    pending: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def step(self, beams: list[RunningBeam]) -> list[Continuation]:
        """One generation step; returns the beams that run on (best first), none once `done`."""
        num_generated = len(beams[0].output_token_ids) + 1  # after this step's token
        top = self._best_continuations(beams)
        hits = [self._hits_stop(c.token_id, num_generated) for c in top]
        running = [c for c, hit in zip(top, hits, strict=True) if not hit][:self.width]
        parents = {beam.key: beam for beam in beams}
        self._add_finished([(c, parents[c.parent_key]) for rank, (c, hit) in enumerate(zip(top, hits, strict=True))
                            if hit and rank < self.width], num_generated)
        self._update_heuristic(running, num_generated)
        list_full = len(self.finished) == self.width and self.early_stopping is True
        self.done = not self.improvement_possible or list_full or all(hits)
        return [] if self.done else running

    def results(self) -> list[Hypothesis]:
        return self.finished[:self.num_return]

    def _best_continuations(self, beams: list[RunningBeam]) -> list[Continuation]:
        num_keep = max(2, 1 + len(self.stop_token_ids)) * self.width
        every = [Continuation(beam.key, token_id, beam.score + logprob)
                 for beam in beams for token_id, logprob in beam.candidates]
        # Stable on ties: the earlier beam, then its better-ranked token (as a flat top-k would mostly do).
        return sorted(every, key=lambda c: -c.score)[:num_keep]

    def _hits_stop(self, token_id: int, num_generated: int) -> bool:
        return token_id in self.stop_token_ids or num_generated >= self.max_new_tokens

    def _add_finished(self, new: list[tuple[Continuation, RunningBeam]], num_generated: int) -> None:
        list_full = len(self.finished) == self.width and self.early_stopping is True
        if not new or list_full or not self.improvement_possible:
            return
        penalty = num_generated ** self.length_penalty
        for continuation, parent in new:
            self.finished.append(Hypothesis([*parent.output_token_ids, continuation.token_id],
                                            continuation.score / penalty,
                                            continuation.token_id in self.stop_token_ids))
        self.finished.sort(key=lambda hypothesis: -hypothesis.score)
        del self.finished[self.width:]

    def _update_heuristic(self, running: list[Continuation], num_generated: int) -> None:
        """Can the best running beam still beat the worst finished hypothesis? Only asked once the
        list is full; the best length it could reach is guessed as HF does (max length for
        "never" with a positive penalty, else the current one)."""
        if len(self.finished) < self.width or not running:
            return
        if self.early_stopping == "never" and self.length_penalty > 0:
            best_length = self.max_new_tokens
        else:
            best_length = num_generated
        best_possible = running[0].score / best_length ** self.length_penalty
        self.improvement_possible = self.improvement_possible and best_possible > self.finished[-1].score
