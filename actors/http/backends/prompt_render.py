"""A prompt's token ids as a worker will compute them, for placement at the gateway."""

from __future__ import annotations

from typing import Any

from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.request_builder import RequestBuilder
from queue_adapters.codec import WireRequest
from queue_adapters.placement import PromptRenderer

# Placement tokenizes at most this much of a prompt (about 8k tokens of English): its leading blocks
# are what placement needs, and tokenizing a 3 MB prompt here held the GIL for seconds, stalling
# every stream through the gateway. Of a cut prompt, the last ids are dropped: a token may span the cut.
PLACEMENT_MAX_CHARS = 32_768
PLACEMENT_CUT_MARGIN = 64


def prompt_renderer(tokenizer: Any, max_model_len: int | None) -> PromptRenderer | None:
    """Text and messages -> the token ids a worker will compute (pipeline/intake/request_builder.py),
    for placement: of a long prompt, those of its first PLACEMENT_MAX_CHARS characters; a message with
    image parts is not rendered (its blocks depend on the image)."""
    if tokenizer is None:
        return None
    # Only text and messages come here (token ids are placed as they are): the vocabulary bound is moot.
    builder = RequestBuilder(tokenizer, 1 << 31, frozenset(), max_model_len or 1 << 30,
                             content_guard=ChatContentGuard(tokenizer))

    def render(request: WireRequest) -> list[int]:
        messages = [message.as_dict() for message in request.messages] if request.messages is not None else None
        if messages and any(isinstance(m["content"], list) and any(part["type"] != "text" for part in m["content"])
                            for m in messages):
            raise ValueError("images: placed by any worker")
        text, ids = builder.rendered_prompt(request.prompt, request.prompt_token_ids, messages, request.tools,
                                            request.chat_template_kwargs, max_chars=PLACEMENT_MAX_CHARS)
        # Cut: the ids near the cut may not be the whole prompt's; those before it are.
        return ids[:-PLACEMENT_CUT_MARGIN] if text is not None and len(text) >= PLACEMENT_MAX_CHARS else ids

    return render
