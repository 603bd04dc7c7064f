"""The device thread: the one thread of a worker that runs torch work, model loading included.

OpenMP, torch's CPU threading, keeps a pool of worker threads per thread that starts parallel
regions. Once a second thread does (say the main thread loaded the model, then the device thread
runs the forwards), libgomp manages more threads than there are CPUs and stops spin-waiting
between regions: every forward paid a wake-up per op, ~25% slower on a 2-core box. So the engine
is built on the device thread too, and all of its torch work stays there.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pipeline.config import EngineConfig
from pipeline.engine import LLMEngine


def device_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="aqueduct-device")


def load_engine(config: EngineConfig, device: ThreadPoolExecutor) -> LLMEngine:
    """Build the engine (load the model, allocate the KV cache) on `device`; waits for it."""
    return device.submit(LLMEngine, config).result()
