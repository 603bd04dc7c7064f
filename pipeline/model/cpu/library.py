"""Building and loading the native CPU kernels' shared library (csrc/*.c) with the system C compiler.

The shared object is cached by a hash of the sources, headers, flags and CPU (model, features)
under $AQUEDUCT_CACHE_DIR/kernels; AQUEDUCT_CPU_KERNEL=0, or no compiler, gives None.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from pipeline.loading.cache_dir import cache_dir

log = structlog.get_logger(__name__)

_CSRC = Path(__file__).parent / "csrc"
# -ffp-contract=off: no multiply-add is fused unless a file asks for it (rope must round as torch
# does, product by product; the attention kernel turns fusing on for itself).
_POOL_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-pthread", "-shared", "-fPIC", "-std=c11"]
# One library, so that one pool of threads serves every kernel that splits its work.
_POOLED_SOURCES = ("thread_pool", "few_rows_linear", "panel_linear", "int8_linear", "int4_linear", "int4_amx",
                   "gguf_linear", "gguf_columns", "paged_decode_attention", "rms_norm", "rope_kv_write",
                   "decoder_layers", "silu_table")


def bind(library: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any) -> Any:
    """`library`'s C function `name`, with its argument and result types declared for ctypes."""
    function = getattr(library, name)
    function.argtypes, function.restype = argtypes, restype
    return function


def _compile(sources: list[Path], flags: list[str], target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        objects = _compile_objects(compiler, sources, flags, Path(staging))
        built = Path(staging) / target.name
        _run_compiler([compiler, *flags, *map(str, objects), "-o", str(built), "-lm"])
        os.replace(built, target)  # atomic: concurrent processes never load a half-written file


def _compile_objects(compiler: str, sources: list[Path], flags: list[str], staging: Path) -> list[Path]:
    """Each source to its own object file, as many at once as this process has CPUs.

    A first run's build is a start-up cost: one compiler call over every source took ~14 s on two
    cores, one of them idle; the longest source (~5 s) goes first so that it does not finish last.
    """
    objects = [staging / f"{index}-{source.stem}.o" for index, source in enumerate(sources)]
    jobs = sorted(zip(sources, objects, strict=True), key=lambda job: job[0].stat().st_size, reverse=True)
    with ThreadPoolExecutor(max_workers=_usable_cpus()) as pool:
        builds = [pool.submit(_run_compiler, [compiler, *flags, "-c", str(source), "-o", str(obj)])
                  for source, obj in jobs]
        for build in builds:
            build.result()  # the first failure raises here, with the compiler's stderr
    return objects


def _run_compiler(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _load_library(name: str, flags: list[str], sources: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    """The shared object built from csrc/{source}.c for each of `sources` (default: `name`)."""
    if os.environ.get("AQUEDUCT_CPU_KERNEL", "1") == "0":
        return None
    paths = [_CSRC / f"{source}.c" for source in sources or (name,)]
    headers = b"".join(header.read_bytes() for header in sorted(_CSRC.glob("*.h")))  # what the sources include
    code = b"".join(path.read_bytes() for path in paths)
    digest = hashlib.sha256(code + headers + " ".join(flags).encode() + _cpu_identity()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{name}-{digest}.so"
    try:
        if not target.exists():
            _compile(paths, flags, target)
            log.info("compiled CPU kernel", path=str(target))
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        log.warning("CPU kernel unavailable; using the torch path", kernel=name, error=detail[-500:])
        return None


@functools.cache
def _cpu_info_lines() -> tuple[str, ...]:
    """/proc/cpuinfo's distinct model and feature lines (x86 and ARM spellings); empty where it is absent."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ()
    keys = ("model name", "flags", "Features", "CPU part")
    return tuple(sorted({line for line in lines if line.split(":")[0].strip() in keys}))


def cpu_has_bfloat16_arithmetic() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), as vLLM's `--dtype auto` asks."""
    return not cpu_flags().isdisjoint(("avx512_bf16", "amx_bf16"))


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (e.g. "avx512_bf16"); empty where it is absent."""
    return frozenset(word for line in _cpu_info_lines() if line.split(":")[0].strip() in ("flags", "Features")
                     for word in line.split(":", 1)[1].split())


def _cpu_identity() -> bytes:
    """The CPU's model and feature flags: -march=native objects built on one CPU may fault on another
    (a cache directory shared between hosts), so each CPU gets its own."""
    lines = _cpu_info_lines()
    return "\n".join(lines).encode() if lines else platform.processor().encode()


def pooled_library() -> ctypes.CDLL | None:
    """Not cached here (the public loaders are): loading the same file again shares its one pool."""
    return _load_library("pooled_kernels", _POOL_FLAGS, _POOLED_SOURCES)
