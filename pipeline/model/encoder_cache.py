"""The vision encoder's outputs for a step: each image encoded once, sliced for the chunks that cover it.

Chunked prefill may split an image's placeholders over several steps (and a prefix-cache hit may
start inside them): the image is encoded on the first step that needs it and kept, keyed by its
content hash, in a small LRU cache for the steps that follow, so it is not encoded again per
chunk. An evicted entry is simply encoded again (the encoder is deterministic), so the cache's size
only trades memory for repeated work. Repeated images (the same picture in many requests) hit too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

from pipeline.model.models.llava import ImageEmbeddings
from pipeline.request.image_input import ImageInput
from pipeline.step.inputs import ImageSlice

DEFAULT_CACHED_IMAGES = 16


class EncoderCache:
    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
                 max_images: int = DEFAULT_CACHED_IMAGES) -> None:
        self.encode = encode  # [N, C, H, W] -> [N, num_image_tokens, hidden]
        self.device = device
        self.max_images = max_images
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.num_encoded = 0  # images run through the encoder (a measure of the cache's hits)

    def embeddings(self, slices: list[ImageSlice]) -> ImageEmbeddings:
        """Flat token rows and their embeddings for this step's image slices."""
        needed = self._lookup([piece.image for piece in slices])
        token_indices = np.concatenate([np.arange(piece.count) + piece.token_index for piece in slices])
        values = torch.cat([needed[piece.image.content_hash][piece.first:piece.first + piece.count]
                            for piece in slices])
        return ImageEmbeddings(torch.from_numpy(token_indices).to(self.device), values)

    def _lookup(self, images: list[ImageInput]) -> dict[str, torch.Tensor]:
        """Embeddings [num_image_tokens, hidden] of each image, encoding the missing ones in one batch."""
        found: dict[str, torch.Tensor] = {}
        missing: dict[str, ImageInput] = {}
        for image in images:
            key = image.content_hash
            if key in self._entries:
                self._entries.move_to_end(key)
                found[key] = self._entries[key]
            else:
                missing[key] = image
        for group in _same_shape_groups(list(missing.values())):
            pixels = torch.from_numpy(np.stack([image.pixel_values() for image in group])).to(self.device)
            for image, encoded in zip(group, self.encode(pixels), strict=True):
                found[image.content_hash] = self._remember(image.content_hash, encoded)
            self.num_encoded += len(group)
        return found

    def _remember(self, key: str, embeddings: torch.Tensor) -> torch.Tensor:
        self._entries[key] = embeddings
        while len(self._entries) > self.max_images:
            self._entries.popitem(last=False)
        return embeddings


def _same_shape_groups(images: list[ImageInput]) -> list[list[ImageInput]]:
    groups: dict[tuple[int, int, int], list[ImageInput]] = {}
    for image in images:
        groups.setdefault(image.shape, []).append(image)
    return list(groups.values())
