"""`aqueduct batch`: an OpenAI batch file (/v1/completions and /v1/chat/completions lines) through the engine.

Embedded (default): the engine's step loop runs in this process, on the device thread. Offline
work streams to nobody, so the actor graph (whose stages overlap to keep a server responsive)
would only compete with the forward for the CPU. With --redis-url: the lines are submitted to a
running deployment and the replies collected.
Both produce the same output file: one line per input line, in input order; a bad line yields an
error line for its custom_id and the rest of the file is still processed.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from actors.http.openai.batch_lines import URLS, LineBody, answer_body, parse_line_body
from actors.kit.runtime import ActorRuntime
from actors.worker.intake import build_request
from actors.worker.replies import MemoryReplySink, to_wire
from pipeline.engine import LLMEngine
from pipeline.request.outputs import RequestDelta
from pipeline.request.untrusted import loads_json
from pipeline.sampling.rng import seed_from_request_id
from queue_adapters.client import AqueductClient, assemble
from queue_adapters.codec import CodecError, Malformed, WireReply, WireRequest
from queue_adapters.memory import MemoryStream

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class BatchLine:
    custom_id: str
    request: WireRequest | None  # None: the line was rejected before submission
    error: str | None = None
    body: LineBody | None = None  # the line's body, checked (None: the line was rejected)


def read_batch_file(path: Path, tool_parser: str | None = None) -> list[BatchLine]:
    lines: list[BatchLine] = []
    seen: set[str] = set()
    # Bytes, line by line: a line that is not UTF-8 is that line's error, not the file's. (str's
    # splitlines would also split inside JSON strings, at U+2028 and other separators.)
    for number, text in enumerate(path.read_bytes().splitlines(), start=1):
        if text.strip():
            lines.append(_parse_line(text, number, seen, tool_parser))
    return lines


def _parse_line(text: bytes, number: int, seen: set[str], tool_parser: str | None) -> BatchLine:
    custom_id = f"line-{number}"
    try:
        item = loads_json(text, "the line")
        if not isinstance(item, dict):
            raise ValueError("each line must be a JSON object")
        custom_id = str(item.get("custom_id", custom_id))
        _check_envelope(item)
        if custom_id in seen:
            raise ValueError(f"duplicate custom_id {custom_id!r}")
        seen.add(custom_id)
        body = parse_line_body(item["url"], item["body"], tool_parser)
        params = body.params
        # Unseeded sampling is seeded from the custom_id (not the line's wire id), so a line's
        # output does not depend on where it sits in the file.
        if params.get("seed") is None:
            params["seed"] = seed_from_request_id(custom_id)
        # Wire ids are restricted to [A-Za-z0-9._:-]; custom_ids are free text.
        # As vLLM: the body's `model` names a LoRA adapter; the base model's name means none.
        model = item["body"].get("model")
        lora = model if isinstance(model, str) and model else None
        request = WireRequest(id=f"batch-line-{number}", params=params, lora=lora, priority=body.priority,
                              **body.prompt_fields)
        return BatchLine(custom_id, request, body=body)
    except (ValueError, CodecError) as error:  # UntrustedValueError is a ValueError
        log.warning("rejected batch line", line=number, custom_id=custom_id, error=str(error))
        return BatchLine(custom_id, None, str(error))


def _check_envelope(item: dict[str, Any]) -> None:
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise ValueError(f"unknown line field(s): {', '.join(unknown)}")
    if not isinstance(item.get("custom_id"), str) or not item["custom_id"]:
        raise ValueError("custom_id must be a non-empty string")
    if item.get("method", "POST") != "POST":
        raise ValueError(f"method must be POST, got {item.get('method')!r}")
    if item.get("url") not in URLS:
        raise ValueError(f"url must be {' or '.join(URLS)}, got {item.get('url')!r}")


# ---- running ---------------------------------------------------------------------------------

def run_offline(engine: LLMEngine, requests: list[WireRequest], progress: tqdm,
                max_unfinished: int | None = None, stop: threading.Event | None = None) -> dict[str, dict]:
    """Run `requests` through `engine.step()` in this thread; the same results as the actor graph.

    Call it on the thread that built the engine (actors/kit/device.py). At most `max_unfinished`
    requests (default 2 x max_num_seqs) are tokenized and queued at once, so a large file does
    not sit in the scheduler's waiting queue all at once. Setting `stop` (Ctrl-C in the CLI)
    ends the loop after the current step, with the results finished so far.
    """
    limit = max_unfinished or 2 * engine.config.scheduler.max_num_seqs
    pending = deque(requests)
    replies: dict[str, list[WireReply]] = {}
    results: dict[str, dict] = {}

    def finish(request_id: str) -> None:
        results[request_id] = assemble(request_id, replies.pop(request_id))
        progress.update(1)

    while (pending or replies) and not (stop is not None and stop.is_set()):
        while pending and len(replies) < limit:
            request = pending.popleft()
            replies[request.id] = []
            if (error := _add_offline(engine, request)) is not None:
                replies[request.id].append(to_wire(error))
                finish(request.id)
        if not replies:
            continue
        steps_before = engine.stats.num_steps
        for delta in engine.step():
            replies[delta.request_id].append(to_wire(delta))
            if delta.finished:
                finish(delta.request_id)
        if engine.stats.num_steps == steps_before:
            raise RuntimeError(f"the engine scheduled nothing with {len(replies)} request(s) unfinished")
    return results


def _add_offline(engine: LLMEngine, message: WireRequest) -> RequestDelta | None:
    """Queue one request; a request the engine refuses becomes its final error delta."""
    try:
        engine.add(build_request(engine.builder, message))
    except ValueError as error:
        log.info("request rejected", request_id=message.id, error=str(error))
        return RequestDelta(message.id, 0, [], error={"code": "invalid_request", "message": str(error)})
    return None


async def run_embedded(engine: LLMEngine, requests: list[WireRequest], progress: tqdm,
                       device: ThreadPoolExecutor | None = None) -> dict[str, dict]:
    """The worker's actor graph over memory streams, in this process (`device`: see build_graph).

    `aqueduct batch` uses run_offline; this runs the serving path end to end (tests, benchmarks)."""
    from actors.worker.run import build_graph

    inbox: MemoryStream[WireRequest | Malformed] = MemoryStream(maxsize=len(requests) + 1)
    sink = MemoryReplySink()

    async def no_dead_letters(message: Malformed) -> None:
        raise AssertionError(f"a batch line reached the engine undecodable: {message.error}")

    graph = build_graph(engine, inbox.consumer(), sink, "batch", no_dead_letters,
                        max_in_flight=2 * engine.config.scheduler.max_num_seqs, device=device)
    runtime = ActorRuntime(graph.actors, graph.intake, graph.admission.wait_idle, drain_timeout_s=5.0)
    stop = asyncio.Event()
    runtime.stop_when(stop)
    running = asyncio.create_task(runtime.run())
    producer = inbox.producer()
    for request in requests:
        await producer.send(request)
    results = {}
    for request in requests:
        waiting = asyncio.create_task(sink.wait_final(f"batch:out:{request.id}"))
        done, _ = await asyncio.wait([waiting, running], return_when=asyncio.FIRST_COMPLETED)
        if running in done:
            waiting.cancel()
            raise RuntimeError("the actor graph stopped before the batch finished (see the log)")
        results[request.id] = assemble(request.id, waiting.result())
        progress.update(1)
    stop.set()
    if await running != 0:
        raise RuntimeError("the actor graph failed while stopping")
    return results


async def run_remote(redis_url: str, prefix: str, requests: list[WireRequest], progress: tqdm) -> dict[str, dict]:
    """Submit to a running deployment and collect the answers."""
    async with AqueductClient(redis_url, prefix) as client:
        await client.submit_many(requests)

        async def collect(request: WireRequest) -> tuple[str, dict]:
            result = await client.result(request.id, n=request.params.get("n", 1))
            progress.update(1)
            return request.id, result

        return dict(await asyncio.gather(*(collect(request) for request in requests)))


# ---- output ----------------------------------------------------------------------------------

def write_results(lines: list[BatchLine], results: dict[str, dict], output_path: Path, model_name: str,
                  tokenizer: Any | None) -> dict[str, int]:
    errors = 0
    with output_path.open("w", encoding="utf-8") as out:
        for line in lines:
            result = results.get(line.request.id) if line.request is not None else None
            if result is None or result["error"] is not None:
                errors += 1
                message = line.error if result is None else result["error"]["message"]
                code = "invalid_request" if result is None else result["error"]["code"]
                record = _error_line(line.custom_id, message, code)
            else:
                record = _response_line(line, result, model_name, tokenizer)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return {"lines": len(lines), "errors": errors}


def _response_line(line: BatchLine, result: dict, model_name: str, tokenizer: Any | None) -> dict[str, Any]:
    assert line.request is not None and line.body is not None
    custom_id = line.custom_id
    body = answer_body(line.body, line.request, custom_id, result, model_name, tokenizer)
    return {"id": f"batch-{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 200, "body": body}, "error": None}


def _error_line(custom_id: str, message: str, code: str = "invalid_request") -> dict[str, Any]:
    error = {"code": code, "message": message}
    return {"id": f"batch-{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 400, "body": {"error": error}}, "error": error}
