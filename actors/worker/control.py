"""Control actor: every worker reads `{prefix}:control` (no consumer group: a cancel must reach
whichever worker holds the request, and every worker applies a LoRA load or unload).

Cancels go to the scheduler. `load_lora` makes the name known at once (requests for it wait in
the scheduler), then the adapter is read and checked on the device thread, which owns the LoRA
slots; a failed load forgets the name again (requests waiting for it get an error reply).

Every load and unload is answered by each worker, on the entry's `reply_to` or on
`{prefix}:control:results`: the sender learns which workers serve the adapter, or why not. Nothing
an entry holds can stop the actor: an entry that does not decode, a path outside `--lora-root`, an
adapter whose files are garbage are all that entry's error answer.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from actors.kit.messages import Cancel
from pipeline.lora.registry import LoRARegistry
from queue_adapters.base import Producer
from queue_adapters.codec import CodecError, WireControl, WireControlResult, decode_control, encode
from queue_adapters.redis_streams import DATA_FIELD, Backoff

log = structlog.get_logger(__name__).bind(actor="control")
RESULTS_MAXLEN = 10_000  # answers kept on the results stream (approximate trim)


class ControlActor:
    name = "control"

    def __init__(self, redis: aioredis.Redis, prefix: str, to_scheduler: Producer[Any], block_ms: int = 1000,
                 loras: LoRARegistry | None = None, device: ThreadPoolExecutor | None = None,
                 worker_name: str = "", lora_root: str | Path | None = None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.key = f"{prefix}:control"
        self.to_scheduler = to_scheduler
        self.block_ms = block_ms
        self.loras = loras
        self.device = device
        self.worker_name = worker_name
        self.lora_root = Path(lora_root).resolve() if lora_root is not None else None
        self.backoff = Backoff()
        if loras is not None and self.lora_root is None:
            log.warning("--lora-root is not set: a load_lora control entry may name any directory this worker "
                        "can read")

    async def run(self) -> None:
        last_id: str | bytes | None = None
        while True:
            try:
                if last_id is None:
                    last_id = await self._newest_id()
                response = await self.redis.xread({self.key: last_id}, block=self.block_ms, count=100)
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                log.warning("control stream unreachable; retrying", error=str(error))
                await asyncio.sleep(self.backoff.next_delay_s())
                continue
            self.backoff.reset()
            for _, entries in response or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    await self._forward(fields)

    async def _newest_id(self) -> str | bytes:
        """Where "entries issued from now on" begin, as a concrete id: reading from `$` on every call
        would skip an entry added between two reads; "0-0" when the stream has none yet."""
        newest = await self.redis.xrevrange(self.key, count=1)
        return newest[0][0] if newest else "0-0"

    async def _forward(self, fields: dict[bytes, bytes]) -> None:
        try:
            control = decode_control(fields.get(DATA_FIELD, b""))
        except CodecError as error:
            log.warning("malformed control entry", error=str(error))
            await self._answer(WireControlResult(worker=self.worker_name, op="invalid", ok=False, id=error.request_id,
                                                 error=str(error)), error.reply_to)
            return
        if control.cancel is not None:
            await self.to_scheduler.send(Cancel(control.cancel))
            return
        result = await apply_lora(control, self.loras, self.device, self.lora_root, self.worker_name)
        await self._answer(result, control.reply_to)

    async def _answer(self, result: WireControlResult, reply_to: str | None) -> None:
        key = f"{self.prefix}:control:results"
        if reply_to is not None and reply_to.startswith(f"{self.prefix}:out:"):
            key = reply_to  # a reply stream of the sender's; anything else goes to the results stream
        try:
            await self.redis.xadd(key, {DATA_FIELD: encode(result)}, maxlen=RESULTS_MAXLEN, approximate=True)
        except (RedisError, OSError) as error:  # e.g. the key is not a stream: logged, never fatal
            log.warning("control answer not written", key=key, error=str(error))


async def apply_lora(control: WireControl, loras: LoRARegistry | None, device: ThreadPoolExecutor | None,
                     lora_root: Path | None, worker_name: str) -> WireControlResult:
    """Apply a load_lora or unload_lora entry to `loras` and say how it went: the control actor's
    path, and the embedded gateway's (its HTTP loads). The files are read on `device`, the thread
    that owns the LoRA slots; nothing the entry holds raises."""
    op = "unload_lora" if control.unload_lora is not None else "load_lora"
    adapter = control.unload_lora if control.unload_lora is not None else control.load_lora.name

    def answer(ok: bool, error: str | None = None) -> WireControlResult:
        return WireControlResult(worker=worker_name, op=op, ok=ok, id=control.id, adapter=adapter, error=error)

    if loras is None or device is None:
        return answer(False, "LoRA is not enabled on this worker (--enable-lora)")
    if control.unload_lora is not None:
        known = loras.unload(control.unload_lora)
        log.info("lora adapter unloaded" if known else "unload of an unknown lora adapter", adapter=adapter)
        return answer(known, None if known else f"no adapter named {adapter!r} is loaded")
    path = control.load_lora.path
    refusal = lora_path_refusal(path, lora_root)
    if refusal is not None:
        log.warning("lora adapter path refused", adapter=adapter, path=path, error=refusal)
        return answer(False, refusal)
    adapter_id = loras.reserve(adapter, path, lora_root)  # checked again where the files are read
    try:
        await asyncio.wrap_future(device.submit(loras.complete, adapter_id))
    except Exception as error:  # the registry forgot the name; the files were the entry's fault
        log.warning("lora adapter load failed", adapter=adapter, path=path, error=str(error))
        return answer(False, str(error))
    log.info("lora adapter loaded", adapter=adapter, path=path, adapter_id=adapter_id)
    return answer(True)


def lora_path_refusal(path: str, lora_root: Path | None) -> str | None:
    """Why `path` may not be loaded (None: it may): outside --lora-root (given resolved) once symlinks
    are resolved."""
    if lora_root is None:
        return None
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as error:  # a symlink loop, a NUL in the path
        return f"the path cannot be resolved: {error}"
    if not resolved.is_relative_to(lora_root):
        return f"the path is outside --lora-root {str(lora_root)!r}"
    return None
