"""Prometheus metrics of one worker, on a private registry.

Each WorkerMetrics owns its own CollectorRegistry, so several workers (or tests) in one process
never collide on the global default registry. The health server renders it at GET /metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from actors.worker.tenant_metrics import TenantMetrics

# generate_latest() writes the classic text format 0.0.4; newer prometheus_client versions point
# CONTENT_TYPE_LATEST at 1.0.0, so name the version that matches the bytes we actually send.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# One bucket set for all latencies: ~1 ms (a GPU decode step) up to 60 s (a long CPU prefill).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
)

# Pre-created so each series shows 0 from the first scrape instead of appearing later (docs/design.md §3).
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "timeout", "error")

PREFIX = "aqueduct_"


class WorkerMetrics:
    """The worker's gauges, counters and histograms; call the record/observe methods from the actors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._create_gauges()
        self._create_counters()
        self._create_histograms()
        self.tenants = TenantMetrics(self.registry)  # bounded labels: tenant_metrics.py

    def _create_gauges(self) -> None:
        self.requests_waiting = self._gauge("requests_waiting", "Requests queued, not yet scheduled.")
        self.requests_running = self._gauge("requests_running", "Requests scheduled in the running batch.")
        self.kv_blocks_used = self._gauge("kv_blocks_used", "Paged KV cache blocks in use.")
        self.kv_blocks_total = self._gauge("kv_blocks_total", "Paged KV cache blocks in the pool.")

    def _create_counters(self) -> None:
        # prometheus_client appends the `_total` suffix to counters on exposition.
        self.generated_tokens = self._counter("generated_tokens", "Output tokens generated.")
        self.requests_finished = self._counter("requests_finished", "Requests finished, by reason.", ("finish_reason",))
        self.request_errors = self._counter("request_errors", "Requests ended with an error, by code.", ("code",))
        self.requests_dead_lettered = self._counter("requests_dead_lettered", "Entries moved to the dead stream.")
        for reason in FINISH_REASONS:
            self.requests_finished.labels(finish_reason=reason)
        self.lora_requests = self._counter("lora_requests", "Requests admitted per LoRA adapter.", ("adapter",))
        self.lora_generated_tokens = self._counter("lora_generated_tokens", "Output tokens per LoRA adapter.",
                                                   ("adapter",))
        self.speculative_draft_tokens = self._counter(
            "speculative_draft_tokens", "Speculative decoding: tokens drafted by prompt lookup and verified.")
        self.speculative_accepted_tokens = self._counter(
            "speculative_accepted_tokens", "Speculative decoding: drafted tokens the model accepted.")
        self.placement_requests = self._counter(
            "placement_requests", "Requests read, by source: offered (to this worker, a placement hit), stolen "
            "(an offer to another that waited), shared (no worker held the prefix).", ("source",))
        for source in ("offered", "stolen", "shared"):
            self.placement_requests.labels(source=source)

    def _create_histograms(self) -> None:
        self.step_seconds = self._histogram("step_seconds", "Wall time of one engine step.")
        self.time_to_first_token_seconds = self._histogram(
            "time_to_first_token_seconds", "Time from request arrival to its first output token."
        )
        self.time_per_output_token_seconds = self._histogram(
            "time_per_output_token_seconds", "Time between consecutive output tokens of a request."
        )

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(PREFIX + name, documentation, registry=self.registry)

    def _counter(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> Counter:
        return Counter(PREFIX + name, documentation, labelnames, registry=self.registry)

    def _histogram(self, name: str, documentation: str) -> Histogram:
        return Histogram(PREFIX + name, documentation, registry=self.registry, buckets=LATENCY_BUCKETS_S)

    def observe_step(self, seconds: float, num_tokens: int) -> None:
        """One engine step took `seconds` and produced `num_tokens` output tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self.step_seconds.observe(seconds)
        self.generated_tokens.inc(num_tokens)

    def set_queue_state(self, waiting: int, running: int, kv_used: int, kv_total: int) -> None:
        """The scheduler's view after a step: queue lengths and KV block usage."""
        self.requests_waiting.set(waiting)
        self.requests_running.set(running)
        self.kv_blocks_used.set(kv_used)
        self.kv_blocks_total.set(kv_total)

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token_seconds.observe(seconds)

    def observe_output_token_interval(self, seconds: float) -> None:
        self.time_per_output_token_seconds.observe(seconds)

    def record_finish(self, reason: str) -> None:
        self.requests_finished.labels(finish_reason=reason).inc()

    def record_error(self, code: str) -> None:
        self.request_errors.labels(code=code).inc()

    def record_lora_request(self, adapter: str) -> None:
        self.lora_requests.labels(adapter=adapter).inc()

    def record_lora_tokens(self, adapter: str, count: int) -> None:
        self.lora_generated_tokens.labels(adapter=adapter).inc(count)

    def record_speculation(self, num_drafted: int, num_accepted: int) -> None:
        self.speculative_draft_tokens.inc(num_drafted)
        self.speculative_accepted_tokens.inc(num_accepted)

    def record_placement(self, source: str, count: int) -> None:
        """Requests read by where they came from: offered to this worker, stolen, or the shared lane."""
        self.placement_requests.labels(source=source).inc(count)

    def record_dead_letter(self) -> None:
        self.requests_dead_lettered.inc()

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format (serve with METRICS_CONTENT_TYPE)."""
        return generate_latest(self.registry)
