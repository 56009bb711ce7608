"""Pixel budgets the way the Qwen-VL processors apply them (``qwen_vl_utils.smart_resize``)."""

from __future__ import annotations

from PIL import Image
from qwen_vl_utils import smart_resize


def fitted_size(
    height: int, width: int, min_pixels: int | None = None, max_pixels: int | None = None, factor: int = 28
) -> tuple[int, int]:
    """(H, W) after ``qwen_vl_utils.smart_resize``: multiples of ``factor`` (28 for Qwen2/2.5-VL, 32
    for Qwen3-VL), area within ``[min_pixels, max_pixels]`` (defaults 4·f² and 16384·f²), aspect kept."""
    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def fit_pixels(
    image: Image.Image,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = 28,
    resample: Image.Resampling = Image.Resampling.BICUBIC,
) -> Image.Image:
    """Resize ``image`` to :func:`fitted_size` (bicubic, as ``fetch_image`` does). No-op if already there."""
    h, w = fitted_size(image.height, image.width, min_pixels, max_pixels, factor)
    if (h, w) == (image.height, image.width):
        return image
    return image.resize((w, h), resample=resample)
