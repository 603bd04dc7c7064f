"""What the Batch API stores: a file's record (its bytes are kept beside it) and a batch's, each one JSON
text, and the OpenAI objects shown for them (`file`, `batch`).

Ids are the server's own: `file-` and 32 hex digits for an upload, `batch_` and 32 hex digits for a batch,
and `file-{the batch's hex}-output` / `-errors` for a batch's results (the same ids when a restarted
gateway writes them again). A batch's line runs under the wire id `{batch id}-{line index}`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

FILE_TTL_S = 30 * 24 * 3600  # as OpenAI keeps batch files: 30 days unless expires_after says otherwise
_FILE_ID = re.compile(r"file-[0-9a-f]{32}(-output|-errors)?")
_BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def is_file_id(text: str) -> bool:
    """Whether `text` could name a stored file (anything else is unknown without asking the store)."""
    return _FILE_ID.fullmatch(text) is not None


def is_batch_id(text: str) -> bool:
    return _BATCH_ID.fullmatch(text) is not None


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's `output` or `errors` file."""
    return f"file-{batch_id.removeprefix('batch_')}-{kind}"


def line_wire_id(batch_id: str, index: int) -> str:
    """A line's wire id: the same on every gateway and after a restart, so resubmitting it reads the reply
    stream the workers already wrote (their idempotency) instead of generating again."""
    return f"{batch_id}-{index}"


@dataclass(slots=True)
class FileRecord:
    id: str
    owner: str  # the tenant it belongs to (routes.py's owner_of); another tenant never sees it
    bytes: int
    created_at: int
    filename: str
    purpose: str  # batch (uploads), batch_output (a batch's results)
    expires_at: int

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> FileRecord:
        return cls(**json.loads(text))

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


@dataclass(slots=True)
class BatchRecord:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int  # created_at + the completion window: lines not answered by then are `batch_expired`
    total: int  # the input file's requests (its non-blank lines)
    tenant: str | None = None  # the wire tenant of its lines, for the workers' fair share
    tenant_weight: float = 1.0
    metadata: dict[str, str] | None = None
    output_ttl_s: int = FILE_TTL_S  # output_expires_after.seconds
    status: str = "validating"
    errors: list[dict[str, Any]] | None = None  # why a batch failed before running (OpenAI's `errors.data`)
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int] = field(default_factory=dict)  # in_progress_at, finalizing_at, completed_at, ...
    completed: int = 0  # lines answered 200 (kept apart by the stores, which count them exactly)
    failed: int = 0  # lines answered otherwise
    cancelling_at: int | None = None  # when a cancel was asked for (kept apart: any gateway may ask)

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> BatchRecord:
        return cls(**json.loads(text))

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def shown_status(self) -> str:
        """`cancelling` from the moment a cancel is asked for until the runner has ended the batch."""
        return "cancelling" if self.cancelling_at is not None and not self.finished else self.status

    def as_openai(self) -> dict[str, Any]:
        times = {name: self.times.get(name) for name in ("in_progress_at", "finalizing_at", "completed_at",
                                                         "failed_at", "expired_at", "cancelled_at")}
        errors = {"object": "list", "data": self.errors} if self.errors else None
        return {"id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
                "input_file_id": self.input_file_id, "completion_window": self.completion_window,
                "status": self.shown_status(), "output_file_id": self.output_file_id,
                "error_file_id": self.error_file_id, "created_at": self.created_at, "expires_at": self.expires_at,
                "cancelling_at": self.cancelling_at, **times, "metadata": self.metadata,
                "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed}}
