"""Crops and zoom-ins from normalised boxes ``[x0, y0, x1, y1]`` in [0, 1] (x to the right, y down)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from PIL import Image

from .resize import fitted_size

Box = tuple[float, float, float, float]
_EPS = 1e-6


def validate_box(box: Sequence[float]) -> Box:
    """Check a normalised box and return it as a float tuple; ValueError explains what is wrong.

    Values within 1e-6 outside [0, 1] are clipped (rounding noise)."""
    try:
        values = [float(v) for v in box]
    except (TypeError, ValueError):
        raise ValueError(f"box must be 4 numbers [x0, y0, x1, y1], got {box!r}") from None
    if len(values) != 4:
        raise ValueError(f"box must have 4 numbers [x0, y0, x1, y1], got {len(values)}: {box!r}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"box has a non-finite value: {box!r}")
    if any(v < -_EPS or v > 1 + _EPS for v in values):
        raise ValueError(f"box values must be normalised to [0, 1], got {box!r}")
    x0, y0, x1, y1 = (min(max(v, 0.0), 1.0) for v in values)
    if not (x1 > x0 and y1 > y0):
        raise ValueError(f"box must have x0 < x1 and y0 < y1, got {box!r}")
    return x0, y0, x1, y1


def box_to_pixels(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """Pixel box (left, top, right, bottom), outward-rounded so it covers the normalised box; ≥ 1 px."""
    x0, y0, x1, y1 = validate_box(box)
    left = min(math.floor(x0 * width + _EPS), width - 1)
    top = min(math.floor(y0 * height + _EPS), height - 1)
    right = max(math.ceil(x1 * width - _EPS), left + 1)
    bottom = max(math.ceil(y1 * height - _EPS), top + 1)
    return left, top, right, bottom


def crop(image: Image.Image, box: Sequence[float]) -> Image.Image:
    """The region of ``image`` under the normalised ``box``."""
    return image.crop(box_to_pixels(box, image.width, image.height))


def zoom(
    image: Image.Image,
    box: Sequence[float],
    max_pixels: int = 1024 * 28 * 28,
    min_pixels: int | None = None,
    factor: int = 28,
) -> Image.Image:
    """Crop ``box`` and rescale it (up or down) to fill about ``max_pixels``, aspect kept, sides
    multiples of ``factor`` (sizes from ``qwen_vl_utils.smart_resize``)."""
    region = crop(image, box)
    scale = math.sqrt(max_pixels / (region.width * region.height))
    target_h, target_w = max(1, round(region.height * scale)), max(1, round(region.width * scale))
    min_px = min_pixels if min_pixels is not None else min(4 * factor * factor, max_pixels)
    h, w = fitted_size(target_h, target_w, min_px, max_pixels, factor)
    if (h, w) == (region.height, region.width):
        return region
    return region.resize((w, h), resample=Image.Resampling.BICUBIC)


__all__ = ["Box", "box_to_pixels", "crop", "validate_box", "zoom"]
