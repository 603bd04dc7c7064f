"""Who owns a file or a batch: the tenant of the API key that made it (--api-keys; docs/deployment.md#tenants-and-
fair-share), or, with one key or none, the one tenant `default`. Another tenant's ids read as unknown (404).
A batch's lines run as its owner's tenant, for the workers' fair share."""

from __future__ import annotations

from starlette.requests import Request

from actors.http.tenancy.api_keys import DEFAULT_TENANT, ApiKeys, Tenant
from actors.http.tenancy.tenants import key_tenant


def owner_of(request: Request, api_key: str | ApiKeys | None) -> tuple[str, Tenant | None]:
    """(the owner's name, the tenant its batches' lines run as: None for the workers' default one). The
    request's key was checked already."""
    tenant = key_tenant(request, api_key) if isinstance(api_key, ApiKeys) else None
    return (tenant.name if tenant is not None else DEFAULT_TENANT), tenant
