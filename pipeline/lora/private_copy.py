"""The worker's own copy of each validated adapter: the only adapter file ever read after the load.

The user's files are read once (adapter.py); what was validated is written here as its float32
weights in one safetensors file named by the SHA-256 of its bytes. An adapter evicted from host
memory is read back from this copy, and the hash is checked first, so a copy that was removed or
changed since is a LoRAError (its requests fail), never other weights. Copies are content-addressed,
so workers of one machine sharing a cache dir share identical copies, and a reload rewrites one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from pipeline.lora.adapter import LoRAAdapter, LoRAError

SUFFIX = ".safetensors"


@dataclass(frozen=True, slots=True)
class PrivateCopy:
    """What rebuilds one adapter: its copy's path and hash, and the rank and scale the load found."""

    name: str
    path: Path
    sha256: str
    rank: int
    scale: float


def write_private_copy(adapter: LoRAAdapter, directory: Path) -> PrivateCopy:
    """Write `adapter` under `directory` (atomically: readers never see half a copy)."""
    tensors = {f"{layer}.{module}.{half}": tensor.contiguous()
               for (layer, module), pair in adapter.weights.items() for half, tensor in zip("ab", pair, strict=True)}
    data = save_safetensors(tensors)
    digest = hashlib.sha256(data).hexdigest()
    target = directory / f"{digest}{SUFFIX}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomically(data, target)
    except OSError as error:
        raise LoRAError(f"lora adapter {adapter.name!r}: cannot write its private copy in {directory}: "
                        f"{error}") from error
    return PrivateCopy(adapter.name, target, digest, adapter.rank, adapter.scale)


def read_private_copy(copy: PrivateCopy) -> LoRAAdapter:
    """The adapter as validated at load; LoRAError when its copy is gone, unreadable or changed."""
    try:
        data = copy.path.read_bytes()
    except OSError as error:
        raise LoRAError(f"lora adapter {copy.name!r}: its private copy cannot be read: {error}") from error
    if hashlib.sha256(data).hexdigest() != copy.sha256:
        raise LoRAError(f"lora adapter {copy.name!r}: its private copy {copy.path} changed since the load "
                        "(SHA-256 mismatch)")
    try:
        tensors = load_safetensors(data)
        weights = _pairs(tensors)
    except Exception as error:  # the hash matched, so only our own writer could be at fault: still no crash
        raise LoRAError(f"lora adapter {copy.name!r}: its private copy cannot be parsed: {error}") from error
    return LoRAAdapter(name=copy.name, rank=copy.rank, scale=copy.scale, weights=weights)


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    # "3.q_proj.a" -> (3, "q_proj"): (a, b)
    keys = {(int(layer), module) for layer, module, _ in (key.split(".") for key in tensors)}
    return {(layer, module): (tensors[f"{layer}.{module}.a"], tensors[f"{layer}.{module}.b"])
            for layer, module in keys}


def _write_atomically(data: bytes, target: Path) -> None:
    handle, staging = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
