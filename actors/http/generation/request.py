"""A generation request as the flow (flow.py) runs it, whatever API it came in: its wire requests (one
per prompt), whether it streams, and the unknown top-level fields its parser took off, which every
answer names in `X-Ignored-Fields`. A protocol whose answers need more subclasses it
(actors/http/openai/parse.py's `OpenAIRequest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from queue_adapters.codec import WireRequest

IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
_MAX_NAMED = 32  # a header and a log line stay bounded whatever the body holds


@dataclass(frozen=True, slots=True)
class IdClaim:
    request_ids: list[str]  # as the client named them, before its tenant's namespace
    fingerprint: str  # request_ids.request_fingerprint of its key and body


@dataclass(slots=True)
class GatewayRequest:
    wires: list[WireRequest]  # one per prompt (chat: one)
    chat: bool  # messages, which the chat template renders, rather than the client's own prompt
    stream: bool
    response_id: str = ""
    ignored_fields: tuple[str, ...] = ()  # unknown top-level fields taken off (actors/http/openai/unknown_fields.py)
    user: str | None = None  # OpenAI's `user`: splits a shared key's fair share (actors/http/tenancy/tenants.py)
    # The client chose the id (X-Request-Id): the ids it names (its own and each prompt's) and who asked
    # what, bound once its tenant is known (Generation.claim_ids, actors/http/tenancy/id_namespaces.py).
    id_claim: IdClaim | None = None

    @property
    def wire(self) -> WireRequest:
        """The first prompt's wire request (the only one but for a list of prompts)."""
        return self.wires[0]

    @property
    def n(self) -> int:
        """Choices per prompt."""
        return int(self.wire.params.get("n", 1) or 1)

    @property
    def num_choices(self) -> int:
        return self.n * len(self.wires)


def ignored_fields_header(names: tuple[str, ...]) -> dict[str, str]:
    """`X-Ignored-Fields: a, b` (names percent-encoded: a header is ASCII; at most 32, then `...`)."""
    if not names:
        return {}
    shown = [quote(name[:64], safe="") for name in names[:_MAX_NAMED]]
    return {IGNORED_FIELDS_HEADER: ", ".join(shown) + (", ..." if len(names) > _MAX_NAMED else "")}


def bounded_names(names: tuple[str, ...]) -> list[str]:
    """The names as a log line shows them (the first 32, each cut at 64 characters)."""
    return [name[:64] for name in names[:_MAX_NAMED]]
