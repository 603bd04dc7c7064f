"""`--api-keys FILE`: many API keys, each naming its tenant and the weight of its fair share
(docs/deployment.md#tenants-and-fair-share). No web imports: the CLI reads the file before the web stack.

One key per line, `key,tenant[,weight]`; blank lines and lines starting with `#` are skipped:

    # key,tenant,weight
    sk-live-7f3a,acme,3
    sk-live-91bc,globex

A key is looked up by its SHA-256 digest, so the time a wrong key takes to refuse does not depend on
how much of a real key it shares (as hmac.compare_digest does for the single --api-key).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

from queue_adapters.codec import MAX_TENANT_WEIGHT, MIN_TENANT_WEIGHT

# A key file's tenant: no `/` (the `user` field's split adds one), nothing a metrics label or log line
# would need escaped, and room for `/{user}` within the wire's 128 characters (tenants.py).
TENANT_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
_KEY = re.compile(r"^[\x21-\x7e]{1,512}$")  # printable ASCII, no space: as an HTTP header carries it
DEFAULT_TENANT = "default"  # whose share `user` splits when there is no key file


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    weight: float = 1.0


class ApiKeys:
    def __init__(self, tenants: dict[str, Tenant]) -> None:
        """`tenants`: key -> its tenant."""
        if not tenants:
            raise ValueError("--api-keys: the file holds no key")
        self._by_digest = {_digest(key): tenant for key, tenant in tenants.items()}

    def tenant_of(self, key: str) -> Tenant | None:
        """The key's tenant; None for an unknown key."""
        return self._by_digest.get(_digest(key))

    @property
    def num_keys(self) -> int:
        return len(self._by_digest)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def load_api_keys(path: str | Path) -> ApiKeys:
    """ValueError naming the file and line of the first bad entry."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--api-keys: cannot read {path}: {error}") from error
    return parse_api_keys(text, str(path))


def parse_api_keys(text: str, source: str = "--api-keys") -> ApiKeys:
    tenants: dict[str, Tenant] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key, tenant = _entry(line)
        except ValueError as error:
            raise ValueError(f"{source} line {number}: {error}") from None
        if key in tenants:
            raise ValueError(f"{source} line {number}: the key appears twice")
        tenants[key] = tenant
    return ApiKeys(tenants)


def _entry(line: str) -> tuple[str, Tenant]:
    fields = [field.strip() for field in line.split(",")]
    if len(fields) not in (2, 3):
        raise ValueError(f"expected key,tenant[,weight], got {len(fields)} fields")
    key, name = fields[0], fields[1]
    if not _KEY.match(key):
        raise ValueError("a key must be 1-512 printable ASCII characters without spaces or commas")
    if not TENANT_NAME.match(name):
        raise ValueError(f"tenant must be 1-64 characters of [A-Za-z0-9._@-], got {name!r}")
    return key, Tenant(name, _weight(fields[2]) if len(fields) == 3 else 1.0)


def _weight(text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        raise ValueError(f"weight must be a number, got {text!r}") from None
    if not math.isfinite(weight) or not MIN_TENANT_WEIGHT <= weight <= MAX_TENANT_WEIGHT:
        raise ValueError(f"weight must be from {MIN_TENANT_WEIGHT:g} to {MAX_TENANT_WEIGHT:g}, got {text!r}")
    return weight
