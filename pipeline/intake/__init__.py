"""Intake: a prompt, token ids or chat messages (and images) become a `Request` (tokenizer, chat
template, the special-token guard for chat content, the image processor, DRY breaker masks).

May import: request/, loading/, sampling/ (the breaker mask and the per-request seed), lora/.
"""
