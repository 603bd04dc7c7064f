"""The Anthropic Messages API on the gateway: POST /v1/messages and /v1/messages/count_tokens (routes.py).

One translation layer over the chat completions path: request.py turns a body into the same wire chat
request (content.py: system, messages and their text, image, tool_use and tool_result blocks; tools.py:
tools and tool_choice onto chat completions' tool plan and structured-output constraint), the flow
(submit, stream, cancel) is actors/http/generation/'s, and the answer's text becomes content blocks
(blocks.py; with --reasoning-parser its reasoning a first thinking block), a message object (message.py)
or Anthropic's events (events.py) through shapes.py's `ResponseShape`. errors.py and auth.py give
Anthropic's error shape and its x-api-key header; token_count.py renders the prompt for count_tokens;
thinking.py turns `thinking` into the template's `enable_thinking`. The reference is docs/http-api.md.

May import: actors.http.generation, actors.http.tenancy.api_keys, actors.http.backends, actors.http.errors,
actors.http.limits, actors.http.options, actors.http.reasoning, actors.http.tool_parsers (the plumbing),
pipeline, queue_adapters.
Nothing of actors.http.openai or actors.http.kobold, nor the app that mounts these routes.
"""
