"""The Response object (openai.types.responses.Response) around an answer's output items:

    {"id": "resp_...", "object": "response", "created_at", "status": "completed" | "incomplete" | "in_progress",
     "incomplete_details": null | {"reason": "max_output_tokens"}, "error": null, "model", "output": [...],
     "usage": {"input_tokens", "input_tokens_details": {"cached_tokens"}, "output_tokens",
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens"},
     and the request's settings echoed: instructions, tools, tool_choice, text, temperature, top_p, ...}

An answer that reached max_output_tokens (or the context) is `incomplete` with reason
`max_output_tokens`; one ended by the server (a --request-timeout deadline: `timeout`, a cancel: `abort`)
is `incomplete` with the engine's reason, which OpenAI has no name for.
"""

from __future__ import annotations

import time
from typing import Any

_DEFAULT_TEXT = {"format": {"type": "text"}}


def echoed_fields(body: dict[str, Any], store: bool) -> dict[str, Any]:
    """The request's settings as the Response object repeats them (null: not given)."""
    tools = body.get("tools") or []
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"), "reasoning": body.get("reasoning"),
            "store": store, "temperature": body.get("temperature"), "text": body.get("text") or _DEFAULT_TEXT,
            "tool_choice": body.get("tool_choice") or ("auto" if tools else "none"), "tools": tools,
            "top_p": body.get("top_p"), "truncation": "disabled", "user": body.get("user"), "background": False}


def response_body(response_id: str, created_at: int, model: str, echo: dict[str, Any], output: list[dict[str, Any]],
                  finish_reason: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """In progress while `finish_reason` is None; then completed or incomplete."""
    status, details = _status(finish_reason)
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": None,
            "incomplete_details": details, "model": model, "output": output, "usage": usage, **echo}


def usage_body(usage: dict[str, int]) -> dict[str, Any]:
    """From the engine's usage (prompt_tokens, completion_tokens, cached_tokens)."""
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason is None:
        return "in_progress", None
    if finish_reason == "stop":
        return "completed", None
    return "incomplete", {"reason": "max_output_tokens" if finish_reason == "length" else finish_reason}


def item_status(finish_reason: str | None) -> str:
    """The status of the item still open when the answer ends."""
    return "completed" if finish_reason == "stop" else "incomplete"
