"""Images: open any mode as RGB, fit Qwen-VL pixel budgets, crop and zoom into normalised boxes."""

from .crop import Box, box_to_pixels, crop, validate_box, zoom
from .io import open_image, to_rgb, window_to_uint8
from .resize import fit_pixels, fitted_size

__all__ = [
    "Box",
    "box_to_pixels",
    "crop",
    "fit_pixels",
    "fitted_size",
    "open_image",
    "to_rgb",
    "validate_box",
    "window_to_uint8",
    "zoom",
]
