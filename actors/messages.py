"""Envelopes between actors that carry more than a pipeline object (the engine's own messages,
StepPlan, PreparedStep, StepResult, TokenEvent, StopStringFinish, travel as they are)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.outputs import PromptLogprobsEvent, TokenEvent
from pipeline.request import FinishReason, Request
from pipeline.tensor_prep import PreparedStep
from queue_adapters.base import Delivery


@dataclass(slots=True)
class Admit:
    """Intake -> Scheduler: a validated request."""

    request: Request
    deadline_ms: int | None = None


@dataclass(slots=True)
class OpenReply:
    """Intake -> Output: where a request's replies go, and the delivery to ack after the last one."""

    request_id: str
    prompt_token_ids: list[int]
    request: Request
    reply_to: str
    delivery: Delivery | None
    arrival_s: float


@dataclass(slots=True)
class ErrorReply:
    """Intake -> Output: a request rejected before it reached the scheduler."""

    request_id: str
    reply_to: str
    code: str
    message: str
    delivery: Delivery | None


@dataclass(slots=True)
class Cancel:
    """Control / deadline -> Scheduler."""

    request_id: str
    reason: FinishReason = FinishReason.ABORT


@dataclass(slots=True)
class ForwardOutput:
    """GPU -> Sampling (memory only: device tensors never cross a process)."""

    prepared: PreparedStep
    logits: torch.Tensor


@dataclass(slots=True)
class StepEvents:
    """Scheduler -> Output: everything one step (or a cancel) produced."""

    events: list[TokenEvent | PromptLogprobsEvent] = field(default_factory=list)
