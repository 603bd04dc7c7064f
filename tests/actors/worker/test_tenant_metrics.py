"""Per-tenant worker metrics: waiting and running requests and output tokens by tenant, with the label's
cardinality bounded (the first tenants seen keep their name, the rest are `(other)`)."""

from actors.worker.metrics import WorkerMetrics
from actors.worker.tenant_metrics import TenantLabels, requests_by_tenant
from tests.support.engine_sim import make_request, make_scheduler, run_step


def _tenant_request(request_id, tenant, n=1):
    request = make_request(request_id, prompt_len=4, max_tokens=3, first_token=len(request_id), n=n)
    request.tenant = tenant
    return request


def _sample(metrics, name, tenant):
    return metrics.registry.get_sample_value(f"aqueduct_tenant_{name}", {"tenant": tenant})


def test_queues_and_tokens_are_reported_per_tenant():
    scheduler = make_scheduler(max_num_seqs=2, scheduling_policy="priority")
    for request in (_tenant_request("a0", "acme", n=2), _tenant_request("a1", "acme"), _tenant_request("x", None)):
        scheduler.add_request(request)
    metrics = WorkerMetrics()
    run_step(scheduler)  # seat shares of 1 each: a0's first choice and x run
    metrics.tenants.set_queues(requests_by_tenant(scheduler.waiting), requests_by_tenant(scheduler.running))
    assert _sample(metrics, "requests_running", "acme") == 1
    assert _sample(metrics, "requests_waiting", "acme") == 2  # a0 (its second choice) and a1: requests, not choices
    assert _sample(metrics, "requests_running", "(default)") == 1
    while scheduler.has_unfinished:
        run_step(scheduler)
    metrics.tenants.add_tokens(scheduler.take_tenant_tokens())
    metrics.tenants.set_queues(requests_by_tenant(scheduler.waiting), requests_by_tenant(scheduler.running))
    assert _sample(metrics, "generated_tokens_total", "acme") == 9
    assert _sample(metrics, "generated_tokens_total", "(default)") == 3
    assert _sample(metrics, "requests_waiting", "acme") == 0  # an idle tenant reads 0, not its last value
    assert scheduler.take_tenant_tokens() == {}
    assert b'aqueduct_tenant_generated_tokens_total{tenant="acme"} 9.0' in metrics.render()


def test_tenants_past_the_limit_share_the_other_label():
    labels = TenantLabels(limit=2)
    assert [labels.of(t) for t in ("a", "b", "c", "a", None, "d")] == ["a", "b", "(other)", "a", "(default)",
                                                                       "(other)"]
