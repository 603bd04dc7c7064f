"""The OpenAI API (with vLLM's extras) on the gateway: /v1/completions, /v1/chat/completions,
/v1/models, /tokenize and /detokenize (routes.py). Requests are parsed by parse.py over one parser per
body (completion_request.py, chat_request.py with content_parts.py, tokenize_request.py, and
unknown_fields.py for fields nobody defined); answers are rendered by render.py (objects),
prompt_results.py (a prompt list's results as one), chunks.py (the stream) and shapes.py (the flow's
`ResponseShape`); actors/http/tool_parsers/ turns a model's text into `tool_calls` (streamed as
tool_deltas.py's deltas); with --reasoning-parser,
render.py and chunks.py give the reasoning split off by actors/http/reasoning/ as `reasoning` and
`reasoning_content`, and template_kwargs.py takes the chat template's variables; lora_routes.py
serves vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter when runtime LoRA updating is on (and
lora_openapi_paths.py documents them then).
`aqueduct batch` takes the parsers and the answers through batch_lines.py alone. The reference is docs/http-api.md.

May import: actors.http.generation, actors.http.backends, actors.http.errors, actors.http.limits,
actors.http.options, actors.http.sampling_schema, actors.http.reasoning, actors.http.tool_parsers,
actors.http.tenancy.id_namespaces (the
plumbing), pipeline, queue_adapters. Never another protocol, nor the app that mounts these routes.
"""
