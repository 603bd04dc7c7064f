"""A request's images: where each sits in the prompt, its pixels, and the hash that keys it in caches.

Intake expands each `<image>` token of the prompt into the model's image token count (576 for
llava-1.5: 24 x 24 patches). With 3 image tokens per image and image token 9:

    prompt ids   [5, 9, 7, 9]        two placeholders
    expanded     [5, 9, 9, 9, 7, 9, 9, 9]
    images       offset 1, length 3; offset 5, length 3

The runner replaces the embeddings of positions offset..offset + length - 1 with the image's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ImageInput:
    content_hash: str  # sha256 of the pixel values: equal pictures share encoder output and KV blocks
    offset: int  # prompt position of the first placeholder token
    length: int  # placeholder tokens
    pixels: bytes  # float32 [channels, height, width], C order (plain bytes: this may cross Redis)
    shape: tuple[int, int, int]

    @property
    def end(self) -> int:
        return self.offset + self.length

    def pixel_values(self) -> np.ndarray:
        return np.frombuffer(self.pixels, dtype=np.float32).reshape(self.shape)


@dataclass(frozen=True, slots=True)
class VisionInfo:
    """What intake needs to know of a vision-language model."""

    image_token_id: int
    num_image_tokens: int  # placeholder tokens per image
    image_size: tuple[int, int]  # (height, width) the vision tower takes


def image_input(pixels: np.ndarray, offset: int, length: int) -> ImageInput:
    data = np.ascontiguousarray(pixels, dtype=np.float32).tobytes()
    shape = tuple(int(n) for n in pixels.shape)
    if len(shape) != 3:
        raise ValueError(f"pixel values must be [channels, height, width], got shape {shape}")
    return ImageInput(hashlib.sha256(data).hexdigest(), offset, length, data, shape)  # type: ignore[arg-type]


def expand_placeholders(token_ids: Sequence[int], pixel_values: Sequence[np.ndarray],
                        info: VisionInfo) -> tuple[list[int], list[ImageInput]]:
    """Each image token of token_ids becomes info.num_image_tokens of them, one image each in order;
    ValueError when the counts differ."""
    check_image_count(token_ids, len(pixel_values), info)
    positions = [index for index, token in enumerate(token_ids) if token == info.image_token_id]
    expanded: list[int] = []
    images: list[ImageInput] = []
    start = 0
    for position, pixels in zip(positions, pixel_values, strict=True):
        expanded.extend(token_ids[start:position])
        images.append(image_input(pixels, len(expanded), info.num_image_tokens))
        expanded.extend([info.image_token_id] * info.num_image_tokens)
        start = position + 1
    expanded.extend(token_ids[start:])
    return expanded, images


def check_image_count(token_ids: Sequence[int], num_images: int, info: VisionInfo) -> None:
    """ValueError unless the prompt has one placeholder per image."""
    num_placeholders = sum(1 for token in token_ids if token == info.image_token_id)
    if num_placeholders != num_images:
        raise ValueError(f"images: the prompt has {num_placeholders} <image> placeholder(s) but "
                         f"{num_images} image(s) were sent; send one image per placeholder")


def overlapping(images: Sequence[ImageInput], start: int, end: int) -> list[ImageInput]:
    """The images with placeholder tokens in positions [start, end)."""
    return [image for image in images if image.offset < end and image.end > start]
