"""Intake: a prompt, token ids or chat messages (and images) become a `Request` (tokenizer, chat
template, the special-token guard for chat content, the image processor, DRY breaker masks).

May import: pipeline.request, pipeline.config, pipeline.grammar (compiling a request's grammar),
pipeline.lora (adapter names), pipeline.sampling (the breaker mask and the per-request seed).
"""
