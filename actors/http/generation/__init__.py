"""Generation on the gateway, whatever the API: a parsed request (`GatewayRequest`) submitted to the
backend, its first reply entry awaited under the client's and the workers' watch (interrupts.py),
then answered whole or streamed (flow.py, event_stream.py), its prompts' replies merged as they come
(reply_merge.py). Each protocol brings its parser and its `ResponseShape`; body_fields.py reads the
fields every protocol reads alike (the model named, boolean switches), priority.py vLLM's `priority`
(also for batch lines, so it imports no web code); flow.py sets each request's tenant (actors/http/tenancy/tenants.py)
for the workers' fair share; metrics.py counts requests,
their first entries and cancellations for /metrics.

May import: actors.http.backends, actors.http.errors, actors.http.limits,
actors.http.options, actors.http.request_ids, actors.http.tenancy.tenants, actors.http.tenancy.id_namespaces,
queue_adapters. Never a
protocol package (openai/, kobold/), nor the app.
"""
