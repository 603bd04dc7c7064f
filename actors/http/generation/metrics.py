"""The gateway's Prometheus metrics, in their own registry (several apps may live in one test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("aqueduct_gateway_requests", "HTTP generation requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.in_flight = Gauge("aqueduct_gateway_in_flight", "generation requests in flight", registry=self.registry)
        self.time_to_first_entry = Histogram(
            "aqueduct_gateway_time_to_first_token_seconds", "submit to the first reply entry",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.cancelled = Counter("aqueduct_gateway_cancelled", "requests cancelled because the client went away",
                                 registry=self.registry)
