"""A finished batch's result files: its lines' answers in line order, the 200s in the output file and the rest in
the error file (OpenAI's `output_file_id`, `error_file_id`; none when it would be empty). Their ids follow from
the batch's, so a gateway that writes them again (it stopped before saving the batch finished) overwrites them.
"""

from __future__ import annotations

import time

from actors.http.batches.batch_store import BatchStore
from actors.http.batches.file_store import FileStore
from actors.http.batches.records import BatchRecord, FileRecord, result_file_id
from actors.http.batches.result_lines import unkept

_READ_CHUNK = 1000  # answers read per round trip


async def write_result_files(batches: BatchStore, files: FileStore,
                             record: BatchRecord) -> tuple[str | None, str | None]:
    """(output file id, error file id)."""
    output, errors = bytearray(), bytearray()
    for start in range(0, record.total, _READ_CHUNK):
        for text in await batches.lines(record.id, start, min(record.total, start + _READ_CHUNK)):
            if text is None:
                continue  # none: the runner answers every line before this
            ok, line = unkept(text)
            (output if ok else errors).extend(line.encode() + b"\n")
    return (await _saved(files, record, "output", bytes(output)), await _saved(files, record, "errors", bytes(errors)))


async def _saved(files: FileStore, record: BatchRecord, kind: str, data: bytes) -> str | None:
    if not data:
        return None
    now = int(time.time())
    file = FileRecord(id=result_file_id(record.id, kind), owner=record.owner, bytes=len(data), created_at=now,
                      filename=f"{record.id}_{kind}.jsonl", purpose="batch_output",
                      expires_at=now + record.output_ttl_s)
    await files.save(file, data)
    return file.id
