"""The device thread: the one thread of a worker that runs torch work, model loading included.

OpenMP, torch's CPU threading, keeps a pool of worker threads per thread that starts parallel
regions. Once a second thread does (say the main thread loaded the model, then the device thread
runs the forwards), libgomp manages more threads than there are CPUs and stops spin-waiting
between regions: every forward paid a wake-up per op, ~25% slower on a 2-core box. So the engine
is built on the device thread too, and all of its torch work stays there.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.config import EngineConfig, ModelConfig
from pipeline.embedding_engine import EmbeddingEngine, wants_pooling
from pipeline.engine import LLMEngine
from pipeline.speculative.on_executor import ProposerOnExecutor


def device_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="aqueduct-device")


def load_engine(config: EngineConfig, device: ThreadPoolExecutor) -> LLMEngine | EmbeddingEngine:
    """Build the engine (load the model, allocate the KV cache) on `device`; waits for it. The pooling
    runner's (embeddings) for --runner pooling or a model with no language-model head."""
    return device.submit(build_engine, config).result()


def build_engine(config: EngineConfig) -> LLMEngine | EmbeddingEngine:
    from pipeline.loading.model_source import resolve_model
    from pipeline.model.loader import resolve_device, resolve_dtype

    model_dir = resolve_model(config.model.model, resolve_dtype(config.model.dtype,
                                                                resolve_device(config.model.device))).path
    return EmbeddingEngine(config) if wants_pooling(config, model_dir) else LLMEngine(config)


def draft_on_device(engine: LLMEngine, device: ThreadPoolExecutor) -> None:
    """Route the engine's draft model (if any) through the device thread."""
    speculator = engine.scheduler.speculator
    if engine.draft_model is not None and speculator is not None:
        speculator.proposer = ProposerOnExecutor(engine.draft_model, device)


def load_model_tokenizer(model: ModelConfig) -> tuple[Any, str]:
    """(tokenizer, name) of the model a deployment serves, without loading its weights: what a
    gateway or a batch client in front of workers needs for token strings (the text comes from the
    workers, which must serve this model)."""
    from pipeline.loading.model_source import resolve_model
    from pipeline.loading.tokenizer import load_served_tokenizer
    from pipeline.model.loader import resolve_device, resolve_dtype

    resolved = resolve_model(model.model, resolve_dtype(model.dtype, resolve_device(model.device)))
    return load_served_tokenizer(resolved.path, model.tokenizer, model.chat_template), resolved.name
