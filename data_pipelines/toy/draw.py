"""Tiny numpy drawing kit for the toy world: backgrounds, discs, squares, triangles, ellipses."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# Canonical colours, in the canonical option order used by every colour question.
COLOR_NAMES: tuple[str, ...] = ("red", "green", "blue", "yellow")
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (40, 90, 240),
    "yellow": (240, 220, 40),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")


@lru_cache(maxsize=8)
def grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates ``(yy, xx)`` of an ``h x w`` image."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    return yy + 0.5, xx + 0.5


def background(h: int, w: int, rng: np.random.Generator, *, level: int = 50, noise: float = 4.0,
               rgb: bool = True) -> np.ndarray:
    """A flat grey image with static noise, uint8 ``(h, w, 3)`` (or ``(h, w)`` when ``rgb`` is False)."""
    img = np.full((h, w), float(level), np.float32)
    if noise > 0:
        img += rng.normal(0.0, noise, size=(h, w)).astype(np.float32)
    img = np.clip(img, 0, 255).astype(np.uint8)
    return np.repeat(img[..., None], 3, axis=2) if rgb else img


def smooth_noise(h: int, w: int, rng: np.random.Generator, *, cell: int = 8, amp: float = 20.0) -> np.ndarray:
    """Low-frequency texture (float32, zero mean): coarse noise upsampled with bilinear interpolation."""
    gh, gw = h // cell + 2, w // cell + 2
    coarse = rng.normal(0.0, amp, size=(gh, gw)).astype(np.float32)
    yy, xx = grid(h, w)
    fy, fx = yy / cell, xx / cell
    y0, x0 = np.floor(fy).astype(int), np.floor(fx).astype(int)
    ty, tx = fy - y0, fx - x0
    top = coarse[y0, x0] * (1 - tx) + coarse[y0, x0 + 1] * tx
    bot = coarse[y0 + 1, x0] * (1 - tx) + coarse[y0 + 1, x0 + 1] * tx
    return top * (1 - ty) + bot * ty


def disk(h: int, w: int, cx: float, cy: float, r: float) -> np.ndarray:
    yy, xx = grid(h, w)
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def square(h: int, w: int, cx: float, cy: float, half: float) -> np.ndarray:
    yy, xx = grid(h, w)
    return (np.abs(xx - cx) <= half) & (np.abs(yy - cy) <= half)


def triangle(h: int, w: int, cx: float, cy: float, r: float) -> np.ndarray:
    """Upward-pointing triangle inscribed in a circle of radius ``r`` (slightly enlarged to read well)."""
    yy, xx = grid(h, w)
    r = r * 1.15
    pts = [(cx, cy - r), (cx - r * 0.866, cy + r * 0.5), (cx + r * 0.866, cy + r * 0.5)]
    pos = np.ones((h, w), bool)
    neg = np.ones((h, w), bool)
    for (x1, y1), (x2, y2) in zip(pts, pts[1:] + pts[:1]):
        side = (x2 - x1) * (yy - y1) - (y2 - y1) * (xx - x1)
        pos &= side >= 0
        neg &= side <= 0
    return pos | neg  # inside: on the same side of all three edges, whatever the winding


def shape_mask(name: str, h: int, w: int, cx: float, cy: float, r: float) -> np.ndarray:
    if name == "circle":
        return disk(h, w, cx, cy, r)
    if name == "square":
        return square(h, w, cx, cy, r * 0.9)
    if name == "triangle":
        return triangle(h, w, cx, cy, r)
    raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")


def ellipse(h: int, w: int, cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
    yy, xx = grid(h, w)
    return ((xx - cx) / ax) ** 2 + ((yy - cy) / ay) ** 2 <= 1.0


def paint(frame: np.ndarray, mask: np.ndarray, color: tuple[int, int, int] | int) -> np.ndarray:
    frame[mask] = color
    return frame


def lerp(a: float, b: float, t: float) -> float:
    return a + (b - a) * t
