"""`aqueduct bench`: one synthetic workload through this engine and through HF transformers.

The workload is N requests with prompt and output lengths uniform in the given ranges, random
token-id prompts, greedy, ignore_eos (every request generates exactly its output length). The
baseline is HF `generate` with static batching and left padding on the same weights: a batch
runs until its longest request is done, so only each request's own output length counts as
useful tokens on both sides. Model loading is outside both timings.

HF runs in a child process of its own, as a user would run it: with OpenMP's default wait policy
(idle threads spin a while), not the PASSIVE policy this process sets for itself
(process_tuning.passive_omp_wait), which slowed HF by 7-15% on a 2-core box; with the same
compute threads and malloc tuning as ours.

When llama-cpp-python is installed (optional, not a dependency) and the model is a GGUF file, the
same workload also runs through llama.cpp on that file, one request at a time (the library's only
mode), and its ratio is printed beside HF's.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from actors.cli.engine_args import engine_config_from_args
from actors.kit.process_tuning import peer_omp_defaults, tune_glibc_malloc
from pipeline.engine import EngineStats, LLMEngine
from pipeline.loading.model_source import PACKAGED_MODELS, packaged_model_file
from pipeline.request.sampling_params import SamplingParams

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def useful_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                  vocab_size: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(prompt_len[0], prompt_len[1] + 1, num_requests)
    # Token 0 is avoided: the HF baseline pads with it.
    prompts = [rng.integers(1, vocab_size, n).tolist() for n in prompt_lens]
    output_lens = rng.integers(output_len[0], output_len[1] + 1, num_requests).tolist()
    return Workload(prompts, output_lens)


def run_engine(engine: LLMEngine, workload: Workload) -> tuple[float, float, float]:
    """Seconds of wall time, and the shares of it spent in the model forward and in sampling."""
    engine.stats = EngineStats()
    started = time.perf_counter()
    for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        engine.add_request(f"bench-{index}", prompt, params)
    while engine.has_unfinished:
        engine.step()
    elapsed = time.perf_counter() - started
    return elapsed, engine.stats.forward_seconds / elapsed, engine.stats.sample_seconds / elapsed


def run_hf(model_dir: str, workload: Workload, batch_size: int, threads: int | None = None) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    if threads is not None:
        torch.set_num_threads(threads)
    tune_glibc_malloc()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: generate the full length
    model.generation_config.pad_token_id = 0
    started = time.perf_counter()
    for start in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[start:start + batch_size]
        max_new = max(workload.output_lens[start:start + batch_size])
        width = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new,
                           do_sample=False)
    return time.perf_counter() - started


def time_hf(model_dir: str, workload: Workload, batch_size: int, threads: int) -> tuple[float, str | None]:
    """run_hf in a spawned child process with the user's OpenMP wait policy (module docstring):
    its seconds, and the OMP_WAIT_POLICY the child saw (None: libgomp's default)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with peer_omp_defaults():
            future = pool.submit(_hf_child, model_dir, workload, batch_size, threads)
        return future.result()


def _hf_child(model_dir: str, workload: Workload, batch_size: int, threads: int) -> tuple[float, str | None]:
    return run_hf(model_dir, workload, batch_size, threads), os.environ.get("OMP_WAIT_POLICY")


def gguf_file_of(model: str) -> Path | None:
    """The GGUF file `--model` names (a packaged model, a .gguf file, a directory holding one), else None."""
    if model in PACKAGED_MODELS:
        return packaged_model_file(model)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    ggufs = sorted(path.glob("*.gguf")) if path.is_dir() and not (path / "config.json").exists() else []
    return ggufs[0] if len(ggufs) == 1 else None


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_context(prompt_len: int, output_len: int) -> int:
    """llama.cpp's context for such requests: room for prompt lookup's drafts past the last token, in a
    multiple of 256, as llama.cpp rounds its context up to one while llama-cpp-python 0.3.36 sizes its
    logits buffer by the size asked for."""
    return -(-(prompt_len + output_len + 256) // 256) * 256


def load_llama_cpp(gguf_path: Path, context: int, threads: int, **options: object) -> object:
    """llama-cpp-python's Llama on the file; `options` go to its constructor (e.g. draft_model)."""
    from llama_cpp import Llama

    return Llama(model_path=str(gguf_path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                 verbose=False, **options)


def load_llama_cpp_lookup(gguf_path: Path, context: int, threads: int, lookup_tokens: int) -> object:
    """llama.cpp with its prompt lookup (`LlamaPromptLookupDecoding`): the continuation of the first
    earlier match of the last 4 .. 1 tokens, up to `lookup_tokens` of them, verified in one batch.
    logits_all too: llama-cpp-python 0.3.36 sizes its logits buffer by that argument, not by the draft
    model's need for every position's logits, and overflows it past 512 tokens otherwise."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    return load_llama_cpp(gguf_path, context, threads, logits_all=True,
                          draft_model=LlamaPromptLookupDecoding(max_ngram_size=4, num_pred_tokens=lookup_tokens))


def run_llama_cpp(llama: object, workload: Workload) -> float:
    """Seconds for the workload through llama.cpp, one request at a time, greedy, ignoring EOS."""
    started = time.perf_counter()
    for prompt, output_len in zip(workload.prompts, workload.output_lens, strict=True):
        for count, _token in enumerate(llama.generate(prompt, temp=0.0, top_k=1, reset=True), start=1):
            if count == output_len:
                break
    return time.perf_counter() - started


def _peer_seconds(gguf_path: Path, workload: Workload, context: int, threads: int,
                  lookup_tokens: int | None = None) -> float:
    """In a child process: load llama.cpp (with its prompt lookup of `lookup_tokens` draft tokens when
    given), warm up, time the workload."""
    llama = (load_llama_cpp(gguf_path, context, threads) if lookup_tokens is None
             else load_llama_cpp_lookup(gguf_path, context, threads, lookup_tokens))
    run_llama_cpp(llama, Workload([[1, 2, 3, 4, 5, 6, 7, 8]], [4]))
    return run_llama_cpp(llama, workload)


def time_llama_cpp(gguf_path: Path, workload: Workload, threads: int, lookup_tokens: int | None = None) -> float | None:
    """Seconds for the workload through llama.cpp (with its prompt lookup when `lookup_tokens` is given),
    in a child process: a native crash there (seen with a build whose AMX path dies in a VM,
    docs/benchmarks.md) ends the child, not the benchmark. None if it crashed."""
    context = llama_cpp_context(max(len(p) for p in workload.prompts), max(workload.output_lens))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with peer_omp_defaults():  # the child starts here, with llama.cpp's own OpenMP wait policy
            future = pool.submit(_peer_seconds, gguf_path, workload, context, threads, lookup_tokens)
        try:
            return future.result()
        except BrokenProcessPool:
            return None


def _print_peer(engine: LLMEngine, workload: Workload, ours_rate: float) -> None:
    gguf_path = gguf_file_of(str(engine.config.model.model))
    if not llama_cpp_available() or gguf_path is None:
        reason = "llama-cpp-python not installed" if gguf_path is not None else "the model is not a GGUF file"
        print(f"llama.cpp: skipped ({reason})")
        return
    import torch

    speculative = engine.config.speculative
    # Against our prompt lookup, llama.cpp's own (the same number of draft tokens).
    lookup = speculative.num_speculative_tokens if speculative is not None and speculative.method == "ngram" else None
    seconds = time_llama_cpp(gguf_path, workload, torch.get_num_threads(), lookup)
    if seconds is None:
        print("llama.cpp: its process crashed (a native fault in llama-cpp-python); no peer figures")
        return
    rate = workload.useful_tokens / seconds
    how = "one request at a time" + ("" if lookup is None else f", prompt lookup of {lookup} tokens")
    print(f"llama.cpp ({gguf_path.name}, {how}): {seconds:.2f} s, {rate:.1f} useful tokens/s")
    print(f"ratio aqueduct / llama.cpp: {ours_rate / rate:.2f}x")


def run_bench(args: argparse.Namespace) -> None:
    import torch

    engine = LLMEngine(engine_config_from_args(args))
    workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len),
                             engine.vocab_size, args.workload_seed)
    # Warm-up (allocator, kernels) on a tiny workload, outside the timing.
    run_engine(engine, make_workload(4, (8, 16), (4, 8), engine.vocab_size, seed=1))
    ours_seconds, forward_share, sample_share = run_engine(engine, workload)
    ours_rate = workload.useful_tokens / ours_seconds
    print(f"workload: {args.num_requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"output {args.output_len[0]}-{args.output_len[1]} tokens, {workload.useful_tokens} useful tokens")
    print(f"aqueduct: {ours_seconds:.2f} s, {ours_rate:.1f} useful tokens/s, "
          f"model forward {forward_share:.0%} of wall time, sampling {sample_share:.0%}, "
          f"{engine.stats.num_steps} steps, preemptions {engine.scheduler.num_preemptions}")
    speculator = engine.scheduler.speculator
    if speculator is not None:
        drafted, accepted = speculator.num_draft_tokens, speculator.num_accepted_tokens
        print(f"speculative decoding ({speculator.config.method}, k={speculator.config.num_speculative_tokens}): "
              f"{accepted} of {drafted} drafted tokens accepted ({accepted / max(drafted, 1):.0%}), warm-up included")
    if not args.skip_peer:
        _print_peer(engine, workload, ours_rate)
    if args.skip_hf:
        return
    batch_size = args.hf_batch_size or args.num_requests
    hf_seconds, _ = time_hf(str(engine.model_dir), workload, batch_size, torch.get_num_threads())
    hf_rate = workload.useful_tokens / hf_seconds
    print(f"hf-generate (static batch {batch_size}): {hf_seconds:.2f} s, {hf_rate:.1f} useful tokens/s")
    print(f"ratio aqueduct / hf: {ours_rate / hf_rate:.2f}x")
