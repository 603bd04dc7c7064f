"""Weighted fair share between tenants: start-time fair queueing (Goyal, Vin and Cheng, 1996).

Each tenant has a virtual finish time. A request arriving gets the virtual start
max(system virtual time, its tenant's last finish), and moves that tenant's finish on by
cost / weight; the system virtual time is the start of the latest request admitted. Requests of
equal (aged) priority are admitted in order of virtual start, so a tenant that queues 150 requests
gets them interleaved with another tenant's 10 in the ratio of their weights, not ahead of them.

The cost is the work a request may ask for: its prompt tokens plus, per choice, max_tokens capped at
OUTPUT_COST_CAP (unset: the cap). Counting requests instead would let a tenant of 8,000-token
prompts take a hundred times the compute of one of 80-token prompts for the same share; the cap
keeps a request without max_tokens (until max_model_len) from being charged as if it used it all.

A tenant's finish tag is forgotten once the virtual time passes it (it would start at the virtual
time anyway), and every tag when nothing waits: a tenant that used more than its share while nobody
else was waiting owes nothing. So the state is bounded by the tenants with work waiting.
"""

from __future__ import annotations

from pipeline.request.request import Request

DEFAULT_TENANT = ""  # requests that name none share one tenant
OUTPUT_COST_CAP = 1024  # tokens


def request_cost(request: Request) -> int:
    max_tokens = request.params.max_tokens
    output = OUTPUT_COST_CAP if max_tokens is None else min(max_tokens, OUTPUT_COST_CAP)
    return max(1, request.num_prompt_tokens + len(request.sequences) * output)


class FairShare:
    def __init__(self) -> None:
        self.virtual_time = 0.0
        self._finish: dict[str, float] = {}  # tenant -> virtual finish of its latest request

    def tag(self, request: Request) -> None:
        """Give a newly waiting request its virtual start (once: a preempted one keeps its place)."""
        if request.virtual_start is not None:
            return
        tenant = request.tenant or DEFAULT_TENANT
        start = max(self.virtual_time, self._finish.get(tenant, 0.0))
        request.virtual_start = start
        self._finish[tenant] = start + request_cost(request) / request.tenant_weight

    def admitted(self, request: Request) -> None:
        if request.virtual_start is not None:
            self.virtual_time = max(self.virtual_time, request.virtual_start)

    def forget_idle(self, anything_waiting: bool) -> None:
        """Drop the tags that no longer change any start (see the module's docstring)."""
        if not anything_waiting:
            self.virtual_time = max([self.virtual_time, *self._finish.values()])
            self._finish.clear()
            return
        for tenant in [tenant for tenant, finish in self._finish.items() if finish <= self.virtual_time]:
            del self._finish[tenant]

    @property
    def num_tenants(self) -> int:
        return len(self._finish)
