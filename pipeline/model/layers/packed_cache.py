"""The native quantized layers of a GGUF model, packed once and kept beside its conversion, so a later
start skips decoding and packing them (SmolLM2, a one-request `aqueduct batch` on a 2-core box: 2.1-2.2 s
instead of 2.4-2.7 s; the Q8_0 head's int8 requantization was most of the packing).

A GGUF file is converted once into a directory keyed by the file's hash and the dtype
(pipeline/loading/model_source.py); the packed layers follow from that file and from the native
layouts (csrc/int4_linear.c, csrc/int8_linear.c), so the cache's name carries LAYOUT_VERSION, to be
raised whenever a layout or the packing changes. It is read memory-mapped, so its pages are the
file's, shared by every worker on the host. Written by whichever process gets there first, as a
temporary file renamed into place; a cache that cannot be read, or whose entry does not match a
layer's shape, is passed over (and the layer packed as before).
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog
import torch

log = structlog.get_logger(__name__)

LAYOUT_VERSION = 1
Packed = dict[str, dict[str, torch.Tensor]]  # layer name -> its buffers (quantized_linear.py's packed_buffers())


def cache_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / f"packed-linears-v{LAYOUT_VERSION}.pt"


def load_packed(model_dir: str | Path) -> Packed:
    path = cache_path(model_dir)
    if not path.exists():
        return {}
    try:
        return torch.load(path, mmap=True, weights_only=True)
    except Exception as error:  # any unreadable cache (torn, foreign, another torch) is only a slower start
        log.warning("packed layer cache unreadable; packing again", path=str(path), error=str(error))
        return {}


def save_packed(model_dir: str | Path, packed: Packed) -> None:
    path = cache_path(model_dir)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(packed, temporary)
        os.replace(temporary, path)
    except OSError as error:  # a read-only cache directory: the next start packs again
        log.warning("packed layers not cached", path=str(path), error=str(error))
        temporary.unlink(missing_ok=True)
