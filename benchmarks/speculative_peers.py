"""The other sides of benchmarks/speculative.py: our engine behind a worker on Redis, and llama.cpp with
and without its prompt lookup (`LlamaPromptLookupDecoding` in llama-cpp-python) on the same GGUF file.

Each measures what speculative.py's engine loop does: one greedy request of `output_len` tokens
(EOS ignored), decode tokens/s from the first token on, and the output tokens.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from actors.cli.bench import llama_cpp_context, load_llama_cpp, load_llama_cpp_lookup
from actors.cli.bench_redis import RedisPath
from actors.kit.process_tuning import peer_omp_defaults
from queue_adapters.codec import WireRequest


async def worker_decode(path: RedisPath, prompt: list[int], output_len: int,
                        request_id: str) -> tuple[float, list[int]]:
    """Through `aqueduct bench-redis`'s worker on Redis (the actor graph, its device thread and the
    wire): decode tokens/s after the first reply entry's tokens, as the client receives them, and the
    tokens."""
    await path.client.submit(WireRequest(id=request_id, prompt_token_ids=prompt, params={
        "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True}))
    tokens: list[int] = []
    started, first = 0.0, 0
    async for reply in path.client.stream(request_id, timeout_s=600):
        if reply.error is not None:
            raise RuntimeError(f"{request_id}: {reply.error}")
        for choice in reply.choices:
            if choice.token_ids and not tokens:
                started, first = time.perf_counter(), len(choice.token_ids)
            tokens += choice.token_ids
    return (len(tokens) - first) / (time.perf_counter() - started), tokens


def llama_cpp_rates(gguf_path: Path, prompts: dict[str, list[int]], output_len: int, rounds: int, threads: int,
                    lookup_tokens: int) -> dict[tuple[str, str], list[float]] | None:
    """{(prompt, "plain" | "lookup"): decode tokens/s per round} through llama.cpp, in a child process (a
    native crash there ends the child, not the benchmark; None then)."""
    context = llama_cpp_context(max(map(len, prompts.values())), output_len)
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
