"""The gateway's options (no web imports: the CLI builds them before loading the web stack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.http.tenancy.api_keys import ApiKeys


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """The Batch API's bounds (/v1/files, /v1/batches: actors/http/batches/)."""

    max_file_bytes: int = 64 * 1024 * 1024  # --batch-max-file-bytes: a larger upload is a 413
    max_lines: int = 50_000  # --batch-max-lines: requests in one input file (OpenAI's limit)
    max_in_flight: int = 32  # --batch-max-in-flight: lines of one batch submitted and not yet answered
    max_running: int = 4  # --batch-max-running: batches one gateway runs at once (the rest wait their turn)
    lease_s: float = 15.0  # a gateway that stops renewing its hold on a batch for this long loses it to another

    @property
    def max_lines_in_flight(self) -> int:
        """Lines one gateway may have in flight over all its batches (each holds a Redis connection)."""
        return self.max_in_flight * self.max_running


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    api_key: str | ApiKeys | None = None  # --api-key's one key, or --api-keys' tenants (api_keys.py)
    max_pending: int = 256  # requests in flight through this gateway; more get 429
    worker_timeout_s: float = 60.0  # no reply entry within this: 503 (no worker is answering)
    request_timeout_s: float | None = None  # becomes the wire deadline_ms
    max_request_bytes: int = 4 * 1024 * 1024
    metrics_open: bool = False  # /metrics without the API key (it names adapters and shows load)
    served_model_names: tuple[str, ...] = ()  # --served-model-name: the first is reported, all are accepted
    allowed_origins: tuple[str, ...] = ()  # CORS (--allowed-origins); none: no CORS headers
    strict_fields: bool = False  # --strict-fields: an unknown request field is a 400, not ignored and named
    # --tool-call-parser, set when --enable-auto-tool-choice is on: tool_choice "auto" reads calls with it
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None  # --reasoning-parser: chat answers' reasoning split from their content
    # --default-chat-template-kwargs: the chat template's variables, under each request's own
    default_chat_template_kwargs: dict[str, Any] | None = None
    # --enable-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING): mount /v1/load_lora_adapter
    # and /v1/unload_lora_adapter; their paths must lie under lora_root (--lora-root) when it is set
    runtime_lora_updating: bool = False
    lora_root: str | None = None
    batches: BatchOptions = BatchOptions()  # the Batch API's bounds (--batch-* flags)
