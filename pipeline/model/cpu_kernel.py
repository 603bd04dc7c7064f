"""The native CPU decode-attention kernel: compiled on first use with the system C compiler.

The kernel (csrc/paged_decode_attention.c) is plain C with OpenMP, loaded through ctypes, so
building it takes about a second and needs no torch headers. The shared object is cached by
source hash under $AQUEDUCT_CACHE_DIR/kernels. When no compiler is available, or
AQUEDUCT_CPU_KERNEL=0, `load_decode_kernel()` returns None and attention stays on the portable
torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import structlog
import torch

from pipeline.cache_dir import cache_dir

log = structlog.get_logger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.c"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


class DecodeKernel:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.paged_decode_attention_f32
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn.argtypes = [p, p, p, p, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float, i64, i64,
                             ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int]
        self._fn.restype = ctypes.c_int

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, max_seq_len: int, scale: float, window: int = 0,
                 softcap: float = 0.0, kv_format: int = 0, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> torch.Tensor:
        """q [B, H, D] float32 -> out [B, H, D]; kv_cache [2, N, block_size, H_kv, D] float32, or fp8
        bytes (kv_format 1 = e4m3, 2 = e5m2) whose values are byte * k_scale / v_scale;
        block_tables [B, M] int32 and seq_lens [B] int32, all contiguous on the CPU.
        window > 0: attend to the last `window` tokens only; softcap > 0: Gemma 2's soft-capping."""
        q = q.contiguous()
        out = torch.empty_like(q)
        num_seqs, num_heads, head_dim = q.shape
        _, _, block_size, num_kv_heads, _ = kv_cache.shape
        failed = self._fn(out.data_ptr(), q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
                          block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(),
                          num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, max_seq_len,
                          window, softcap, kv_format, k_scale, v_scale, torch.get_num_threads())
        if failed:
            raise MemoryError("paged decode attention kernel could not allocate its scratch buffers")
        return out


def _compile(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        built = Path(staging) / target.name
        subprocess.run([compiler, *_FLAGS, str(_SOURCE), "-o", str(built), "-lm"],
                       check=True, capture_output=True, text=True)
        os.replace(built, target)  # atomic: concurrent processes never load a half-written file


@functools.cache
def load_decode_kernel() -> DecodeKernel | None:
    if os.environ.get("AQUEDUCT_CPU_KERNEL", "1") == "0":
        return None
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"paged_decode_attention-{digest}.so"
    try:
        if not target.exists():
            _compile(target)
            log.info("compiled CPU attention kernel", path=str(target))
        return DecodeKernel(ctypes.CDLL(str(target)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        log.warning("CPU attention kernel unavailable; using the torch path", error=detail[-500:])
        return None
