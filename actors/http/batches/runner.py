"""One batch, run to its end: validating -> in_progress -> finalizing -> completed (or expired, cancelled;
failed when its input file is gone or unusable).

Its lines are answered in file order, at most --batch-max-in-flight at a time (line_answer.py), each answer
recorded at once (batch_store.py keeps the first answer of a line, so none is answered twice). A runner that
starts on a batch another runner left (a gateway restart, a gateway that lost its hold) skips the lines already
answered and submits the others again under their wire ids, which reads what the workers already wrote.

Twice a second it looks for the batch's end: a cancel asked for (from any gateway) or its completion window
passed. Then its lines in flight are cancelled on the workers, and every line without an answer gets
`batch_cancelled` or `batch_expired`; the lines answered before are kept. Last, the answers go into the output
file (200s) and the error file (the rest), in line order, and the batch is finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import structlog
from redis.exceptions import RedisError

from actors.http.backends import Backend
from actors.http.batches.batch_store import BatchStore
from actors.http.batches.file_store import FileStore
from actors.http.batches.input_lines import InputFileError, InputLine, line_body, scan_lines
from actors.http.batches.line_answer import answer_line
from actors.http.batches.line_request import LineParser, LineRequest
from actors.http.batches.records import BatchRecord, line_wire_id
from actors.http.batches.result_files import write_result_files
from actors.http.batches.result_lines import BATCH_CANCELLED, BATCH_EXPIRED, answered_line, error_line, kept
from actors.http.errors import ApiError
from actors.http.limits import off_loop_if_large
from actors.http.options import BatchOptions

log = structlog.get_logger(__name__)
POLL_S = 0.5  # how often a runner looks for a cancel or its deadline
RETRY_S = 1.0  # after a Redis error, before trying a line's step again
_ENDED_AS = {None: "completed", BATCH_EXPIRED: "expired", BATCH_CANCELLED: "cancelled"}


@dataclass(slots=True)
class BatchContext:
    """What every runner of a gateway shares."""

    batches: BatchStore
    files: FileStore
    backend: Backend
    parser: LineParser
    options: BatchOptions


class BatchRunner:
    def __init__(self, context: BatchContext, batch_id: str) -> None:
        self.context, self.batch_id = context, batch_id
        self._wire_ids: dict[int, list[str]] = {}  # lines in flight -> their wire ids (to cancel them)
        self._checked_at = 0.0
        self._expired_lines = False  # a line's workers ended it at the batch's deadline: the batch expired

    async def run(self) -> None:
        record = await self.context.batches.load(self.batch_id)
        if record is None or record.finished:
            return
        data = await self.context.files.content(record.owner, record.input_file_id)
        if data is None:
            return await self._fail(record, "input_file_missing", "the input file was deleted or expired")
        try:
            lines = await asyncio.to_thread(scan_lines, data, self.context.options.max_lines)
        except InputFileError as error:
            return await self._fail(record, "invalid_input_file", str(error))
        record = await self._start(record)
        log.info("running a batch", batch_id=self.batch_id, lines=len(lines), status=record.status)
        ending = await self._run_lines(record, data, lines)
        await self._finalize(record, lines, ending or (BATCH_EXPIRED if self._expired_lines else None))

    async def _start(self, record: BatchRecord) -> BatchRecord:
        if record.status == "validating":
            record.status = "in_progress"
            record.times["in_progress_at"] = int(time.time())
            await self.context.batches.save(record)
        return record

    async def _run_lines(self, record: BatchRecord, data: bytes, lines: list[InputLine]) -> str | None:
        """None when every line is answered; else why the batch ended first."""
        answered = await self.context.batches.answered(self.batch_id)
        pending = deque(line for line in lines if line.index not in answered)
        running: set[asyncio.Task[None]] = set()
        try:
            while running or pending:
                ending = await self._ending(record)  # before submitting: a batch cancelled or expired runs nothing
                if ending is not None:
                    await self._stop(running, lines, ending)
                    return ending
                while pending and len(running) < self.context.options.max_in_flight:
                    running.add(asyncio.create_task(self._run_line(record, data, pending.popleft())))
                done, running = await asyncio.wait(running, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        log.error("a batch line's task failed", batch_id=self.batch_id, exc_info=task.exception())
            return None
        finally:  # stopped from outside (the gateway stops, or lost its hold): the lines stay on the workers
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _ending(self, record: BatchRecord) -> str | None:
        if time.monotonic() - self._checked_at < POLL_S:
            return None
        self._checked_at = time.monotonic()
        if time.time() >= record.expires_at:
            return BATCH_EXPIRED
        try:
            current = await self.context.batches.load(self.batch_id)
        except (RedisError, OSError) as error:
            log.warning("could not look for a cancel", batch_id=self.batch_id, error=str(error))
            return None
        return BATCH_CANCELLED if current is None or current.cancelling_at is not None else None

    async def _run_line(self, record: BatchRecord, data: bytes, line: InputLine) -> None:
        try:
            ok, text = await self._line_result(record, data, line)
        except Exception as error:  # a bug: this line's answer, never the batch's end
            log.exception("a batch line failed", batch_id=self.batch_id, line=line.number)
            ok, text = False, error_line(self.batch_id, line.index, line.custom_id, "internal_error",
                                         f"internal error: {type(error).__name__}")
        finally:
            self._wire_ids.pop(line.index, None)
        await self._record(line.index, text, ok)

    async def _line_result(self, record: BatchRecord, data: bytes, line: InputLine) -> tuple[bool, str]:
        if line.error is not None or line.url is None:
            return False, error_line(self.batch_id, line.index, line.custom_id, "invalid_request", line.error)
        wire_id = line_wire_id(self.batch_id, line.index)
        try:
            body = await off_loop_if_large(line.end - line.start, line_body, data, line)
            request = await off_loop_if_large(line.end - line.start, self.context.parser.parse, line.url, body,
                                              wire_id, record)
        except ApiError as error:
            status, answer = error.status, error.body()
        else:
            self._wire_ids[line.index] = [wire.id for wire in request.request.wires]
            status, answer = await self._answer(request, line)
            if _cut_by_the_deadline(record, status, answer):  # the workers ended it at the batch's deadline
                self._expired_lines = True
                return False, error_line(self.batch_id, line.index, line.custom_id, BATCH_EXPIRED)
        return status == 200, answered_line(self.batch_id, line.index, line.custom_id, wire_id, status, answer)

    async def _answer(self, request: LineRequest, line: InputLine) -> tuple[int, dict[str, Any]]:
        while True:
            try:
                return await answer_line(self.context.backend, request)
            except (RedisError, OSError) as error:  # the same wire ids again: nothing is generated twice
                log.warning("a batch line waits for Redis", batch_id=self.batch_id, line=line.number,
                            error=str(error))
                await asyncio.sleep(RETRY_S)

    async def _record(self, index: int, text: str, ok: bool) -> None:
        while True:
            try:
                await self.context.batches.record_line(self.batch_id, index, kept(text, ok), ok)
                return
            except (RedisError, OSError) as error:
                log.warning("a batch line's answer waits for Redis", batch_id=self.batch_id, error=str(error))
                await asyncio.sleep(RETRY_S)

    async def _stop(self, running: set[asyncio.Task[None]], lines: list[InputLine], ending: str) -> None:
        """Cancel the lines in flight (here and on the workers), then answer every unanswered line with `ending`."""
        wire_ids = [wire_id for ids in self._wire_ids.values() for wire_id in ids]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        running.clear()
        for wire_id in wire_ids:
            with contextlib.suppress(Exception):  # a lost cancel only costs compute
                await self.context.backend.cancel(wire_id)
        await self._answer_the_rest(lines, ending)
        log.info("batch ended early", batch_id=self.batch_id, reason=ending, lines_in_flight=len(wire_ids))

    async def _answer_the_rest(self, lines: list[InputLine], code: str, message: str | None = None) -> None:
        answered = await self.context.batches.answered(self.batch_id)
        for line in lines:
            if line.index not in answered:
                text = error_line(self.batch_id, line.index, line.custom_id, code, message)
                await self._record(line.index, text, False)

    async def _finalize(self, record: BatchRecord, lines: list[InputLine], ending: str | None) -> None:
        record.status = "finalizing"
        record.times["finalizing_at"] = int(time.time())
        await self.context.batches.save(record)
        await self._answer_the_rest(lines, "internal_error", "the line was not answered")  # never, but for a bug
        record.output_file_id, record.error_file_id = await write_result_files(
            self.context.batches, self.context.files, record)
        record.status = _ENDED_AS[ending]
        record.times[f"{record.status}_at"] = int(time.time())
        await self.context.batches.save(record)
        log.info("batch finished", batch_id=self.batch_id, status=record.status)

    async def _fail(self, record: BatchRecord, code: str, message: str) -> None:
        record.status, record.errors = "failed", [{"code": code, "message": message, "param": None, "line": None}]
        record.times["failed_at"] = int(time.time())
        await self.context.batches.save(record)
        log.warning("batch failed", batch_id=self.batch_id, code=code, error=message)


def _cut_by_the_deadline(record: BatchRecord, status: int, answer: dict[str, Any]) -> bool:
    """A line's wire deadline is the batch's: one that ended `timeout` once it passed was not answered (a choice
    that ended so, or an embedding's 504)."""
    if time.time() < record.expires_at:
        return False
    choices, error = answer.get("choices"), answer.get("error")
    if status == 504 and isinstance(error, dict) and error.get("code") == "timeout":
        return True
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") == "timeout" for choice in choices)
