"""`aqueduct batch`: an OpenAI batch file (/v1/completions lines) through the embedded engine.

Every input line yields one output line, in input order; a bad line yields an error line for
its custom_id and the rest of the file is still processed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from actors.completion_request import parse_completion_body
from pipeline.engine import LLMEngine
from pipeline.outputs import RequestDelta, TokenLogprob

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Pending:
    custom_id: str
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)
    result: dict[str, Any] | None = None


def run_batch(engine: LLMEngine, input_path: Path, output_path: Path, progress: bool = True) -> dict[str, int]:
    lines = input_path.read_text(encoding="utf-8").splitlines()
    entries: list[_Pending] = []
    by_request: dict[str, _Pending] = {}
    model_name = engine.model_dir.name
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        entry = _submit_line(engine, line, line_number, by_request)
        entries.append(entry)
    bar = tqdm(total=len(by_request), disable=not progress, desc="requests", unit="req")
    while engine.has_unfinished:
        for delta in engine.step():
            entry = by_request[delta.request_id]
            _accumulate(engine, entry, delta)
            if delta.finished:
                entry.result = _response_line(engine, entry, delta, model_name)
                bar.update(1)
    bar.close()
    with output_path.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry.result, ensure_ascii=False) + "\n")
    num_errors = sum(1 for entry in entries if entry.result["error"] is not None)
    return {"lines": len(entries), "errors": num_errors}


def _submit_line(engine: LLMEngine, line: str, line_number: int, by_request: dict[str, _Pending]) -> _Pending:
    custom_id = f"line-{line_number}"
    try:
        item = json.loads(line)
        if not isinstance(item, dict):
            raise ValueError("each line must be a JSON object")
        custom_id = str(item.get("custom_id", custom_id))
        _check_envelope(item)
        if custom_id in by_request:
            raise ValueError(f"duplicate custom_id {custom_id!r}")
        prompt, params = parse_completion_body(item.get("body"))
        engine.add_request(custom_id, prompt, params)
    except (ValueError, json.JSONDecodeError) as error:
        log.warning("rejected batch line", line=line_number, custom_id=custom_id, error=str(error))
        return _Pending(custom_id, result=_error_line(custom_id, str(error)))
    entry = _Pending(custom_id)
    by_request[custom_id] = entry
    return entry


def _check_envelope(item: dict[str, Any]) -> None:
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise ValueError(f"unknown line field(s): {', '.join(unknown)}")
    if not isinstance(item.get("custom_id"), str) or not item["custom_id"]:
        raise ValueError("custom_id must be a non-empty string")
    if item.get("method", "POST") != "POST":
        raise ValueError(f"method must be POST, got {item.get('method')!r}")
    if item.get("url") != "/v1/completions":
        raise ValueError(f"url must be /v1/completions, got {item.get('url')!r}")


def _accumulate(engine: LLMEngine, entry: _Pending, delta: RequestDelta) -> None:
    for choice in delta.choices:
        state = entry.choices.setdefault(choice.index, {"index": choice.index, "text": "", "token_ids": [],
                                                        "logprob_entries": [], "finish_reason": None,
                                                        "stop_reason": None})
        state["text"] += choice.text
        state["token_ids"].extend(choice.token_ids)
        if choice.logprobs is not None:
            state["logprob_entries"].extend(choice.logprobs)
            state["wants_logprobs"] = True
        if choice.finish_reason is not None:
            state["finish_reason"], state["stop_reason"] = choice.finish_reason, choice.stop_reason
    if delta.prompt_logprobs is not None:
        entry.choices.setdefault(-1, {})["prompt_logprobs"] = [
            None if lp is None else _logprob_map(engine, lp) for lp in delta.prompt_logprobs]


def _response_line(engine: LLMEngine, entry: _Pending, delta: RequestDelta, model_name: str) -> dict[str, Any]:
    if delta.error is not None:
        return _error_line(entry.custom_id, delta.error["message"], delta.error["code"])
    prompt_logprobs = entry.choices.pop(-1, {}).get("prompt_logprobs")
    choices = [_choice_object(engine, entry.choices[index]) for index in sorted(entry.choices)]
    usage = delta.usage
    body = {
        "id": f"cmpl-{entry.custom_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}},
    }
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return {"id": f"batch-{entry.custom_id}", "custom_id": entry.custom_id,
            "response": {"status_code": 200, "body": body}, "error": None}


def _choice_object(engine: LLMEngine, state: dict[str, Any]) -> dict[str, Any]:
    logprobs = _openai_logprobs(engine, state["logprob_entries"]) if state.get("wants_logprobs") else None
    return {"index": state["index"], "text": state["text"], "token_ids": state["token_ids"],
            "logprobs": logprobs, "finish_reason": state["finish_reason"], "stop_reason": state["stop_reason"]}


def _openai_logprobs(engine: LLMEngine, entries: list[TokenLogprob]) -> dict[str, Any]:
    """The completions-API logprobs object, plus token ids and ranks (token strings can collide)."""
    tokens = [_token_text(engine, entry.token_id) for entry in entries]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{_token_text(engine, t): lp for t, lp in entry.top} for entry in entries],
        "text_offset": offsets,
        "token_ids": [entry.token_id for entry in entries],
        "ranks": [entry.rank for entry in entries],
    }


def _token_text(engine: LLMEngine, token_id: int) -> str:
    if engine.tokenizer is None:
        return f"token_id:{token_id}"
    return engine.tokenizer.decode([token_id])


def _error_line(custom_id: str, message: str, code: str = "invalid_request") -> dict[str, Any]:
    error = {"code": code, "message": message}
    return {"id": f"batch-{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 400, "body": {"error": error}}, "error": error}


def _logprob_map(engine: LLMEngine, entry: TokenLogprob) -> dict[str, Any]:
    return {"token": _token_text(engine, entry.token_id), "token_id": entry.token_id, "logprob": entry.logprob,
            "rank": entry.rank, "top": [[token_id, logprob] for token_id, logprob in entry.top]}
