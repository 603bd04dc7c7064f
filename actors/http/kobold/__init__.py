"""The KoboldAI API (as Aphrodite serves it) on the gateway: /api/v1/generate, /api/extra/generate/stream,
/api/extra/abort, /api/extra/tokencount and the info routes. Kobold's parameter names map onto our
sampler (fields.py, sampler_order.py); its answers and errors are shapes.py's and errors.py's; the flow
(submit, stream, cancel) is actors/http/generation/'s. The reference is docs/kobold.md.

May import: actors.http.generation, actors.http.backends, actors.http.errors, actors.http.limits,
actors.http.options (the plumbing), pipeline.request, queue_adapters. Never actors.http.openai, nor
the app that mounts these routes.
"""
