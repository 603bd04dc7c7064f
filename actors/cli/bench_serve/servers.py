"""The servers compared: how each is started on the same model, and which weights it gets.

- aqueduct: `aqueduct serve` embedded, at its defaults plus the engine flags given to `bench`.
- llama.cpp: `llama-server` on the GGUF file `--model` names (our packaged model's file itself),
  one slot per concurrent request, each slot with room for the longest request.
- vLLM: its OpenAI server (`vllm serve`, run by the given python) on an HF directory: the
  GGUF file as our loader converts it (every tensor dequantized to bfloat16, standard HF names),
  linked without our 4-bit block file, which vLLM would not know; an HF `--model` directory as it is.
  In bfloat16 where the CPU multiplies it natively, else in float32 (vllm_dtype).
A peer whose command is not installed, or that cannot serve the model, is skipped with the reason.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from actors.cli.bench import gguf_file_of
from actors.cli.bench_serve.engine_flags import given_engine_flags
from pipeline.model.cpu.library import cpu_has_bfloat16_arithmetic


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    command: list[str]
    weights: str  # what it serves, for the report
    env: dict[str, str] = field(default_factory=dict)  # added to the environment
    peer: bool = True  # started with the user's OpenMP wait policy, not ours


@dataclass(frozen=True, slots=True)
class Skipped:
    name: str
    reason: str


def request_context(args: argparse.Namespace) -> int:
    """Tokens of context the longest request needs, in 256s: two tokens a word leaves room for any tokenizer
    (SmolLM2 takes about one for these words)."""
    return -(-(2 * args.prompt_words[1] + args.output_len[1] + 64) // 256) * 256


def aqueduct_server(args: argparse.Namespace, model: str, port: int) -> ServerSpec:
    flags = given_engine_flags(args, skip=frozenset({"model"}))
    command = [sys.executable, "-m", "actors.cli", "serve", "--port", str(port), "--log-level", "WARNING",
               "--model", model, *flags]
    gguf = gguf_file_of(model)
    weights = f"--model {model}" + (f" = {gguf}" if gguf else "")
    return ServerSpec("aqueduct", command, f"{weights}; other flags: {' '.join(flags) or 'none (its defaults)'}",
                      peer=False)


def llama_server(args: argparse.Namespace, model: str, port: int) -> ServerSpec | Skipped:
    if args.skip_peer:
        return Skipped("llama.cpp", "--skip-peer")
    binary = args.llama_server or shutil.which("llama-server")
    if binary is None:
        return Skipped("llama.cpp", "no llama-server on PATH (give --llama-server PATH)")
    if not Path(binary).is_file():
        return Skipped("llama.cpp", f"--llama-server {binary} does not exist")
    gguf = gguf_file_of(model)
    if gguf is None:
        return Skipped("llama.cpp", f"the model ({model}) is not a GGUF file")
    slots = args.concurrency
    per_slot = request_context(args)
    threads = len(os.sched_getaffinity(0))
    command = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots),
               "--ctx-size", str(slots * per_slot), "--threads", str(threads), "--threads-batch", str(threads)]
    return ServerSpec("llama.cpp", command, f"{gguf} ({slots} slots of {per_slot} tokens, {threads} threads)")


def vllm_server(args: argparse.Namespace, model: str, port: int) -> ServerSpec | Skipped:
    if args.skip_peer:
        return Skipped("vLLM", "--skip-peer")
    if args.vllm_python is None:
        return Skipped("vLLM", "no --vllm-python given")
    if not Path(args.vllm_python).is_file():
        return Skipped("vLLM", f"--vllm-python {args.vllm_python} does not exist")
    model_dir = vllm_model_dir(model)
    max_len = request_context(args)
    dtype = vllm_dtype()
    command = [args.vllm_python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_len),
               "--served-model-name", "bench"]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
    gguf = gguf_file_of(model)
    what = f"{gguf.name} dequantized to bfloat16 by our converter" if gguf else "an HF directory"
    return ServerSpec("vLLM", command, f"{model_dir} ({what}; --dtype {dtype}, its default threads)", env)


def vllm_dtype() -> str:
    """bfloat16 where the CPU multiplies it natively, else float32: aqueduct's own `--dtype auto`. Without
    bfloat16 arithmetic (AVX2 only) vLLM's bfloat16 runs emulated: 2-core Zen 3 VM, SmolLM2, 11.8 output
    tokens/s for 32 concurrent requests (docs/benchmarks.md), not what a user of that box would run."""
    return "bfloat16" if cpu_has_bfloat16_arithmetic() else "float32"


def vllm_model_dir(model: str) -> Path:
    """An HF directory for `model`: a GGUF file dequantized to bfloat16 by our converter, linked
    without gguf_blocks.safetensors; an HF directory (or `builtin`'s) as it is."""
    import torch

    from pipeline.loading.model_source import resolve_model

    gguf = gguf_file_of(model)
    if gguf is None:
        return resolve_model(model, torch.bfloat16).path
    from pipeline.loading.gguf import gguf_model_dir
    from pipeline.loading.gguf.quant_blocks import BLOCKS_FILE

    converted = gguf_model_dir(gguf, torch.bfloat16)
    target = converted.with_name(f"{converted.name}-hf")
    if not target.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=converted.parent))
        staging.chmod(0o755)
        for path in converted.iterdir():
            if path.name != BLOCKS_FILE:
                (staging / path.name).symlink_to(path)
        staging.rename(target)
    return target
