"""The scheduler's side of beam search: turning BeamSearch decisions into sequences and KV blocks.

A beam is a Sequence. After a step, a beam that sampled waits (parked: nothing left to compute)
until every running beam of its request has its candidates; then BeamSearch picks the next beams.
The first continuation of a parent extends the parent's own sequence in place (its KV stays valid).
Every further continuation of the same parent is a fork: a new waiting sequence with the parent's
tokens plus its own. A fork gets the parent's full blocks from the prefix cache (the parent
published them as they filled) and recomputes only the tokens of the last, partial block (< one
block). That costs a little compute instead of a device-side copy of one block, but needs no new
step-plan message, works unchanged under chunked prefill, preemption and sliding windows, and
the prefix cache already ref-counts the shared blocks. (Without prefix caching a fork recomputes
all its tokens: correct, slower.) Beams that lose are finished silently; their blocks go back to
the pool and stay in the prefix cache until evicted. When the search ends, the n best hypotheses
become the request's n choices, reported as token events all at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.request.beam_search import BeamSearch, Continuation, RunningBeam
from pipeline.request.outputs import TokenEvent, TokenLogprob
from pipeline.request.request import FinishReason, Request, Sequence


@dataclass(slots=True)
class BeamStep:
    """What the scheduler does after a beam's candidates arrive: count the tokens, end the beams
    that lost (or all, when the search is over), queue the forks, and pass the events on."""

    num_generated_tokens: int = 0
    finished: list[Sequence] = field(default_factory=list)
    forks: list[Sequence] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)


def new_beam_search(request: Request, max_model_len: int) -> BeamSearch:
    params = request.params
    eos = frozenset() if params.ignore_eos else request.eos_token_ids
    length_limit = max_model_len - request.num_prompt_tokens
    max_new_tokens = length_limit if params.max_tokens is None else min(params.max_tokens, length_limit)
    search = BeamSearch(params.best_of, params.n, params.length_penalty, params.early_stopping, max_new_tokens,
                        eos | frozenset(params.stop_token_ids))
    search.scores[request.sequences[0].seq_id] = 0.0
    return search


def on_beam_candidates(seq: Sequence, logprob: TokenLogprob) -> BeamStep:
    """Record one beam's candidates; once every running beam has them, take the beam step."""
    request = seq.request
    search = request.beam_search
    assert search is not None  # only called for beam search requests
    search.pending[seq.seq_id] = logprob.top
    if any(beam.seq_id not in search.pending for beam in request.sequences):
        return BeamStep()
    running = search.step([RunningBeam(beam.seq_id, beam.output_token_ids, search.scores[beam.seq_id],
                                       search.pending[beam.seq_id]) for beam in request.sequences])
    search.pending.clear()
    num_generated_tokens = len(request.sequences)
    if search.done:
        return _finish(request, num_generated_tokens)
    return _advance(request, running, num_generated_tokens)


def _advance(request: Request, running: list[Continuation], num_generated_tokens: int) -> BeamStep:
    search = request.beam_search
    assert search is not None
    parents = {beam.seq_id: beam for beam in request.sequences}
    tokens_before = {beam.seq_id: list(beam.token_ids) for beam in request.sequences}
    extended: set[int] = set()
    new_beams: list[Sequence] = []
    forks: list[Sequence] = []
    search.scores = {}
    for continuation in running:
        parent = parents[continuation.parent_key]
        if parent.seq_id not in extended:
            extended.add(parent.seq_id)
            parent.token_ids.append(continuation.token_id)
            beam = parent
        else:
            # choice_index 1: a fork must not report the prompt's logprobs again (choice 0 does).
            beam = Sequence(request, choice_index=1, token_ids=[*tokens_before[parent.seq_id], continuation.token_id],
                            mirostat_mu=parent.mirostat_mu)
            forks.append(beam)
        new_beams.append(beam)
        search.scores[beam.seq_id] = continuation.score
    request.sequences = new_beams  # before the losers finish, so the request stays open
    losers = [beam for beam in parents.values() if beam.seq_id not in extended]
    return BeamStep(num_generated_tokens, finished=losers, forks=forks)


def _finish(request: Request, num_generated_tokens: int) -> BeamStep:
    search = request.beam_search
    assert search is not None
    num_cached_tokens = min(beam.num_cached_tokens for beam in request.sequences)
    finished = list(request.sequences)
    request.beam_results = search.results()
    events = []
    for index, hypothesis in enumerate(request.beam_results):
        last_token = hypothesis.output_token_ids[-1]
        reason = FinishReason.STOP if hypothesis.ends_with_stop_token else FinishReason.LENGTH
        stop_reason = last_token if last_token in request.params.stop_token_ids else None
        for position, token_id in enumerate(hypothesis.output_token_ids):
            is_last = position == len(hypothesis.output_token_ids) - 1
            events.append(TokenEvent(request.request_id, index, token_id,
                                     finish_reason=str(reason) if is_last else None,
                                     stop_reason=stop_reason if is_last else None,
                                     num_cached_tokens=num_cached_tokens))
    return BeamStep(num_generated_tokens, finished=finished, events=events)
