"""Per-tenant metrics (docs/deployment.md#tenants-and-fair-share): requests waiting and running, and
output tokens, labelled by tenant.

Tenants come from clients (an API key file, OpenAI's `user` field, a wire client's own value), so
the label's cardinality is bounded: the first MAX_TENANT_LABELS tenants a worker sees keep their
own label for its life (a counter's series must not change label), the rest count under
OTHER_LABEL. Requests that name no tenant are DEFAULT_LABEL.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline.request.request import Sequence

MAX_TENANT_LABELS = 100
DEFAULT_LABEL = "(default)"
OTHER_LABEL = "(other)"
_PREFIX = "aqueduct_tenant_"


class TenantLabels:
    def __init__(self, limit: int = MAX_TENANT_LABELS) -> None:
        self.limit = limit
        self._named: set[str] = set()

    def of(self, tenant: str | None) -> str:
        if tenant is None:
            return DEFAULT_LABEL
        if tenant in self._named:
            return tenant
        if len(self._named) < self.limit:
            self._named.add(tenant)
            return tenant
        return OTHER_LABEL


def requests_by_tenant(sequences: Iterable[Sequence]) -> dict[str | None, int]:
    """Requests (not choices or beams: those of one request count once) per tenant."""
    requests = {id(seq.request): seq.request.tenant for seq in sequences}
    counts: dict[str | None, int] = {}
    for tenant in requests.values():
        counts[tenant] = counts.get(tenant, 0) + 1
    return counts


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry, labels: TenantLabels | None = None) -> None:
        self.labels = labels or TenantLabels()
        self.waiting = Gauge(
            _PREFIX + "requests_waiting", "Requests queued, per tenant.", ("tenant",), registry=registry
        )
        self.running = Gauge(
            _PREFIX + "requests_running", "Requests in the running batch, per tenant.", ("tenant",), registry=registry
        )
        self.generated_tokens = Counter(
            _PREFIX + "generated_tokens", "Output tokens generated, per tenant.", ("tenant",), registry=registry
        )
        self._shown: set[str] = set()  # labels with a gauge series, reset to 0 when their tenant is idle

    def set_queues(self, waiting: dict[str | None, int], running: dict[str | None, int]) -> None:
        for gauge, counts in ((self.waiting, waiting), (self.running, running)):
            by_label = self._by_label(counts)
            for label in self._shown | by_label.keys():
                gauge.labels(tenant=label).set(by_label.get(label, 0))
            self._shown |= by_label.keys()

    def add_tokens(self, counts: dict[str | None, int]) -> None:
        for label, count in self._by_label(counts).items():
            self.generated_tokens.labels(tenant=label).inc(count)

    def _by_label(self, counts: dict[str | None, int]) -> dict[str, int]:
        by_label: dict[str, int] = {}
        for tenant, count in counts.items():
            label = self.labels.of(tenant)
            by_label[label] = by_label.get(label, 0) + count
        return by_label
