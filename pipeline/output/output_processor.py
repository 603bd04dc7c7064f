"""Output stage: token events -> per-request deltas (incremental text, stop strings, logprobs, usage).

It keeps, per choice, a detokenizer and a stop-string matcher, and per request the dense `seq`
counter of the reply stream. A stop string ends a choice here: the caller forwards the returned
StopStringFinish to the scheduler. Between the two, the scheduler may already have run one more
step for that choice; events for a choice that has ended are dropped, so the reply stream never
carries tokens past a stop.

A best_of > n request generates best_of choices and returns only the n with the highest
cumulative logprob; which ones is known only when all have ended, so such a request streams
nothing until then and its one final delta carries the n winners whole, best first (as vLLM does).
Beam search is the same to this stage: its n hypotheses arrive as token events at the very end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from pipeline.output.detokenizer import IncrementalDetokenizer, fast_decoder
from pipeline.output.stop import StopStringMatcher
from pipeline.request.outputs import (
    ChoiceDelta,
    PromptLogprobsEvent,
    RequestDelta,
    StopStringFinish,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from pipeline.request.request import ResumeState
from pipeline.request.sampling_params import SamplingParams

log = structlog.get_logger(__name__)
OutputEvent = TokenEvent | PromptLogprobsEvent


@dataclass(slots=True)
class _Choice:
    detokenizer: IncrementalDetokenizer | None
    stop_matcher: StopStringMatcher
    num_tokens: int = 0
    new_token_ids: list[int] = field(default_factory=list)
    new_text: list[str] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    reported_finish: bool = False
    mirostat_mu: float | None = None  # after the last token (mirostat choices)
    cumulative_logprob: float = 0.0  # best_of ranks choices by it


@dataclass(slots=True)
class _Request:
    params: SamplingParams
    num_prompt_tokens: int
    choices: list[_Choice]
    next_seq: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_token_ids: list[int] | None = None  # sent with prompt_logprobs (their first entry is None)
    prompt_logprobs_sent: bool = False

    @property
    def finished(self) -> bool:
        return all(choice.finish_reason is not None for choice in self.choices)


def _by_request(events: Iterable[OutputEvent]) -> dict[str, list[OutputEvent]]:
    """Events grouped by request id, each request's own order kept (requests are independent)."""
    grouped: dict[str, list[OutputEvent]] = {}
    for event in events:
        grouped.setdefault(event.request_id, []).append(event)
    return grouped


def _replay(choice: _Choice, sent_token_ids: list[int]) -> None:
    """Bring a resumed choice to where the first worker's was: its tokens go through the
    detokenizer and the stop matcher one at a time, as they did there, and the text comes out
    again (the client has it). What that worker still held back comes back held: the tail that
    may begin a stop string, and the bytes of a character split across the crash point."""
    choice.num_tokens = len(sent_token_ids)
    if choice.detokenizer is None or choice.finish_reason is not None:
        return
    for token_id in sent_token_ids:
        choice.stop_matcher.feed(choice.detokenizer.add([token_id]))


class OutputProcessor:
    def __init__(self, tokenizer: object | None) -> None:
        self.tokenizer = fast_decoder(tokenizer) if tokenizer is not None else None
        self._requests: dict[str, _Request] = {}
        self.failed: list[str] = []

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    resume: ResumeState | None = None) -> None:
        # Beam search reports its n results as choices 0..n-1; best_of reports n of best_of choices.
        num_choices = params.n if params.use_beam_search else params.best_of
        if resume is not None and params.reports_at_end:
            resume = ResumeState(resume.next_seq, [[] for _ in range(num_choices)],
                                 [None] * num_choices, [None] * num_choices)  # nothing was streamed
        choices = [
            _Choice(
                detokenizer=(IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                                    params.spaces_between_special_tokens)
                             if self.tokenizer is not None else None),
                stop_matcher=StopStringMatcher(params.stop, params.include_stop_str_in_output),
            )
            for _ in range(num_choices)
        ]
        state = _Request(params, len(prompt_token_ids), choices)
        if resume is not None:
            state.next_seq = resume.next_seq
            state.prompt_logprobs_sent = True  # sent by the first worker, if asked for
            for choice, done, reason, stop_reason in zip(choices, resume.output_token_ids, resume.finish_reasons,
                                                         resume.stop_reasons, strict=True):
                if reason is not None:
                    choice.finish_reason, choice.stop_reason, choice.reported_finish = reason, stop_reason, True
                _replay(choice, done)
        elif params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]  # the first prompt token has no context to score it
            state.prompt_token_ids = list(prompt_token_ids)
        self._requests[request_id] = state

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def process(self, events: Iterable[TokenEvent | PromptLogprobsEvent],
                ) -> tuple[list[RequestDelta], list[StopStringFinish]]:
        """Apply one step's events; returns the deltas of the requests that advanced, and the
        choices that a stop string ended.

        A request whose events raise (in its detokenizer or stop matcher) gets an error delta
        instead, and its id is kept for `take_failed` (the caller aborts it in the scheduler): one
        request's fault must not stop the stage, or every other request with it."""
        deltas: list[RequestDelta] = []
        finishes: list[StopStringFinish] = []
        for request_id, request_events in _by_request(events).items():
            state = self._requests.get(request_id)
            if state is None:
                continue  # already answered (e.g. finished by a stop string, then aborted)
            try:
                delta = self._process_request(request_id, state, request_events, finishes)
            except Exception as error:
                log.warning("output processing failed for a request", request_id=request_id, exc_info=error)
                self.failed.append(request_id)
                delta = self.error_delta(request_id, "request_failed",
                                         f"output processing failed: {type(error).__name__}: {error}")
            if delta is not None:
                deltas.append(delta)
        return deltas, finishes

    def take_failed(self) -> list[str]:
        """Requests `process` ended with an error since the last call (they may still be scheduled)."""
        failed, self.failed = self.failed, []
        return failed

    def _process_request(self, request_id: str, state: _Request, events: list[OutputEvent],
                         finishes: list[StopStringFinish]) -> RequestDelta | None:
        advanced = False
        new_finishes = []
        for event in events:
            if isinstance(event, PromptLogprobsEvent):
                if state.prompt_logprobs is not None:
                    state.prompt_logprobs.extend(event.entries)
                continue
            stop_string = self._on_token(state, event)
            if stop_string is not None:
                new_finishes.append(StopStringFinish(request_id, event.choice_index, stop_string))
            advanced = True
        # A best_of > n or beam search request reports once, when its winners are known.
        delta = self._collect(request_id, state) if advanced and (
            state.finished or not state.params.reports_at_end) else None
        finishes.extend(new_finishes)  # only once nothing of this request can raise any more
        return delta

    def embedding_delta(self, request_id: str, embedding: bytes | None, num_prompt_tokens: int,
                        finish_reason: str = "stop") -> RequestDelta:
        """An embedding request's one and final delta: its vector (None: it ended unembedded, cancelled or
        past its deadline, with that finish reason), and usage (no completion tokens)."""
        state = self._requests.pop(request_id, None)
        return RequestDelta(request_id, state.next_seq if state else 0,
                            [ChoiceDelta(0, [], "", finish_reason=finish_reason)], usage=Usage(num_prompt_tokens, 0, 0),
                            num_prompt_tokens=num_prompt_tokens, embedding=embedding)

    def error_delta(self, request_id: str, code: str, message: str) -> RequestDelta:
        state = self._requests.pop(request_id, None)
        return RequestDelta(request_id, state.next_seq if state else 0, [], error={"code": code, "message": message})

    # ---- per event ---------------------------------------------------------------------------

    def _on_token(self, state: _Request, event: TokenEvent) -> str | None:
        choice = state.choices[event.choice_index]
        if choice.finish_reason is not None:
            return None  # ended here already; the scheduler had not heard yet
        if event.choice_index == 0:  # later choices may hit blocks the first one just cached
            state.num_cached_tokens = event.num_cached_tokens
        stop_string = None
        if event.token_id is not None:
            stop_string = self._append(state, choice, event)
        if stop_string is not None:
            choice.finish_reason, choice.stop_reason = "stop", stop_string
        elif event.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = event.finish_reason, event.stop_reason
            choice.new_text.append(self._flush(choice))
        return stop_string

    def _append(self, state: _Request, choice: _Choice, event: TokenEvent) -> str | None:
        choice.num_tokens += 1
        choice.new_token_ids.append(event.token_id)
        if event.mirostat_mu is not None:
            choice.mirostat_mu = event.mirostat_mu
        if event.logprob is not None:
            choice.new_logprobs.append(event.logprob)
            choice.cumulative_logprob += event.logprob.logprob
        # EOS / stop_token_ids text is not part of the output unless include_stop_str_in_output.
        hidden = (event.finish_reason == "stop" and not isinstance(event.stop_reason, str)
                  and not event.grammar_complete and not state.params.include_stop_str_in_output)
        if choice.detokenizer is None or hidden:
            return None
        text, matched = choice.stop_matcher.feed(choice.detokenizer.add([event.token_id]))
        choice.new_text.append(text)
        return matched

    @staticmethod
    def _flush(choice: _Choice) -> str:
        """Held-back text of a choice that ended for a reason other than a stop string."""
        if choice.detokenizer is None:
            return ""
        text, _ = choice.stop_matcher.feed(choice.detokenizer.finish())
        return text + choice.stop_matcher.flush()

    # ---- deltas ------------------------------------------------------------------------------

    def _collect(self, request_id: str, state: _Request) -> RequestDelta:
        choices = [delta for index, choice in enumerate(self._reported_choices(state))
                   if (delta := self._choice_delta(index, choice, state.params)) is not None]
        delta = RequestDelta(request_id, state.next_seq, choices)
        if state.next_seq == 0:
            delta.num_prompt_tokens = state.num_prompt_tokens
        state.next_seq += 1
        if state.prompt_logprobs is not None and not state.prompt_logprobs_sent \
                and len(state.prompt_logprobs) >= state.num_prompt_tokens:
            delta.prompt_logprobs, delta.prompt_token_ids = state.prompt_logprobs, state.prompt_token_ids
            state.prompt_logprobs_sent = True
        if state.finished:
            delta.usage = Usage(prompt_tokens=state.num_prompt_tokens,
                                completion_tokens=sum(choice.num_tokens for choice in state.choices),
                                cached_tokens=state.num_cached_tokens)
            del self._requests[request_id]
        return delta

    @staticmethod
    def _reported_choices(state: _Request) -> list[_Choice]:
        """All choices, or for best_of > n the n best by cumulative logprob, best first (stable on ties)."""
        if not state.params.ranks_choices:
            return state.choices
        ranked = sorted(state.choices, key=lambda choice: -choice.cumulative_logprob)
        return ranked[:state.params.n]

    @staticmethod
    def _choice_delta(index: int, choice: _Choice, params: SamplingParams) -> ChoiceDelta | None:
        if choice.reported_finish or (not choice.new_token_ids and choice.finish_reason is None):
            return None
        choice.reported_finish = choice.finish_reason is not None
        delta = ChoiceDelta(
            index=index,
            token_ids=choice.new_token_ids,
            text="".join(choice.new_text),
            logprobs=choice.new_logprobs if params.logprobs is not None else None,
            finish_reason=choice.finish_reason,
            stop_reason=choice.stop_reason,
            # With the tokens it belongs to, so a resumed choice continues from the same mu.
            mirostat_mu=choice.mirostat_mu if choice.new_token_ids else None,
        )
        choice.new_token_ids, choice.new_text, choice.new_logprobs = [], [], []
        return delta
