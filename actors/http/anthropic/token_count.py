"""/v1/messages/count_tokens: `{"input_tokens": N}`, the prompt a Messages request with the same body
would have, rendered and tokenized as a worker does it (pipeline/intake/request_builder.py): the chat
template over the messages and tools, with the generation prompt and the template's variables
(thinking.py), special-token text in them kept as text (pipeline/intake/chat_content.py). An image
counts as the template's placeholder, before a vision model's worker expands it.
"""

from __future__ import annotations

from typing import Any

from actors.http.anthropic.request import Conversation
from actors.http.errors import ApiError, invalid
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.request_builder import template_messages


def count_prompt_tokens(tokenizer: Any, conversation: Conversation, content_guard: ChatContentGuard | None) -> int:
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    if not getattr(tokenizer, "chat_template", None):
        raise invalid("this model's tokenizer has no chat template", "messages")
    chat = template_messages([message.as_dict() for message in conversation.messages],
                             vision=bool(conversation.images))
    tools, literals = conversation.tools, []
    if content_guard is not None:
        chat, tools, literals = content_guard.protect_with_tools(chat, tools)
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                             **(conversation.template_kwargs or {}),
                                             **({"tools": tools} if tools is not None else {}))
    except Exception as error:  # model-supplied Jinja over the client's messages: a bad request, as at intake
        raise invalid(f"messages: the model's chat template rejected them: {error}", "messages") from None
    if literals:
        assert content_guard is not None
        try:
            return len(content_guard.encode(text, literals))
        except ValueError as error:
            raise invalid(str(error), "messages") from None
    # The rendered template holds its own special tokens (BOS included), as at intake.
    return len(tokenizer.encode(text, add_special_tokens=False))
