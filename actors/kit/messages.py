"""Envelopes between actors that carry more than a pipeline object (the engine's own messages,
StepPlan, PreparedStep, StepResult, TokenEvent, StopStringFinish, travel as they are)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from pipeline.request.image_input import ImageInput
from pipeline.request.outputs import PromptLogprobsEvent, TokenEvent
from pipeline.request.request import FinishReason, Request, ResumeState
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.result import StepResult
from queue_adapters.base import Delivery


@dataclass(slots=True)
class Admit:
    """Intake -> Scheduler: a validated request, as plain data (the edge may be a Redis stream)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    eos_token_ids: list[int]
    deadline_ms: int | None = None
    resume: ResumeState | None = None  # set when continuing a request another worker started
    lora_name: str | None = None  # the LoRA adapter, by name and by this worker's registry id
    lora_id: int | None = None
    images: list[ImageInput] = field(default_factory=list)  # preprocessed, at their placeholder positions
    priority: int = 0  # the scheduling order (pipeline/scheduling/waiting_queue.py)
    tenant: str | None = None  # fair share between tenants (pipeline/scheduling/fair_share.py)
    tenant_weight: float = 1.0

    @classmethod
    def of(cls, request: Request, deadline_ms: int | None, resume: ResumeState | None = None) -> Admit:
        return cls(request.request_id, request.prompt_token_ids, request.params, request.seed,
                   sorted(request.eos_token_ids), deadline_ms, resume, request.lora_name, request.lora_id,
                   list(request.images), request.priority, request.tenant, request.tenant_weight)

    def to_request(self) -> Request:
        request = Request(request_id=self.request_id, prompt_token_ids=self.prompt_token_ids, params=self.params,
                          seed=self.seed, eos_token_ids=frozenset(self.eos_token_ids), lora_name=self.lora_name,
                          lora_id=self.lora_id, images=tuple(self.images), priority=self.priority,
                          tenant=self.tenant, tenant_weight=self.tenant_weight)
        if self.resume is not None:
            request.resume_from(self.resume)
        return request


@dataclass(slots=True)
class OpenReply:
    """Intake -> Output: where a request's replies go, and the delivery to ack after the last one."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    reply_to: str
    delivery: Delivery | None
    arrival_s: float
    resume: ResumeState | None = None


@dataclass(slots=True)
class ErrorReply:
    """Intake -> Output: a request rejected before it reached the scheduler."""

    request_id: str
    reply_to: str
    code: str
    message: str
    delivery: Delivery | None
    seq: int = 0  # after the entries a previous worker already wrote


@dataclass(slots=True)
class RequestFailed:
    """Scheduler -> Output: a request ended with an error before it produced anything."""

    request_id: str
    code: str
    message: str


@dataclass(slots=True)
class Cancel:
    """Control / deadline -> Scheduler."""

    request_id: str
    reason: FinishReason = FinishReason.ABORT


@dataclass(slots=True)
class PendingStep:
    """GPU -> Sampling (memory only: a future of the device thread never crosses a process).

    `result` is the step's forward and sampling, still queued or running on the device thread."""

    step_id: int
    result: Future[StepResult]


@dataclass(slots=True)
class StepEvents:
    """Scheduler -> Output: everything one step (or a cancel) produced; prompt logprobs first."""

    tokens: list[TokenEvent] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprobsEvent] = field(default_factory=list)

    @classmethod
    def of(cls, events: list[TokenEvent | PromptLogprobsEvent]) -> StepEvents:
        return cls([e for e in events if isinstance(e, TokenEvent)],
                   [e for e in events if isinstance(e, PromptLogprobsEvent)])

    def all(self) -> list[TokenEvent | PromptLogprobsEvent]:
        return [*self.prompt_logprobs, *self.tokens]


@dataclass(slots=True)
class Embed:
    """Intake -> Embed actor: an embedding request, checked (--runner pooling)."""

    request_id: str
    prompt_token_ids: list[int]
    dimensions: int | None = None
    deadline_ms: int | None = None  # unix ms; not embedded once past it


@dataclass(slots=True)
class Embedded:
    """Embed actor -> Output: a request's vector (little-endian float32 bytes)."""

    request_id: str
    embedding: bytes
    num_prompt_tokens: int


@dataclass(slots=True)
class EmbedStopped:
    """Embed actor -> Output: an embedding request ended before it was embedded (abort: cancelled;
    timeout: past its deadline)."""

    request_id: str
    num_prompt_tokens: int
    finish_reason: str
