"""Image tasks of the toy world: the colour of a still object (the image twin of the video ``color`` task).

``color_image``: an ``R x R`` RGB picture with one saturated circle, square or triangle on a dark, lightly
noisy background; "What colour is the object?" with the fixed options red, green, blue, yellow. Easy: a
big object on a plain background; medium: a smaller object, a noisier background and a grey distractor.
"""

from __future__ import annotations

import numpy as np

from .draw import COLOR_NAMES, COLORS, SHAPES, background, disk, paint, shape_mask
from .registry import ToyConfig, ToyItem, cycle, register_task


@register_task("color_image", kind="image", description="colour of the object in a picture; 4 options; easy/medium")
def color_image_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant = cycle(index, len(COLOR_NAMES), 2)
    size = r * (0.30 if variant == 0 else 0.22)
    image = background(r, r, rng, level=50, noise=4.0 if variant == 0 else 10.0)
    if variant == 1:
        gx, gy = rng.uniform(r * 0.15, r * 0.85, size=2)
        level = int(rng.integers(95, 130))
        paint(image, disk(r, r, float(gx), float(gy), r * 0.1), (level, level, level))
    cx, cy = rng.uniform(size + 1, r - size - 1, size=2)
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    paint(image, shape_mask(shape, r, r, float(cx), float(cy), size), COLORS[COLOR_NAMES[cls]])
    return ToyItem(question="What colour is the object?", problem_type="multiple_choice",
                   options=list(COLOR_NAMES), answer=COLOR_NAMES[cls], difficulty=("easy", "medium")[variant],
                   image=image, meta={"shape": shape})
