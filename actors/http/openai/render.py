"""OpenAI response objects (completion, chat.completion and their choices, usage, logprobs) from
assembled results.

Shared by `aqueduct batch` (output lines) and the HTTP gateway (responses and stream chunks), so
both answer in exactly the same shape.
"""

from __future__ import annotations

import time
from typing import Any

from actors.http.reasoning import ReasoningFormat, split_whole
from actors.http.tool_parsers.plan import ToolPlan


def completion_body(response_id: str, result: dict[str, Any], model_name: str, tokenizer: Any | None,
                    chat: bool, tool_plan: ToolPlan | None = None,
                    reasoning: ReasoningFormat | None = None) -> dict[str, Any]:
    """A `text_completion` or `chat.completion` object from a finished, error-free result (a chat
    request's reasoning format splits off its answers' reasoning; its tool plan turns the calls in the
    rest into `tool_calls`)."""

    def choice_object(choice: dict[str, Any], tokenizer: Any | None) -> dict[str, Any]:
        return chat_choice(choice, tokenizer, tool_plan, reasoning) if chat else completion_choice(choice, tokenizer)

    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice_object(choice, tokenizer) for choice in result["choices"]],
        "usage": usage_object(result["usage"]),
    }
    if chat and result.get("prompt_logprobs") is not None:  # vLLM: chat's at the top, completions' per choice
        body["prompt_logprobs"] = vllm_prompt_logprobs(result["prompt_logprobs"], tokenizer)
    return body


def vllm_prompt_logprobs(entries: list[dict | None], tokenizer: Any | None) -> list[dict[str, dict] | None]:
    """vLLM's prompt_logprobs: per prompt token (None for the first) {token id: {logprob, rank,
    decoded_token}}, the prompt's own token first, then the top alternatives."""
    return [None if entry is None else _vllm_position(entry, tokenizer) for entry in entries]


def _vllm_position(entry: dict, tokenizer: Any | None) -> dict[str, dict]:
    position = {str(entry["token_id"]): {"logprob": entry["logprob"], "rank": entry["rank"],
                                         "decoded_token": token_text(tokenizer, entry["token_id"])}}
    for rank, (token_id, logprob) in enumerate(entry["top"], start=1):
        position.setdefault(str(token_id), {"logprob": logprob, "rank": rank,
                                            "decoded_token": token_text(tokenizer, token_id)})
    return position


def usage_object(usage: dict[str, int]) -> dict[str, Any]:
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]}}


def completion_choice(choice: dict, tokenizer: Any | None) -> dict[str, Any]:
    """A completions choice; with `echo_text` (echo) the prompt comes first in its text and, when
    logprobs were asked for, in its logprobs (the prompt's first token has none: null)."""
    entries = choice["logprobs"]
    echoed = "echo_text" in choice
    if echoed and entries is not None:
        entries = [*echo_entries(choice), *entries]
    body = {"index": choice["index"], "text": choice.get("echo_text", "") + choice["text"],
            "token_ids": choice["token_ids"],
            "logprobs": completion_logprobs(entries, tokenizer) if entries is not None else None,
            "finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"]}
    if choice.get("prompt_logprobs") is not None:
        body["prompt_logprobs"] = vllm_prompt_logprobs(choice["prompt_logprobs"], tokenizer)
    return body


def echo_entries(choice: dict) -> list[dict]:
    """The prompt's tokens as logprob entries: the first without a logprob (nothing precedes it)."""
    prompt_ids, scored = choice.get("prompt_token_ids"), choice.get("prompt_logprobs")
    if not prompt_ids or scored is None:
        return []
    return [{"token_id": prompt_ids[0], "logprob": None, "rank": None, "top": None}, *scored[1:]]


def completion_logprobs(entries: list[dict], tokenizer: Any | None, text_offset: int = 0) -> dict[str, Any]:
    """The completions-API logprobs object, plus token ids and ranks (token strings can collide).
    An entry whose `top` is None (an echoed prompt's first token) has null logprob and top_logprobs.

    `text_offset`: where these tokens' text starts in the choice (a stream chunk continues a choice)."""
    tokens = [token_text(tokenizer, entry["token_id"]) for entry in entries]
    offsets, offset = [], text_offset
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [None if entry["top"] is None else _top_with_chosen(entry, tokenizer) for entry in entries],
        "text_offset": offsets,
        "token_ids": [entry["token_id"] for entry in entries],
        "ranks": [entry["rank"] for entry in entries],
    }


def _top_with_chosen(entry: dict, tokenizer: Any | None) -> dict[str, float]:
    """OpenAI's top_logprobs of a position: the chosen token and the top alternatives (up to
    logprobs + 1 entries, so `logprobs: 0` still names the chosen token)."""
    top = {token_text(tokenizer, entry["token_id"]): entry["logprob"]}
    for token_id, logprob in entry["top"]:
        top.setdefault(token_text(tokenizer, token_id), logprob)
    return top


def token_text(tokenizer: Any | None, token_id: int) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"


def chat_choice(choice: dict[str, Any], tokenizer: Any | None, tool_plan: ToolPlan | None = None,
                reasoning: ReasoningFormat | None = None) -> dict[str, Any]:
    """A `chat.completion` choice from an assembled result's choice (plus token_ids, as completions have);
    with a reasoning format, its reasoning goes in `reasoning` (and `reasoning_content`, the older name)
    and `content` is the text after it; with a tool plan, the calls in that text become `tool_calls`."""
    entries = choice["logprobs"]
    text = choice["text"]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        thought, content = split_whole(reasoning, text)
        text = content or ""
        message.update(content=content, reasoning=thought, reasoning_content=thought)
    finish_reason = choice["finish_reason"]
    if tool_plan is not None:
        parsed = tool_plan.calls(text)
        message["content"] = parsed.content
        if parsed.calls:
            message["tool_calls"] = [call.as_openai() for call in parsed.calls]
            finish_reason = tool_plan.finish_reason(finish_reason)
    return {"index": choice["index"], "message": message,
            "logprobs": chat_logprobs(entries, tokenizer) if entries is not None else None,
            "finish_reason": finish_reason, "stop_reason": choice["stop_reason"],
            "token_ids": choice["token_ids"]}


def reasoning_delta(reasoning: str) -> dict[str, str]:
    """A chat chunk's reasoning, under vLLM's current name and the older one (clients read either)."""
    return {"reasoning": reasoning, "reasoning_content": reasoning} if reasoning else {}


def chat_logprobs(entries: list[dict[str, Any]], tokenizer: Any | None) -> dict[str, Any]:
    """Chat's logprobs object (`content` entries) for some of a choice's tokens."""
    return {"content": [_content_logprob(entry, tokenizer) for entry in entries]}


def _content_logprob(entry: dict[str, Any], tokenizer: Any | None) -> dict[str, Any]:
    return {**_token_logprob(entry["token_id"], entry["logprob"], tokenizer),
            "top_logprobs": [_token_logprob(token_id, logprob, tokenizer) for token_id, logprob in entry["top"]]}


def _token_logprob(token_id: int, logprob: float, tokenizer: Any | None) -> dict[str, Any]:
    token = tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"
    # A token that ends inside a UTF-8 character decodes to U+FFFD; its bytes say so, as vLLM's do.
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
