"""The HTTP gateway (`aqueduct serve`): FastAPI routes over a backend that is either the worker's actor
graph in this process (embedded) or a Redis deployment (stateless gateway).

At the top, the server: the app (app.py) that mounts each protocol's routes, `serve` and its flags,
the OpenAPI document; the Batch API (batches/: /v1/files, /v1/batches), whose lines run through
openai/'s parsers and answers; below them the protocols, one package each (openai/, kobold/, anthropic/,
responses/); below those generation/ (submit, first entry, stream, cancel, its metrics), and under it
the protocol-neutral plumbing: backends, cursor pages of lists, body limits, request ids, errors, options,
the one-send transport, tenancy/ (API keys, one or a file of tenants' keys, and a request's tenant), tool_parsers/
(answers -> tool calls) and reasoning/ (answers -> reasoning and content). A protocol imports generation/ and the
plumbing, never another protocol; neither imports a protocol.

May import: actors.worker (the embedded backend runs the worker's graph), actors.kit, pipeline,
queue_adapters. Never actors.cli.
"""
