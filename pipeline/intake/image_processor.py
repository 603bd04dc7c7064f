"""Encoded image bytes -> pixel values for a CLIP vision tower, as HF's CLIPImageProcessor (PIL backend).

The steps and their number formats follow transformers' PIL backend so the pixels are the same:
decode with Pillow; convert to RGB (transparency composited onto white); resize so the shortest edge
is `size.shortest_edge` with Pillow's filter (bicubic for CLIP) on uint8; center-crop to `crop_size`
(zero-padded when the image is smaller); rescale (float64 * factor, then float32); normalize
((x - mean) / std in float32). Settings come from the model directory's preprocessor_config.json.

Worked example, a 60 x 40 (w x h) image, shortest_edge 32, crop 32 x 32: resized to 48 x 32
(int(32 * 60 / 40) = 48), then columns 8..39 kept ((48 - 32) // 2 = 8).
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MAX_IMAGE_BYTES = 20 * 2**20
DEFAULT_MAX_IMAGE_PIXELS = 6000 * 6000


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES  # encoded size
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width * height, checked before decoding the pixels

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1:
            raise ValueError(f"image limits must be >= 1, got max_bytes {self.max_bytes}, max_pixels {self.max_pixels}")


@dataclass(frozen=True, slots=True)
class ImageProcessor:
    shortest_edge: int | None  # resize target of the shorter side (None: resize to height x width)
    resize_height: int
    resize_width: int
    crop_height: int
    crop_width: int
    resample: int  # PIL filter number (3 = bicubic)
    do_resize: bool
    do_center_crop: bool
    rescale_factor: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    limits: ImageLimits = ImageLimits()

    @classmethod
    def from_config(cls, config: dict[str, Any], limits: ImageLimits = ImageLimits()) -> ImageProcessor:
        size, crop = _size(config.get("size", {"shortest_edge": 224})), _size(config.get("crop_size", 224))
        return cls(shortest_edge=size.get("shortest_edge"), resize_height=size.get("height", 0),
                   resize_width=size.get("width", 0), crop_height=crop.get("height", 0),
                   crop_width=crop.get("width", 0), resample=int(config.get("resample", 3)),
                   do_resize=config.get("do_resize", True), do_center_crop=config.get("do_center_crop", True),
                   rescale_factor=config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else None,
                   mean=tuple(config.get("image_mean", OPENAI_CLIP_MEAN)) if config.get("do_normalize", True) else None,
                   std=tuple(config.get("image_std", OPENAI_CLIP_STD)) if config.get("do_normalize", True) else None,
                   limits=limits)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, limits: ImageLimits = ImageLimits()) -> ImageProcessor:
        path = Path(model_dir) / "preprocessor_config.json"
        if not path.exists():
            raise FileNotFoundError(f"a vision model needs {path.name} (its image preprocessing) in {model_dir}")
        with path.open() as f:
            return cls.from_config(json.load(f), limits)

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixel values, when resizing and cropping give a fixed size."""
        if self.do_center_crop:
            return self.crop_height, self.crop_width
        return self.resize_height, self.resize_width

    def __call__(self, data: bytes, field: str = "image") -> np.ndarray:
        """Encoded PNG/JPEG/... bytes -> float32 pixel values [3, H, W]; ValueError naming `field`."""
        image = self.decode(data, field)
        pixels = np.array(image, dtype=np.uint8)  # [H, W, 3]
        if self.do_resize:
            pixels = self._resize(image)
        pixels = np.moveaxis(pixels, -1, 0)  # [3, H, W]
        if self.do_center_crop:
            pixels = center_crop(pixels, self.crop_height, self.crop_width)
        values = pixels.astype(np.float32)
        if self.rescale_factor is not None:
            values = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.mean is not None and self.std is not None:
            mean, std = np.array(self.mean, np.float32), np.array(self.std, np.float32)
            values = ((values.T - mean) / std).T
        return np.ascontiguousarray(values, dtype=np.float32)

    def decode(self, data: bytes, field: str = "image") -> Any:
        """Bytes -> an RGB PIL image, within the limits; ValueError naming `field` otherwise."""
        from PIL import Image, UnidentifiedImageError

        if len(data) > self.limits.max_bytes:
            raise ValueError(f"{field} is {len(data)} bytes; the limit is {self.limits.max_bytes} (--max-image-bytes)")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data))
                width, height = image.size
                if width * height > self.limits.max_pixels:
                    raise ValueError(f"{field} is {width}x{height} pixels; the limit is {self.limits.max_pixels} "
                                     "pixels (--max-image-pixels)")
                image.load()
        except UnidentifiedImageError:
            raise ValueError(f"{field} is not a decodable image (PNG, JPEG, ...): its format is not recognised") \
                from None
        except (OSError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise ValueError(f"{field} is not a decodable image (PNG, JPEG, ...): {error}") from None
        return _to_rgb(image)

    def _resize(self, image: Any) -> np.ndarray:
        width, height = image.size
        if self.shortest_edge is not None:
            new_height, new_width = shortest_edge_size(height, width, self.shortest_edge)
        else:
            new_height, new_width = self.resize_height, self.resize_width
        return np.array(image.resize((new_width, new_height), resample=self.resample), dtype=np.uint8)


def _size(value: Any) -> dict[str, int]:
    """HF's size forms: an int (a square), or a dict with shortest_edge or height/width."""
    if isinstance(value, int):
        return {"height": value, "width": value}
    return {key: int(v) for key, v in value.items() if v is not None}


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def shortest_edge_size(height: int, width: int, shortest_edge: int) -> tuple[int, int]:
    """(height, width) with the shorter side = shortest_edge, the other scaled and truncated, as HF."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest_edge * long / short)
    return (new_long, shortest_edge) if width <= height else (shortest_edge, new_long)


def center_crop(pixels: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """[C, H, W] -> [C, crop_height, crop_width] around the center, zero-padded where the image is smaller."""
    _, height, width = pixels.shape
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top:top + crop_height, left:left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((pixels.shape[0], new_height, new_width), pixels.dtype)
    pad_top, pad_left = -(-(new_height - height) // 2), -(-(new_width - width) // 2)  # ceil, as HF
    padded[:, pad_top:pad_top + height, pad_left:pad_left + width] = pixels
    top, left = top + pad_top, left + pad_left
    return padded[:, max(0, top):min(new_height, top + crop_height), max(0, left):min(new_width, left + crop_width)]
