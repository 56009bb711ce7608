"""What the benchmarks share: the model family they build and a toy video (a moving square on a gradient)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FAMILY = "qwen2_5_vl"
FRAMES, SIDE = 16, 112


def toy_video(path: Path, seed: int, side: int = SIDE) -> Path:
    """Write a toy mp4 to ``path``: ``FRAMES`` frames of ``side`` x ``side`` pixels at 8 fps, a horizontal
    gradient over a ``seed``-coloured background with a square moving across it."""
    from video.writer import write_mp4

    rng = np.random.default_rng(seed)
    bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    _, xx = np.mgrid[0:side, 0:side]
    frames = np.empty((FRAMES, side, side, 3), np.uint8)
    for i in range(FRAMES):
        img = (bg[None, None, :] * 0.6 + xx[..., None] * 0.4 * 255 / side).astype(np.uint8)
        x, y = (6 * i + 13 * seed) % (side - 24), (4 * i + 5 * seed) % (side - 24)
        img[y:y + 24, x:x + 24] = fg
        frames[i] = img
    return write_mp4(path, frames, 8.0)
