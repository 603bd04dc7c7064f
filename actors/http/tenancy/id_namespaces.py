"""Client-chosen request ids (`X-Request-Id`) per tenant: two tenants may choose the same id.

Reply streams, cancels and crash claims are named by the wire id, so a gateway that put a client's id
on the wire as it came would let two tenants' requests share one reply stream (request_ids.py binds
the first and answers the second 409). So the wire id of a tenant's request with an id of its own is
`{namespace}.{id}`, the namespace being 12 hex digits of the tenant's BLAKE2b hash, and the binding is
made for that wire id. The answers still show the client's id (`response_id`); requests of the
default tenant (none named) keep their ids as given, as on a deployment without tenants. The same
tenant always gets the same namespace, on every gateway, so a retry attaches to its request.

Example: tenants `acme` and `zeta` both send `X-Request-Id: job-7`; their wire ids are
`5f0c...e1.job-7` and `a93b...04.job-7`, each request bound to its own sender and answered as `job-7`.
"""

from __future__ import annotations

import hashlib

from actors.http.tenancy.api_keys import Tenant

NAMESPACE_LENGTH = 13  # 12 hex digits and the dot


def id_namespace(tenant: Tenant | None) -> str:
    if tenant is None:
        return ""
    return hashlib.blake2b(tenant.name.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest() + "."
