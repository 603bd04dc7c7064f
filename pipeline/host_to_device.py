"""Host arrays onto the device without a host sync.

`torch.from_numpy(a).to("cuda")` from pageable memory makes the host wait until the copy (and so
every kernel queued before it) is done: one sync per tensor. Staged in pinned memory, the copy
is queued on the stream and the host moves on; PyTorch's pinned-memory cache keeps the staging
buffer alive until the copy has run. On CPU the array is wrapped without a copy.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
