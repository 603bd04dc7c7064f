"""Process-wide tuning for CPU inference, applied by the CLI.

glibc serves allocations above its mmap threshold (dynamic, up to 32 MiB) with fresh mmaps and
returns them on free, so every step's multi-MB activations page-fault anew. Raising the mmap and
trim thresholds keeps freed blocks in the heap for reuse: about 10% faster steps on a 70M-param
model here. Best effort: anything but glibc is left alone.

The garbage collector: see startup_collector_paused. Compute threads: see set_compute_threads.
Idle compute threads: see passive_omp_wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit


def tune_glibc_malloc() -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**30) == 1
    log.debug("malloc thresholds raised" if ok else "malloc tuning not applied")
    return ok


def passive_omp_wait() -> bool:
    """Idle OpenMP threads sleep instead of spinning: OMP_WAIT_POLICY=PASSIVE unless the user set a policy.

    By default libgomp keeps idle threads spinning for a while after each parallel region. When the
    decode kernels still ran on OpenMP, a SmolLM2 float32 step with one other busy process on a
    2-core KVM box took 174 ms spinning vs 94 ms passive: the spinning threads took CPU that process
    and the Python thread needed. Deployments share hosts, so passive is the default for torch's own
    parallel ops (prefill, batched steps); the native decode kernels, whose calls are too small to
    pay a sleeping thread's wake-up each time, run on their own pool (csrc/thread_pool.c).
    libgomp reads the policy once, when torch loads it, so this must run before `import torch`;
    returns whether it could still apply.
    """
    if "torch" in sys.modules or os.environ.get(_PEER_PROCESS) == "1":
        return False
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[_OWN_WAIT_POLICY] = "1"  # so peers started from here can get their own default back
    return True


_OWN_WAIT_POLICY = "AQUEDUCT_SET_OMP_WAIT_POLICY"
_PEER_PROCESS = "AQUEDUCT_PEER_PROCESS"


@contextlib.contextmanager
def peer_omp_defaults() -> Iterator[None]:
    """Child processes started inside the block (a benchmark's llama.cpp peer, which runs on libgomp
    too) see OMP_WAIT_POLICY as the user left it, not the PASSIVE that passive_omp_wait set for us;
    a spawned child re-imports the main module, so they are also marked for passive_omp_wait to
    leave alone. Measured: llama.cpp on SmolLM2 Q4_1, 2 threads, 80-99 tokens/s at its default
    policy, 13-15 passive."""
    ours = os.environ.get(_OWN_WAIT_POLICY) == "1" and os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
    if ours:
        del os.environ["OMP_WAIT_POLICY"]
    os.environ[_PEER_PROCESS] = "1"
    try:
        yield
    finally:
        del os.environ[_PEER_PROCESS]
        if ours:
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


@contextlib.contextmanager
def startup_collector_paused() -> Iterator[None]:
    """Imports and model loading without cyclic garbage collection, then everything they left
    alive (modules, model, tokenizer) frozen out of the collector's view.

    Those objects live as long as the process, yet every full (oldest-generation) collection
    rescans all of them, and torch + transformers make that a large heap: collections during
    start-up and the run took ~0.8 s of a 6.5 s batch run here. Reference counting still frees
    objects as usual; the collector is back on when the block ends, raised or not.
    """
    gc.disable()
    try:
        yield
        gc.freeze()
        log.debug("startup objects frozen", count=gc.get_freeze_count())
    finally:
        gc.enable()


# ---- compute threads -------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def set_compute_threads(requested: int | None = None) -> int:
    """Size torch's intra-op (OpenMP) pool to the CPUs this process may use, or to `requested`.

    torch starts one thread per core of the host. A parallel region ends only when its slowest
    thread does, so when the process may use fewer CPUs than that (a CPU quota, a narrower
    affinity, other busy processes) a thread that waits on a descheduled sibling wastes its turn:
    on a 2-core box a second busy process slowed a run ~8x. Threads for another thread's share
    of a box are set with --cpu-threads (e.g. 1 each for two workers on two cores).
    """
    import torch

    threads, chosen_by = choose_compute_threads(requested, len(os.sched_getaffinity(0)), cgroup_cpu_limit())
    torch.set_num_threads(threads)
    log.info("compute threads", threads=threads, chosen_by=chosen_by)
    return threads


def choose_compute_threads(requested: int | None, num_affinity_cpus: int, quota_cpus: float | None) -> tuple[int, str]:
    """(threads, what decided it). A fractional quota rounds down (1.5 CPUs -> 1 thread): a second
    thread that gets half a CPU makes the other wait for it at the end of every parallel region."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {requested}")
        return requested, "--cpu-threads"
    if quota_cpus is not None and quota_cpus < num_affinity_cpus:
        return max(1, int(quota_cpus)), f"cgroup CPU quota ({quota_cpus:g} CPUs)"
    return max(1, num_affinity_cpus), "CPU affinity"


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """CPUs allowed by the cgroup CPU quota (the smallest along the hierarchy), None when unlimited
    or unknown. cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD"); v1: cpu.cfs_quota_us (-1 =
    none) / cpu.cfs_period_us in the cpu controller's hierarchy."""
    own = _own_cgroups(self_cgroup)
    if (root / "cgroup.controllers").exists():
        limits = [_v2_limit(directory / "cpu.max") for directory in _cgroup_dirs(root, own.get("", "/"))]
    else:
        mount = next((root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (root / name).is_dir()), None)
        if mount is None:
            return None
        limits = [_v1_limit(directory) for directory in _cgroup_dirs(mount, own.get("cpu", "/"))]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _own_cgroups(self_cgroup: Path) -> dict[str, str]:
    """/proc/self/cgroup lines "ID:CONTROLLERS:PATH" -> {"": v2 path, "cpu": v1 cpu path}."""
    paths: dict[str, str] = {}
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths[""] = path
        elif "cpu" in controllers.split(","):
            paths["cpu"] = path
    return paths


def _cgroup_dirs(mount: Path, path: str) -> list[Path]:
    """The process's cgroup directory and its ancestors up to the mount; only the mount when the
    path is not visible from here (a container sees its own cgroup as the root)."""
    directory = mount / path.lstrip("/")
    if not directory.is_dir():
        return [mount]
    dirs = [directory]
    while directory != mount:
        directory = directory.parent
        dirs.append(directory)
    return dirs


def _v2_limit(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
