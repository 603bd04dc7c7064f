"""Where the gateway's requests go: the actor graph in this process, or workers behind Redis.

Both speak the wire protocol (docs/design.md §3): submit a WireRequest, read its reply entries in seq order,
cancel by id. Retrying an id that is running or done reads its reply stream from the start instead
of generating again: the workers' idempotency covers Redis; the embedded backend checks its sink.
protocol.py (what the routes may call), remote.py, embedded.py, prompt_render.py (a prompt's ids as
a worker will compute them, for placement).

May import: actors.http.errors, actors.http.request_ids, actors.http.tenancy, actors.kit, actors.worker,
pipeline, queue_adapters.
"""

from actors.http.backends.embedded import EMBEDDED_PREFIX, WORKER_DIED, EmbeddedBackend
from actors.http.backends.prompt_render import prompt_renderer
from actors.http.backends.protocol import Backend
from actors.http.backends.remote import RemoteBackend

__all__ = ["EMBEDDED_PREFIX", "WORKER_DIED", "Backend", "EmbeddedBackend", "RemoteBackend", "prompt_renderer"]
