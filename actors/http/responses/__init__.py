"""The OpenAI Responses API on the gateway: POST /v1/responses and the stored responses' routes (routes.py).

One translation layer over the chat completions path: request.py turns a body into the same wire chat
request (input_items.py: `input` as items; conversation.py: instructions, a stored conversation and the
input as chat messages; tools.py: tools and tool_choice onto chat's tool plan and constraint;
sampling.py: the fields, text.format and the template's variables), the flow (submit, stream, cancel)
is actors/http/generation/'s, and the answer's text becomes output items through steps.py and
output.py: whole (answer.py, response_object.py) or as Responses events (events.py), through
shapes.py's `ResponseShape`. Stored responses (store.py in memory, redis_store.py behind Redis,
records.py's records, listing.py's pages) carry conversations across requests and gateways. The
reference is docs/http-api.md.

May import: actors.http.generation, actors.http.backends, actors.http.cursor_pages, actors.http.errors,
actors.http.limits, actors.http.options, actors.http.reasoning, actors.http.tool_parsers (the plumbing), pipeline,
queue_adapters. Nothing of actors.http.openai, actors.http.anthropic or actors.http.kobold, nor the app
that mounts these routes.
"""
