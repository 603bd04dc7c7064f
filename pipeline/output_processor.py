"""Turns sampled tokens into per-request deltas: incremental text, stop strings, logprobs, usage.

Per choice it keeps a detokenizer and a stop-string matcher; per request, the dense `seq`
counter of the reply stream. A stop string found here ends the sequence: the caller tells the
scheduler, which frees its blocks before the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.detokenizer import IncrementalDetokenizer
from pipeline.outputs import ChoiceDelta, RequestDelta, TokenLogprob, Usage
from pipeline.request import FinishReason, Request, Sequence
from pipeline.stop import StopStringMatcher


@dataclass(slots=True)
class _ChoiceState:
    detokenizer: IncrementalDetokenizer | None
    stop_matcher: StopStringMatcher
    new_token_ids: list[int] = field(default_factory=list)
    new_text: list[str] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    reported_finish: bool = False


@dataclass(slots=True)
class _RequestState:
    request: Request
    choices: list[_ChoiceState]
    next_seq: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False


class OutputProcessor:
    def __init__(self, tokenizer: object | None) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}

    def add_request(self, request: Request) -> None:
        params = request.params
        choices = [
            _ChoiceState(
                detokenizer=(IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                                    params.skip_special_tokens)
                             if self.tokenizer is not None else None),
                stop_matcher=StopStringMatcher(params.stop, params.include_stop_str_in_output),
            )
            for _ in range(params.n)
        ]
        state = _RequestState(request, choices)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]  # the first prompt token has no context to score it
        self._states[request.request_id] = state

    def on_token(self, seq: Sequence, token_id: int, logprob: TokenLogprob | None) -> str | None:
        """Record one sampled token (already appended by the scheduler). Returns the stop string
        it completed, if any."""
        choice = self._states[seq.request.request_id].choices[seq.choice_index]
        choice.new_token_ids.append(token_id)
        if logprob is not None:
            choice.new_logprobs.append(logprob)
        if choice.detokenizer is None or self._ends_on_hidden_stop_token(seq):
            return None
        text, matched = choice.stop_matcher.feed(choice.detokenizer.add([token_id]))
        choice.new_text.append(text)
        return matched

    def on_prompt_logprobs(self, request_id: str, entries: list[TokenLogprob]) -> None:
        state = self._states[request_id]
        if state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(entries)

    def collect(self, request: Request) -> RequestDelta:
        """The delta of this step for a request whose choices advanced or finished."""
        state = self._states[request.request_id]
        choices = [self._choice_delta(seq, state.choices[seq.choice_index]) for seq in request.sequences]
        delta = RequestDelta(request.request_id, state.next_seq, [c for c in choices if c is not None])
        state.next_seq += 1
        if state.prompt_logprobs is not None and not state.prompt_logprobs_sent \
                and len(state.prompt_logprobs) >= request.num_prompt_tokens:
            delta.prompt_logprobs = state.prompt_logprobs
            state.prompt_logprobs_sent = True
        if request.is_finished:
            delta.usage = Usage(
                prompt_tokens=request.num_prompt_tokens,
                completion_tokens=sum(seq.num_output_tokens for seq in request.sequences),
                cached_tokens=min(seq.num_cached_tokens for seq in request.sequences),
            )
            del self._states[request.request_id]
        return delta

    def error_delta(self, request_id: str, code: str, message: str) -> RequestDelta:
        state = self._states.pop(request_id, None)
        seq = state.next_seq if state is not None else 0
        return RequestDelta(request_id, seq, [], error={"code": code, "message": message})

    def _choice_delta(self, seq: Sequence, choice: _ChoiceState) -> ChoiceDelta | None:
        if choice.reported_finish or (not choice.new_token_ids and not seq.is_finished):
            return None
        if seq.is_finished:
            choice.new_text.append(self._flush(seq, choice))
            choice.reported_finish = True
        delta = ChoiceDelta(
            index=seq.choice_index,
            token_ids=choice.new_token_ids,
            text="".join(choice.new_text),
            logprobs=choice.new_logprobs if seq.params.logprobs is not None else None,
            finish_reason=str(seq.finish_reason) if seq.is_finished else None,
            stop_reason=seq.stop_reason,
        )
        choice.new_token_ids, choice.new_text, choice.new_logprobs = [], [], []
        return delta

    @staticmethod
    def _flush(seq: Sequence, choice: _ChoiceState) -> str:
        """Held-back text of a sequence that ended for a reason other than a stop string."""
        if choice.detokenizer is None or isinstance(seq.stop_reason, str):
            return ""
        held = choice.detokenizer.finish()
        text, _ = choice.stop_matcher.feed(held)
        return text + choice.stop_matcher.flush()

    @staticmethod
    def _ends_on_hidden_stop_token(seq: Sequence) -> bool:
        """EOS / stop_token_ids text is not part of the output unless include_stop_str_in_output."""
        return (seq.finish_reason is FinishReason.STOP and not isinstance(seq.stop_reason, str)
                and not seq.params.include_stop_str_in_output)
