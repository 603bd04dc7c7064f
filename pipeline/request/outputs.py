"""What the engine reports per step: one RequestDelta per request that advanced (docs/design.md §3 reply entry)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]] = field(default_factory=list)  # best first


@dataclass(slots=True)
class ChoiceDelta:
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    mirostat_mu: float | None = None  # the choice's mu after these tokens (resume state), mirostat only


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class RequestDelta:
    request_id: str
    seq: int  # dense per request: 0, 1, 2, ...
    choices: list[ChoiceDelta]
    usage: Usage | None = None  # on the final delta
    error: dict[str, str] | None = None  # {code, message} on a final error delta
    # On the first delta of a request that asked: one entry per prompt token (None for the first).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_token_ids: list[int] | None = None  # with prompt_logprobs: the prompt as tokenized
    num_prompt_tokens: int | None = None  # on the first delta (seq 0): usage so far for streams that ask
    embedding: bytes | None = None  # an embedding request's vector (little-endian float32), on its one delta

    @property
    def finished(self) -> bool:
        return self.usage is not None or self.error is not None


@dataclass(slots=True)
class TokenEvent:
    """Scheduler -> Output: a choice got a token and/or ended."""

    request_id: str
    choice_index: int
    token_id: int | None  # None: the choice ended without a new token (abort, timeout)
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    mirostat_mu: float | None = None  # mirostat choices: mu after this token
    # The token completed the choice's grammar (structured outputs): it ends the choice with "stop"
    # like EOS does, but it is text, shown like any other token.
    grammar_complete: bool = False


@dataclass(slots=True)
class PromptLogprobsEvent:
    """Scheduler -> Output: prompt logprobs computed in one step (a chunk of the prompt)."""

    request_id: str
    entries: list[TokenLogprob]


@dataclass(slots=True)
class StopStringFinish:
    """Output -> Scheduler: a stop string ended this choice; free its sequence."""

    request_id: str
    choice_index: int
    stop_string: str
