"""Items (input_items.py's, a stored response's output items) -> the wire chat messages chat completions
would send for the same conversation, so the chat template renders the same prompt:

    instructions                     -> {"role": "system", "content": instructions}, first
    message (developer)              -> a system message (OpenAI's name for instructions inside the input)
    message (user, system, assistant)-> that role; one text part -> a string, several -> text parts
    function_call items              -> the assistant message before them (or a new one, content "")
                                        gets them as tool_calls {id: call_id, function: {name, arguments}}
    function_call_output             -> {"role": "tool", "tool_call_id": call_id, "content": output}
    reasoning                        -> dropped (templates take no such part)
"""

from __future__ import annotations

from typing import Any

from queue_adapters.chat_message import ChatMessage, TextPart, WireFunctionCall, WireToolCall


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[ChatMessage]:
    messages = [] if instructions is None else [ChatMessage(role="system", content=instructions)]
    for item in items:
        if item["type"] == "message":
            messages.append(ChatMessage(role=_role(item["role"]), content=_content(item["content"])))
        elif item["type"] == "function_call":
            _add_call(messages, WireToolCall(id=item["call_id"], function=WireFunctionCall(item["name"],
                                                                                          item["arguments"])))
        elif item["type"] == "function_call_output":
            messages.append(ChatMessage(role="tool", content=item["output"], tool_call_id=item["call_id"]))
    return messages


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _content(parts: list[dict[str, Any]]) -> str | list[TextPart]:
    if len(parts) == 1:
        return str(parts[0]["text"])
    return [TextPart(text=part["text"]) for part in parts]


def _add_call(messages: list[ChatMessage], call: WireToolCall) -> None:
    """Calls after an assistant message belong to it, as chat completions' tool_calls beside content."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
