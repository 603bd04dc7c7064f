"""Which reply stream a request may name in `reply_to` (docs/design.md §3, "Who may write where").

- No `reply_to`, or `{prefix}:out:{id}`: the request's own stream, held through its owner key
  (actors/worker/recovery/ownership.py) like the id itself.
- Anything else is a shared stream: it must match `--reply-to-pattern` (default `{prefix}:out:*`)
  and lie outside the deployment's own keys (requests, control, dead letters, owner records,
  heartbeats, edges, the gateway's request ids). When it has the shape of another id's own stream,
  `{prefix}:out:{other}`, it is claimed as shared in that id's owner record: refused while a request
  `other` holds the record, and a later request `other` is refused (a conflict) while it is shared.
"""

from __future__ import annotations

import fnmatch

from actors.worker.recovery.ownership import stream_owner_id

# Keys under the prefix that are never reply streams: a reply written into one would corrupt it
# (an owner record that is a stream breaks every claim of its id).
_RESERVED = ("requests", "control", "dead", "owner", "worker", "rid", "edge", "placement")


def default_reply_to(prefix: str, request_id: str) -> str:
    return f"{prefix}:out:{request_id}"


def reply_to_allowed(reply_to: str, prefix: str, pattern: str | None = None) -> bool:
    """Whether a worker may write replies to `reply_to`: a key under `{prefix}:out:`, or matching `pattern`
    (a glob, e.g. 'myapp:replies:*') when one is set, and never one of the deployment's own keys (a
    client must not be able to make a worker write into them)."""
    if any(reply_to == f"{prefix}:{name}" or reply_to.startswith(f"{prefix}:{name}:") for name in _RESERVED):
        return False
    if pattern is not None:
        return fnmatch.fnmatchcase(reply_to, pattern)
    return reply_to.startswith(f"{prefix}:out:")


def shared_stream_of(reply_to: str, prefix: str, request_id: str) -> str:
    """The other request id whose own stream this request's `reply_to` is ("" when none: its own
    stream, or a key no request id maps to)."""
    owner = stream_owner_id(reply_to, prefix)
    return owner if owner is not None and owner != request_id else ""
