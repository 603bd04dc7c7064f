"""The KoboldAI API (as Aphrodite serves it) on the gateway: /api/v1/generate, /api/extra/generate/stream,
/api/extra/abort, /api/extra/tokencount and the info routes. Kobold's parameter names map onto our
sampler (fields.py, sampler_order.py); the flow (submit, stream, cancel) is actors/http/generation.py's.
The reference is docs/kobold.md."""
