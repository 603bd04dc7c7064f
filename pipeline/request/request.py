"""Per-request state. A Request owns `best_of` (= n unless asked) Sequences, one per generated choice;
the scheduler schedules Sequences.

Each choice is an independent sequence with its own KV blocks; choices of one request share
their prompt blocks through the prefix cache.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from pipeline.request.beam_search import BeamSearch, Hypothesis
from pipeline.request.image_input import ImageInput
from pipeline.request.sampling_params import SamplingParams

_seq_counter = itertools.count()
_request_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(slots=True, eq=False)
class Sequence:
    request: Request
    choice_index: int
    token_ids: list[int]  # prompt + outputs
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (or scheduled into it)
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first schedule
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of full blocks, grown lazily
    prefix_keys: list[bytes] = field(default_factory=list)  # their placement keys, when the worker publishes them
    num_published_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_released_blocks: int = 0  # leading blocks released outside the sliding window (now NULL_BLOCK)
    num_sent_tokens: int = 0  # tokens tensor prep has been told about (the rest go in the next plan)
    # The last token is a placeholder for one a step in flight is sampling (pipeline/scheduling/lookahead.py).
    has_placeholder: bool = False
    waiting_since_step: int = 0  # the scheduler step it last joined the waiting queue (priority aging)
    last_scheduled_step: int = -1  # the last step that computed tokens of it (tenants' decode rows rotate by it)
    # Draft tokens a step in flight is verifying after the last token (pipeline/speculative/speculator.py);
    # not part of token_ids until accepted.
    draft_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    mirostat_mu: float | None = None  # mirostat v2's mu after the last token; None = not started (2 tau)
    cumulative_logprob: float = 0.0  # sum of the returned logprobs of the outputs (best_of ranks by it)
    lora_slot: int | None = None  # the device slot of its adapter while it runs (it holds the slot)
    # Structured outputs: the choice's GrammarMatcher (pipeline/grammar/), made when it first samples.
    grammar_matcher: Any = None
    grammar_complete: bool = False  # ended because its grammar could take no further token

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values are known (all but a placeholder)."""
        return len(self.token_ids) - self.has_placeholder

    @property
    def num_prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.request.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.request.num_prompt_tokens:]

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # params.seed, or derived from request_id (docs/design.md §5)
    eos_token_ids: frozenset[int] = frozenset()
    prompt: str | None = None
    cache_salt: int | None = None  # extra prefix-cache key; the LoRA adapter id unless given
    lora_name: str | None = None  # the adapter the client named; None = the base model
    lora_id: int | None = None  # that adapter's id in the LoRARegistry (unique per load)
    images: tuple[ImageInput, ...] = ()  # vision-language models: images at placeholder positions of the prompt
    priority: int = 0  # lower is more urgent (vLLM's meaning); used by the priority scheduling policy
    arrival_order: int = field(default_factory=lambda: next(_request_counter))  # ties between priorities
    # Fair share between tenants of equal priority (pipeline/scheduling/fair_share.py): who sent it (None:
    # the default tenant), its share's weight, and its virtual start, set when it first waits.
    tenant: str | None = None
    tenant_weight: float = 1.0
    virtual_start: float | None = None
    sequences: list[Sequence] = field(default_factory=list)  # under beam search: the running beams
    beam_search: BeamSearch | None = None  # set by the scheduler for use_beam_search requests
    beam_results: list[Hypothesis] | None = None  # the n best hypotheses, once beam search ended

    def __post_init__(self) -> None:
        if self.cache_salt is None:
            self.cache_salt = self.lora_id  # two adapters never share KV blocks; one adapter does
        if not self.sequences:
            self.sequences = [Sequence(self, index, list(self.prompt_token_ids))
                              for index in range(self.params.num_generated_choices)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return all(seq.is_finished for seq in self.sequences)

    def resume_from(self, resume: ResumeState) -> None:
        """Continue where another worker stopped: each choice starts from prompt + the tokens the
        client already has, and is recomputed from there (docs/design.md §5 makes the rest identical);
        mirostat's mu continues from the value the reply stream carries. A best_of > n or beam
        search request streamed nothing, so it simply starts again."""
        if self.params.reports_at_end:
            return
        mirostat_mu = resume.mirostat_mu or [None] * len(self.sequences)
        for seq, outputs, reason, stop_reason, mu in zip(self.sequences, resume.output_token_ids,
                                                         resume.finish_reasons, resume.stop_reasons, mirostat_mu,
                                                         strict=True):
            seq.token_ids = [*self.prompt_token_ids, *outputs]
            seq.mirostat_mu = mu
            if reason is not None:
                seq.finish(FinishReason(reason), stop_reason)


@dataclass(slots=True)
class ResumeState:
    """What a reply stream already holds for a request another worker started (docs/design.md §3)."""

    next_seq: int
    output_token_ids: list[list[int]]  # per choice, tokens already sent to the client
    finish_reasons: list[str | None]  # per choice; set where the client already saw the end
    stop_reasons: list[int | str | None]
    # per choice, mirostat's mu after the tokens already sent (None: not using mirostat, or none sent)
    mirostat_mu: list[float | None] | None = None
