"""Control actor: every worker reads `{prefix}:control` (no consumer group: a cancel must reach
whichever worker holds the request, and every worker applies a LoRA load or unload).

Cancels go to the scheduler. `load_lora` makes the name known at once (requests for it wait in
the scheduler), then the adapter is read and checked on the device thread, which owns the LoRA
slots; a failed load forgets the name again (requests waiting for it get an error reply).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from actors.messages import Cancel
from pipeline.lora.adapter import LoRAError
from pipeline.lora.registry import LoRARegistry
from queue_adapters.base import Producer
from queue_adapters.codec import CodecError, WireControl, decode_control
from queue_adapters.redis_streams import DATA_FIELD, Backoff

log = structlog.get_logger(__name__).bind(actor="control")


class ControlActor:
    name = "control"

    def __init__(self, redis: aioredis.Redis, prefix: str, to_scheduler: Producer[Any], block_ms: int = 1000,
                 loras: LoRARegistry | None = None, device: ThreadPoolExecutor | None = None) -> None:
        self.redis = redis
        self.key = f"{prefix}:control"
        self.to_scheduler = to_scheduler
        self.block_ms = block_ms
        self.loras = loras
        self.device = device
        self.backoff = Backoff()

    async def run(self) -> None:
        last_id = "$"  # only entries issued from now on
        while True:
            try:
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

    async def _forward(self, fields: dict[bytes, bytes]) -> None:
        try:
            control = decode_control(fields.get(DATA_FIELD, b""))
        except CodecError as error:
            log.warning("ignored malformed control entry", error=str(error))
            return
        if control.cancel is not None:
            await self.to_scheduler.send(Cancel(control.cancel))
        else:
            await self._apply_lora(control)

    async def _apply_lora(self, control: WireControl) -> None:
        if self.loras is None or self.device is None:
            log.warning("ignored LoRA control entry: LoRA is not enabled on this worker (--enable-lora)")
            return
        if control.unload_lora is not None:
            known = self.loras.unload(control.unload_lora)
            log.info("lora adapter unloaded" if known else "unload of an unknown lora adapter ignored",
                     adapter=control.unload_lora)
            return
        assert control.load_lora is not None  # decode_control: exactly one key
        name, path = control.load_lora.name, control.load_lora.path
        adapter_id = self.loras.reserve(name, path)
        try:
            await asyncio.wrap_future(self.device.submit(self.loras.complete, adapter_id))
        except LoRAError as error:
            log.warning("lora adapter load failed", adapter=name, path=path, error=str(error))
            return
        log.info("lora adapter loaded", adapter=name, path=path, adapter_id=adapter_id)
