"""A request's tenant, which the gateway sets on its wire requests for the worker's fair share
(docs/deployment.md#tenants-and-fair-share).

Under --api-keys the tenant is the key's. Where one key is shared (no key file, --api-key, or a file
of one key) the callers behind it are told apart by OpenAI's `user` field: the tenant becomes
`{key's tenant}/{user}` (`default/{user}` without a file), so each end user gets a share of that
key's. With a file of several keys `user` changes nothing: a client cannot split its own share into
many. A `user` of up to 63 characters of [A-Za-z0-9._@:+=-] is used as given, any other string as
`#` and 32 hex digits of its SHA-256, so a tenant stays within the wire's 128 characters and is a
safe metrics label. No key file and no `user`: no tenant (the worker's default one).
"""

from __future__ import annotations

import hashlib
import re

from starlette.requests import Request

from actors.http.tenancy.api_keys import DEFAULT_TENANT, ApiKeys, Tenant
from queue_adapters.codec import WireRequest

_PLAIN_USER = re.compile(r"^[A-Za-z0-9._@:+=-]{1,63}$")


def presented_keys(request: Request) -> list[str]:
    """The keys a request carries, as Anthropic's clients send one (x-api-key) and OpenAI's (Bearer)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    keys = [request.headers.get("x-api-key", "").strip(), token.strip() if scheme.lower() == "bearer" else ""]
    return [key for key in keys if key]


def key_tenant(request: Request, keys: ApiKeys) -> Tenant | None:
    """The tenant of the first known key the request carries. A route accepted one of them, and the
    sender holds any other that is known, so a bogus second header cannot leave it without a tenant."""
    for key in presented_keys(request):
        tenant = keys.tenant_of(key)
        if tenant is not None:
            return tenant
    return None


def request_tenant(request: Request, api_key: str | ApiKeys | None, user: object = None) -> Tenant | None:
    """The tenant of a request whose key was checked already."""
    keys = api_key if isinstance(api_key, ApiKeys) else None
    base = key_tenant(request, keys) if keys is not None else None
    shared = keys is None or keys.num_keys == 1
    if not shared or not isinstance(user, str) or not user:
        return base
    return Tenant(f"{base.name if base else DEFAULT_TENANT}/{_user_part(user)}", base.weight if base else 1.0)


def _user_part(user: str) -> str:
    if _PLAIN_USER.match(user):
        return user
    return "#" + hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def stamp_tenant(wires: list[WireRequest], tenant: Tenant | None) -> None:
    """Set the tenant on every wire request (whatever a client put there: the gateway decides)."""
    for wire in wires:
        wire.tenant = tenant.name if tenant is not None else None
        wire.tenant_weight = tenant.weight if tenant is not None else 1.0
