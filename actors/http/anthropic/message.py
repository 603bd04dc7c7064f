"""Anthropic's message object from an assembled result:

    {"id": "msg_...", "type": "message", "role": "assistant", "model": ...,
     "content": [{"type": "thinking", "thinking": ..., "signature": ""} (--reasoning-parser: the reasoning, first),
                 {"type": "text", "text": ...} | {"type": "tool_use", "id": "toolu_...", "name", "input"}, ...],
     "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use", "stop_sequence": ... | null,
     "usage": {"input_tokens", "output_tokens"}}

A request ended by its deadline or cancelled keeps the engine's reason (`timeout`, `abort`): Anthropic
has no name for them. A thinking block's signature is empty: this server signs nothing, and earlier
turns' thinking blocks are dropped from the prompt anyway (content.py).
"""

from __future__ import annotations

from typing import Any

from actors.http.anthropic.blocks import ReasonedBlocks, content_blocks
from actors.http.anthropic.request import AnthropicRequest


def message_body(request: AnthropicRequest, result: dict[str, Any], model_name: str) -> dict[str, Any]:
    choice = result["choices"][0]  # one answer: n is 1
    blocks = ReasonedBlocks(request.tool_plan, request.reasoning)
    content = content_blocks([*blocks.feed(choice["text"]), *blocks.finish()])
    reason, sequence = stop_reason(choice["finish_reason"], choice["stop_reason"], request.stop_sequences,
                                   called=blocks.num_calls > 0)
    return {**message_envelope(request, model_name), "content": content, "stop_reason": reason,
            "stop_sequence": sequence, "usage": {"input_tokens": result["usage"]["prompt_tokens"],
                                                 "output_tokens": result["usage"]["completion_tokens"]}}


def message_envelope(request: AnthropicRequest, model_name: str) -> dict[str, Any]:
    return {"id": request.response_id, "type": "message", "role": "assistant", "model": model_name}


def stop_reason(finish_reason: str | None, wire_stop_reason: int | str | None, stop_sequences: tuple[str, ...],
                called: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish_reason and stop_reason (the stop string or
    token that ended the answer)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason != "stop":
        return finish_reason, None
    if called:
        return "tool_use", None
    if isinstance(wire_stop_reason, str) and wire_stop_reason in stop_sequences:
        return "stop_sequence", wire_stop_reason
    return "end_turn", None
