"""vLLM's /tokenize and /detokenize bodies: a prompt, or OpenAI chat messages (checked as a chat request's
are, actors/http/openai/chat_request.py) rendered by the chat template; token ids to decode. An unknown
/tokenize field is a 400.
"""

from __future__ import annotations

from typing import Any

from actors.http.errors import ApiError, invalid
from actors.http.generation.body_fields import bool_field
from actors.http.openai.chat_request import parse_messages
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.request_builder import template_messages
from pipeline.loading.tokenizer import tokenizer_vocab_size

_TOKENIZE_FIELDS = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                    "continue_final_message", "tools")


def tokenized(tokenizer: Any, body: dict[str, Any], content_guard: ChatContentGuard | None) -> list[int]:
    """A /tokenize body's token ids: its prompt's, or its messages' as the chat template renders them."""
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    unknown = sorted(str(key) for key in body if key not in _TOKENIZE_FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(_TOKENIZE_FIELDS)})", unknown[0])
    if isinstance(body.get("prompt"), str):
        if body.get("tools") is not None:
            raise invalid("tools are rendered by the chat template: give messages, not prompt", "tools")
        return list(tokenizer.encode(body["prompt"], add_special_tokens=bool_field(body, "add_special_tokens", True)))
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        if not getattr(tokenizer, "chat_template", None):
            raise invalid("this model's tokenizer has no chat template", "messages")
        chat = _chat_messages(messages)
        literals: list[str] = []
        if content_guard is not None:
            chat, literals = content_guard.protect(chat)
        text = _chat_text(tokenizer, chat, bool_field(body, "add_generation_prompt", True),
                          bool_field(body, "continue_final_message", False), _tools(body.get("tools")))
        # As vLLM's: the template writes BOS itself, so special tokens are added only when asked.
        add_special_tokens = bool_field(body, "add_special_tokens", False)
        if literals:
            return _with_special_tokens(tokenizer, _guarded_ids(content_guard, text, literals), add_special_tokens)
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    raise invalid("give prompt (a string) or messages (a non-empty list)", "prompt")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI's `tools` as the chat template takes them: [{type: "function", function: {name, ...}}]."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be a list of {type: function, function: {name, description, parameters}}",
                      "tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise invalid(f"tools[{index}] must be {{type: function, function: {{name, ...}}}}", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise invalid(f"tools[{index}].function.name must be a non-empty string", "tools")
    return tools or None


def _with_special_tokens(tokenizer: Any, ids: list[int], add: bool) -> list[int]:
    """`ids` wrapped in the special tokens the tokenizer adds around a text (BOS, EOS, ...), when asked."""
    if not add:
        return ids
    bare = tokenizer.encode("a", add_special_tokens=False)
    wrapped = tokenizer.encode("a", add_special_tokens=True)
    start = next((i for i in range(len(wrapped) - len(bare) + 1) if wrapped[i:i + len(bare)] == bare), None)
    if start is None:  # a tokenizer whose special tokens change the text's own tokens: none to find
        return ids
    return [*wrapped[:start], *ids, *wrapped[start + len(bare):]]


def _chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """`messages` checked as a chat request's are, as a text model's worker gives them to the chat
    template (text parts joined; with image parts, as a vision model's worker does)."""
    try:
        parsed = [message.as_dict() for message in parse_messages(messages, images=[])]
        has_images = any(isinstance(m["content"], list) and any(p["type"] == "image" for p in m["content"])
                         for m in parsed)
        return template_messages(parsed, vision=has_images)
    except ValueError as error:
        raise invalid(str(error), "messages") from None


def _guarded_ids(content_guard: ChatContentGuard, text: str, literals: list[str]) -> list[int]:
    try:
        return content_guard.encode(text, literals)
    except ValueError as error:
        raise invalid(str(error), "messages") from None


def _chat_text(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt the chat template makes of `messages` (a message the template cannot render is a
    400 naming it, not a 500). `continue_final_message`: the last message left open, to be continued."""
    if add_generation_prompt and continue_final_message:
        raise invalid("add_generation_prompt and continue_final_message cannot both be true "
                      "(set add_generation_prompt: false to continue the last message)", "continue_final_message")
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except ValueError as error:  # jinja2's TemplateError is an Exception, not a ValueError
        raise invalid(str(error), "messages") from None
    except Exception as error:
        raise invalid(f"the chat template cannot render these messages: {type(error).__name__}: {error}",
                      "messages") from None


def token_ids(tokens: Any, tokenizer: Any) -> list[int]:
    """`tokens`: a list of ids in the tokenizer's vocabulary (the decoder takes 32-bit ids)."""
    vocab_size = tokenizer_vocab_size(tokenizer)
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid("tokens must be a list of token ids", "tokens")
    outside = [token for token in tokens if not 0 <= token < vocab_size]
    if outside:
        raise invalid(f"tokens must hold token ids in [0, {vocab_size}), got {outside[0]}", "tokens")
    return tokens
