"""The processes of one tensor-parallel group: the driver (rank 0, the runner in the GPU actor)
and world - 1 rank processes started with torch.multiprocessing (spawn), joined by torch.distributed:
gloo on the CPU, NCCL on CUDA (rank r on device base + r, base being the index --device names).

Each step the driver broadcasts the step's inputs as one packed int64 buffer (a fixed-size header,
then the payload: two broadcasts, however many arrays) and every rank runs the same forward; the
collectives inside the model (sharding.py) keep them in step. A header with STOP ends the ranks'
loop. Failure handling:
- a rank process that dies: the driver's watchdog sees its exit code and ends the driver's
  process with exit code 1 (a collective would otherwise wait on it forever); the worker's
  requests are then resumed elsewhere, as for any crash;
- the driver that dies: the ranks' next collective fails (the TCP peer is gone) and their
  watchdog sees the driver's pid go away; either way they exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import structlog
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.step.inputs import StepInputs

log = structlog.get_logger(__name__)

_STOP, _STEP = 0, 1
# Header: kind, num_tokens, max_query_len, max_seq_len, block table rows, cols, then the lengths
# of the 1-D arrays in _ARRAYS order.
_ARRAYS = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "logits_indices")
_INT32 = frozenset({"query_start_loc", "seq_lens"})
_HEADER = 6 + len(_ARRAYS)
_WATCH_SECONDS = 0.5
_CPU = torch.device("cpu")


def pack(inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(header, payload) int64 tensors holding every array of `inputs`.

    2 tokens, 1 sequence, 1 block -> header [1, 2, 2, 2, 1, 1, 2, 2, 2, 2, 1, 1],
    payload = input_ids ++ positions ++ slot_mapping ++ query_start_loc ++ seq_lens ++ logits_indices ++ block_tables
    """
    arrays = [np.asarray(getattr(inputs, name)).reshape(-1) for name in _ARRAYS]
    tables = np.asarray(inputs.block_tables)
    header = [_STEP, inputs.num_tokens, inputs.max_query_len, inputs.max_seq_len, *tables.shape,
              *(len(a) for a in arrays)]
    payload = np.concatenate([*(a.astype(np.int64) for a in arrays), tables.reshape(-1).astype(np.int64)])
    return torch.tensor(header, dtype=torch.int64), torch.from_numpy(payload)


def unpack(header: torch.Tensor, payload: torch.Tensor) -> StepInputs:
    values = header.tolist()
    rows, cols = values[4], values[5]
    data = payload.numpy()
    fields: dict[str, Any] = {}
    offset = 0
    for name, length in zip(_ARRAYS, values[6:], strict=True):
        fields[name] = data[offset: offset + length].astype(np.int32 if name in _INT32 else np.int64)
        offset += length
    tables = data[offset: offset + rows * cols].astype(np.int32).reshape(rows, cols)
    return StepInputs(block_tables=tables, num_tokens=values[1], max_query_len=values[2], max_seq_len=values[3],
                      **fields)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device of `rank` in a group whose driver runs on `device`: one CUDA device per rank
    (cuda:1 with 4 ranks -> cuda:1..cuda:4); every CPU rank on the CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def _init(rank: int, world: int, port: int, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds each rank's communicator to its current device
    dist.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(minutes=10))


def check_world(world: int, device: torch.device) -> None:
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise ValueError("tensor_parallel_size > 1 on CUDA needs NCCL, and this torch build has none")
        first, count = device.index or 0, torch.cuda.device_count()
        if first + world > count:
            raise ValueError(f"tensor_parallel_size {world} from cuda:{first} needs {first + world} CUDA devices; "
                             f"this machine has {count}")
        return
    if device.type != "cpu":
        raise ValueError(f"tensor_parallel_size > 1 runs on the CPU (gloo) or CUDA (NCCL), not on {device.type}")
    cores = os.cpu_count() or 1
    if world > cores:
        raise ValueError(f"tensor_parallel_size {world} exceeds the {cores} CPU cores of this machine")


def smallest_across_ranks(value: int, device: torch.device) -> int:
    """The minimum of `value` over the group; every rank must call it at the same point.
    Each rank sizes its own KV cache (CUDA: by profiling its own device), yet the driver's block
    ids must fit every rank's cache."""
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


class DriverGroup:
    """Rank 0's side: starts the rank processes, broadcasts step inputs, watches the ranks."""

    def __init__(self, world: int, rank_main: Callable[..., None], args: tuple[Any, ...],
                 device: torch.device = _CPU) -> None:
        """device: the driver's (rank 0's); rank r runs on rank_device(device, r)."""
        self.world, self.device = world, device
        self._closing = False
        port = _free_port()
        threads = max(1, torch.get_num_threads() // world)
        context = mp.get_context("spawn")
        self.processes = [context.Process(target=_rank_entry, args=(rank_main, rank, world, port, threads,
                                                                     os.getpid(), rank_device(device, rank), args),
                                          daemon=True, name=f"tp-rank-{rank}")
                          for rank in range(1, world)]
        for process in self.processes:
            process.start()
        torch.set_num_threads(threads)
        # Watch before joining: a rank that dies while starting would leave init_process_group waiting
        # for it until its timeout (10 minutes).
        threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()
        _init(0, world, port, device)
        atexit.register(self.close)
        log.info("tensor-parallel group up", world=world, backend=backend_for(device), threads_per_rank=threads)

    def broadcast(self, inputs: StepInputs) -> None:
        header, payload = pack(inputs)
        dist.broadcast(header.to(self.device), 0)  # NCCL moves device tensors only; on the CPU a no-op
        dist.broadcast(payload.to(self.device), 0)

    def close(self) -> None:
        """Stop the ranks (they leave their loop) and wait for them."""
        if self._closing:
            return
        self._closing = True
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)  # kind STOP
        try:
            dist.broadcast(header, 0)
        except RuntimeError as error:
            log.warning("could not signal the tensor-parallel ranks to stop", error=str(error))
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        dist.destroy_process_group()

    @contextlib.contextmanager
    def collectives(self) -> Iterator[None]:
        """Around a step's collectives: when one fails because a rank died (its peer socket reset before
        the watchdog's next look), end the driver with exit code 1 as the watchdog would. Raised out of
        the step instead, the error would end the process through interpreter shutdown, where gloo's
        still-joinable threads abort it (SIGABRT, seen)."""
        try:
            yield
        except RuntimeError:
            deadline = time.monotonic() + 4 * _WATCH_SECONDS
            while time.monotonic() < deadline:
                self._exit_if_a_rank_died()
                time.sleep(_WATCH_SECONDS / 10)
            raise

    def _watch(self) -> None:
        while not self._closing:
            self._exit_if_a_rank_died()
            time.sleep(_WATCH_SECONDS)

    def _exit_if_a_rank_died(self) -> None:
        for process in self.processes:
            if process.exitcode is not None and not self._closing:
                log.error("a tensor-parallel rank died; ending the worker", rank=process.name,
                          exitcode=process.exitcode)
                os._exit(1)


def _watch_driver(driver_pid: int) -> None:
    """End this rank when the driver's process is gone (its parent pid changes)."""
    while True:
        if os.getppid() != driver_pid:
            os._exit(0)
        time.sleep(_WATCH_SECONDS)


def _rank_entry(rank_main: Callable[..., None], rank: int, world: int, port: int, threads: int,
                driver_pid: int, device: torch.device, args: tuple[Any, ...]) -> None:
    threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True).start()
    torch.set_num_threads(threads)
    _init(rank, world, port, device)
    try:
        rank_main(rank, world, *args)
    except RuntimeError as error:  # the driver went away mid-collective
        log.warning("tensor-parallel rank stopping", rank=rank, error=str(error)[:200])
        os._exit(0)
    dist.destroy_process_group()


def receive_steps(execute: Callable[[StepInputs], object], device: torch.device = _CPU) -> None:
    """A rank's loop: receive each step's inputs from the driver and run them, until STOP.
    device: this rank's (NCCL receives into device tensors; the inputs are unpacked on the host)."""
    received = torch.empty(_HEADER, dtype=torch.int64, device=device)
    while True:
        dist.broadcast(received, 0)
        header = received.cpu()
        if int(header[0]) == _STOP:
            return
        payload = torch.empty(int(header[6:].sum() + header[4] * header[5]), dtype=torch.int64, device=device)
        dist.broadcast(payload, 0)
        execute(unpack(header, payload.cpu()))
