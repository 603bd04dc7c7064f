"""The OpenAI Batch API on the gateway: /v1/files (file_routes.py: multipart uploads read by multipart.py) and
/v1/batches (batch_routes.py, batch_request.py), mounted by routes.py over one service (service.py).

A batch's lines run as ordinary requests of the bulk lane through the backend the HTTP routes use, each parsed
by its route's own parser and answered by its route's own shape (line_request.py, line_answer.py), under a
wire id that is the same after any restart (records.py), so nothing is generated twice. runner.py runs one
batch (bounded lines in flight, cancel, expiry at its completion window) and result_files.py writes its output
and error files (result_lines.py's format); supervisor.py decides which batches a gateway runs (leases, so any
gateway takes up a batch whose gateway died). input_lines.py reads an input file's lines.

Files and batches belong to the tenant of the API key (owner.py). They are stored in Redis behind a gateway
(redis_files.py, redis_batches.py), shared by every gateway, or in this process when the engine is embedded
(file_store.py, batch_store.py). listing.py pages lists; store_errors.py makes an unreachable store a 503.
The reference is docs/deployment.md#batches and docs/http-api.md#batches.

May import: actors.http.backends, actors.http.cursor_pages, actors.http.errors, actors.http.generation,
actors.http.limits, actors.http.openai, actors.http.options, actors.http.tenancy, pipeline, queue_adapters. Nothing of
actors.http.anthropic, actors.http.kobold or actors.http.responses, nor the app that mounts these routes.
"""
