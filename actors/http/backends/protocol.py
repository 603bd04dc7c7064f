"""What every backend offers the routes: the wire protocol's submit, replies and cancel, and the rest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from actors.worker.metrics import WorkerMetrics
from queue_adapters.client import ControlAnswers
from queue_adapters.codec import WireControl, WireReply, WireRequest


class Backend(Protocol):
    model_name: str
    pooling: bool  # started with --runner pooling: /v1/embeddings, not completions or chat
    tokenizer: Any
    max_model_len: int | None
    worker_metrics: WorkerMetrics | None  # the engine's own metrics when it runs in this process

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(self, request: WireRequest) -> None: ...

    async def submit_all(self, requests: list[WireRequest]) -> None:
        """Submit one client request's prompts, which pass the tenant's fair-share gate together."""
        ...

    def replies(self, request: WireRequest) -> AsyncIterator[WireReply]: ...

    async def cancel(self, request_id: str) -> None: ...

    async def healthy(self) -> bool: ...

    def adapter_names(self) -> list[str]:
        """LoRA adapters a request's `model` may name (besides the base model)."""
        ...

    def adapter_root(self, name: str) -> str:
        """Where adapter `name` was loaded from (/v1/models' `root`); its name when not known here."""
        ...

    async def change_lora(self, control: WireControl, lora_root: Path | None, timeout_s: float) -> ControlAnswers:
        """Apply a load_lora / unload_lora control entry (the runtime LoRA routes): in this process, or on
        every live worker; their answers, and the workers that gave none within `timeout_s`."""
        ...

    async def workers_alive(self) -> bool:
        """Whether anyone will eventually answer: a request waiting behind others is not a 503."""
        ...
