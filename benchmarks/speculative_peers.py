"""The other sides of benchmarks/speculative.py: our engine behind a worker on Redis, and llama.cpp with
and without its prompt lookup (`LlamaPromptLookupDecoding` in llama-cpp-python) on the same GGUF file.

Each measures what speculative.py's engine loop does: one greedy request of `output_len` tokens
(EOS ignored), decode tokens/s from the first token on, and the output tokens.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from actors.cli.bench import load_llama_cpp, load_llama_cpp_lookup
from actors.kit.process_tuning import peer_omp_defaults
from actors.worker.run import WorkerOptions, run_worker
from pipeline.engine import LLMEngine
from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest


class WorkerPath:
    """A worker on Redis (the actor graph, its device thread and the wire) in front of `engine`, and a
    client; the worker runs as a task on the caller's event loop, as `aqueduct bench-redis` runs it."""

    def __init__(self, engine: LLMEngine, redis_url: str) -> None:
        self.prefix = f"bench-spec-{uuid.uuid4().hex[:8]}"
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(run_worker(engine, WorkerOptions(redis_url, self.prefix, name="bench"),
                                                   self.stop))
        self.client = AqueductClient(redis_url, self.prefix)

    async def decode(self, prompt: list[int], output_len: int, request_id: str) -> tuple[float, list[int]]:
        """Decode tokens/s after the first reply entry's tokens, as the client receives them, and the tokens."""
        await self.client.submit(WireRequest(id=request_id, prompt_token_ids=prompt, params={
            "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True}))
        tokens: list[int] = []
        started, first = 0.0, 0
        async for reply in self.client.stream(request_id, timeout_s=600):
            if reply.error is not None:
                raise RuntimeError(f"{request_id}: {reply.error}")
            for choice in reply.choices:
                if choice.token_ids and not tokens:
                    started, first = time.perf_counter(), len(choice.token_ids)
                tokens += choice.token_ids
        return (len(tokens) - first) / (time.perf_counter() - started), tokens

    async def close(self) -> None:
        self.stop.set()
        await self.task
        keys = [key async for key in self.client.redis.scan_iter(f"{self.prefix}:*")]
        if keys:
            await self.client.redis.delete(*keys)
        await self.client.close()


def llama_cpp_rates(gguf_path: Path, prompts: dict[str, list[int]], output_len: int, rounds: int, threads: int,
                    lookup_tokens: int) -> dict[tuple[str, str], list[float]] | None:
    """{(prompt, "plain" | "lookup"): decode tokens/s per round} through llama.cpp, in a child process (a
    native crash there ends the child, not the benchmark; None then)."""
    # Room for drafts past the last token; a multiple of 256, as llama.cpp rounds its context up to one
    # while 0.3.36's logits buffer keeps the size asked for.
    context = -(-(max(map(len, prompts.values())) + output_len + 256) // 256) * 256
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with peer_omp_defaults():
            future = pool.submit(_llama_cpp_child, gguf_path, prompts, output_len, rounds, threads, lookup_tokens,
                                 context)
        try:
            return future.result()
        except BrokenProcessPool:
            return None


def _llama_cpp_child(gguf_path: Path, prompts: dict[str, list[int]], output_len: int, rounds: int, threads: int,
                     lookup_tokens: int, context: int) -> dict[tuple[str, str], list[float]]:
    models = {"plain": load_llama_cpp(gguf_path, context, threads),
              "lookup": load_llama_cpp_lookup(gguf_path, context, threads, lookup_tokens)}
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, prompt in prompts.items():
            for method, llama in models.items():
                rates.setdefault((name, method), []).append(_llama_cpp_decode(llama, prompt, output_len))
    return rates


def _llama_cpp_decode(llama: object, prompt: list[int], output_len: int) -> float:
    started = 0.0
    for count, _token in enumerate(llama.generate(prompt, temp=0.0, top_k=1, reset=True), start=1):
        if count == 1:
            started = time.perf_counter()
        if count == output_len:
            break
    return (output_len - 1) / (time.perf_counter() - started)
