"""A chat request's `chat_template_kwargs`: extra variables for the chat template (vLLM's field, e.g.
`{"enable_thinking": false}`), checked wherever they come in (the gateway's edge, the wire, the
builder), so the template only ever gets a bounded map of plain values under names it can read.

Names the template already gets from the request or the tokenizer (`messages`, `tools`,
`add_generation_prompt`, the special tokens, ...) or that change what transformers'
`apply_chat_template` returns (`tokenize`, `return_dict`, ...) are refused: a client could otherwise
swap the template's own inputs, or make the render return something that is not a prompt.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.request.untrusted import UntrustedValueError, check_untrusted

MAX_KWARGS = 64  # names in one request's map
MAX_KWARGS_CHARS = 65_536  # its JSON: the values may be written into every prompt
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")  # what a Jinja template can name
RESERVED = frozenset({
    # the template's inputs from the request, and apply_chat_template's own parameters
    "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    # what transformers gives every template: its helpers and the tokenizer's special tokens
    "raise_exception", "strftime_now", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
    "cls_token", "mask_token", "additional_special_tokens",
})


def check_chat_template_kwargs(kwargs: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """`kwargs` as given, or UntrustedValueError naming the item and the rule (`field` = `where`)."""
    if not isinstance(kwargs, dict):
        raise UntrustedValueError(f"{where} must be an object of template variables, got {type(kwargs).__name__}",
                                  where)
    if len(kwargs) > MAX_KWARGS:
        raise UntrustedValueError(f"{where} may hold at most {MAX_KWARGS} names, got {len(kwargs)}", where)
    for name in kwargs:
        if not isinstance(name, str) or not _NAME.match(name):
            raise UntrustedValueError(f"{where}: {name!r} is not a template variable name (a letter or _, then "
                                      "letters, digits or _, at most 64 characters)", where)
        if name in RESERVED:
            raise UntrustedValueError(f"{where}.{name} is reserved: the chat template gets it from the request "
                                      "or the tokenizer, not from chat_template_kwargs", where)
    check_untrusted(kwargs, where)
    try:
        size = len(json.dumps(kwargs, ensure_ascii=False))
    except TypeError:  # msgpack's bin: not a JSON value, and no template variable needs bytes
        raise UntrustedValueError(f"{where} must hold JSON values only (strings, numbers, bools, null, lists, "
                                  "objects)", where) from None
    if size > MAX_KWARGS_CHARS:
        raise UntrustedValueError(f"{where} may be at most {MAX_KWARGS_CHARS} characters of JSON, got {size}", where)
    return kwargs
