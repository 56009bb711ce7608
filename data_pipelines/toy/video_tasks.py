"""Video tasks of the toy world: colour, shape, count, motion, order, needle, grounding.

All videos are ``R x R`` (``ToyConfig.resolution``, default 64) with a dark grey, lightly noisy
background. Short tasks are 2 s at 8 fps (16 frames); ``grounding`` is 8 s at 4 fps (32 frames);
``needle`` is 24 s at 4 fps (96 frames). Objects are large and saturated (colour/shape: radius 30 % of the
frame side when easy, 24 % when medium; flashes and needles: squares 60 % of the side), so the visual
signal is strong even for a tiny model. Multiple-choice options come in a fixed canonical order per task;
the answer letter follows the content.

Difficulty (``meta.difficulty``): colour/shape/motion easy = big object, plain background; medium =
smaller object, noisier background (plus a grey distractor for colour, shorter travel for motion).
count: 1-2 easy, 3 medium, 4 hard. order: medium = flashes 6-8 frames apart, hard = 4-5. needle: the
event lasts 2 s (easy), 1 s (medium), 0.5 s (hard). grounding: event 2-4 s (medium) or 1-1.5 s (hard).
"""

from __future__ import annotations

import numpy as np

from .draw import COLOR_NAMES, COLORS, SHAPES, background, disk, lerp, paint, shape_mask, square
from .registry import ToyConfig, ToyItem, cycle, register_task

SHORT_FPS, SHORT_FRAMES = 8.0, 16
SHORT_SAMPLING = {"nframes": 8}
DIRECTIONS = ("left", "right", "up", "down")
COUNTS = ("1", "2", "3", "4")


_BG_LEVEL = 50


def _bg(rng: np.random.Generator, r: int, noise: float = 4.0) -> np.ndarray:
    return background(r, r, rng, level=_BG_LEVEL, noise=noise)


def _video_meta(n: int, fps: float, r: int) -> dict[str, float | int]:
    return {"num_frames": n, "fps": fps, "duration": n / fps, "width": r, "height": r}


def _path(rng: np.random.Generator, r: int, size: float) -> tuple[float, float, float, float]:
    """Random start and end points that keep an object of radius ``size`` inside the frame."""
    lo, hi = size + 1, r - size - 1
    x0, y0, x1, y1 = rng.uniform(lo, hi, size=4)
    return float(x0), float(y0), float(x1), float(y1)


def _grey_distractor(frames: np.ndarray, rng: np.random.Generator, size: float) -> None:
    """A slowly moving grey disc, so frames are never static and colour alone carries the answer."""
    n, r = frames.shape[0], frames.shape[1]
    x0, y0, x1, y1 = _path(rng, r, size)
    level = int(rng.integers(95, 130))
    for i in range(n):
        t = i / max(1, n - 1)
        paint(frames[i], disk(r, r, lerp(x0, x1, t), lerp(y0, y1, t), size), (level, level, level))


def _move(frames: np.ndarray, shape: str, size: float, path: tuple[float, float, float, float], color) -> None:
    """Paint ``shape`` moving along ``path`` (x0, y0, x1, y1) over the frames."""
    r = frames.shape[1]
    x0, y0, x1, y1 = path
    for i in range(frames.shape[0]):
        t = i / (frames.shape[0] - 1)
        paint(frames[i], shape_mask(shape, r, r, lerp(x0, x1, t), lerp(y0, y1, t), size), color)


def _short_clip(rng: np.random.Generator, index: int, n_classes: int, r: int
                ) -> tuple[int, int, float, np.ndarray]:
    """Class, variant (0 easy, 1 medium), object size and background frames of a short clip."""
    cls, variant = cycle(index, n_classes, 2)
    size = r * (0.30 if variant == 0 else 0.24)
    bg = _bg(rng, r, noise=4.0 if variant == 0 else 10.0)
    return cls, variant, size, np.repeat(bg[None], SHORT_FRAMES, axis=0)


def _short_item(question: str, options: list[str], answer: str, variant: int, frames: np.ndarray,
                meta: dict) -> ToyItem:
    """A short-clip multiple-choice item (easy for variant 0, medium for 1)."""
    return ToyItem(question=question, problem_type="multiple_choice", options=options, answer=answer,
                   difficulty=("easy", "medium")[variant], frames=frames, fps=SHORT_FPS,
                   sampling=dict(SHORT_SAMPLING),
                   meta={**meta, "video": _video_meta(SHORT_FRAMES, SHORT_FPS, frames.shape[1])})


@register_task("color", kind="video", description="colour of the moving object; 4 options; easy/medium")
def color_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant, size, frames = _short_clip(rng, index, len(COLOR_NAMES), r)
    if variant == 1:
        _grey_distractor(frames, rng, r * 0.12)
    x0, y0, x1, y1 = _path(rng, r, size)
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    _move(frames, shape, size, (x0, y0, x1, y1), COLORS[COLOR_NAMES[cls]])
    return _short_item("What colour is the moving object?", list(COLOR_NAMES), COLOR_NAMES[cls], variant, frames,
                       {"shape": shape})


@register_task("shape", kind="video", description="shape of the moving object (circle/square/triangle)")
def shape_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant, size, frames = _short_clip(rng, index, len(SHAPES), r)
    color = COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))]
    x0, y0, x1, y1 = _path(rng, r, size * 1.2)
    _move(frames, SHAPES[cls], size, (x0, y0, x1, y1), COLORS[color])
    return _short_item("What shape is the moving object?", list(SHAPES), SHAPES[cls], variant, frames,
                       {"color": color})


@register_task("count", kind="video", description="how many discs (1-4); difficulty grows with the count")
def count_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, _ = cycle(index, len(COUNTS))
    n = cls + 1
    size = r * 0.13
    frames = np.repeat(_bg(rng, r)[None], SHORT_FRAMES, axis=0)
    color = COLORS[COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))]]
    cells = rng.permutation(4)[:n]  # one disc per quadrant, so discs never overlap
    half = r / 2
    for cell in cells:
        cx0 = (cell % 2) * half + half / 2 + rng.uniform(-0.08, 0.08) * r
        cy0 = (cell // 2) * half + half / 2 + rng.uniform(-0.08, 0.08) * r
        dx, dy = rng.uniform(-0.08, 0.08, size=2) * r
        for i in range(SHORT_FRAMES):
            t = i / (SHORT_FRAMES - 1) - 0.5
            paint(frames[i], disk(r, r, cx0 + dx * t, cy0 + dy * t, size), color)
    difficulty = "easy" if n <= 2 else "medium" if n == 3 else "hard"
    return ToyItem(question="How many coloured discs are in the video?", problem_type="multiple_choice",
                   options=list(COUNTS), answer=COUNTS[cls], difficulty=difficulty,
                   frames=frames, fps=SHORT_FPS, sampling=dict(SHORT_SAMPLING),
                   meta={"count": n, "video": _video_meta(SHORT_FRAMES, SHORT_FPS, r)})


@register_task("motion", kind="video", description="direction the object moves: left/right/up/down")
def motion_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant = cycle(index, len(DIRECTIONS), 2)
    size = r * (0.18 if variant == 0 else 0.12)
    travel = r * (0.6 if variant == 0 else 0.35)
    frames = np.repeat(_bg(rng, r)[None], SHORT_FRAMES, axis=0)
    color = COLORS[COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))]]
    cross = rng.uniform(size + 2, r - size - 2)  # the coordinate that stays fixed
    lo = rng.uniform(size + 1, r - size - 1 - travel)
    direction = DIRECTIONS[cls]

    def centre(frame: int) -> tuple[float, float]:
        t = max(frame, 0) / (SHORT_FRAMES - 1)
        along = lo + travel * (t if direction in ("right", "down") else 1 - t)
        return (along, cross) if direction in ("left", "right") else (cross, along)

    n = cfg.motion_trail
    for i in range(SHORT_FRAMES):
        for k in range(n, 0, -1):  # the trail, faintest (oldest) first
            level = 1.0 - k / (n + 1)
            faded = tuple(int(_BG_LEVEL + (c - _BG_LEVEL) * level) for c in color)
            paint(frames[i], square(r, r, *centre(i - 2 * k), size), faded)
        paint(frames[i], square(r, r, *centre(i), size), color)
    return ToyItem(question="In which direction does the square move?", problem_type="multiple_choice",
                   options=list(DIRECTIONS), answer=direction, difficulty=("easy", "medium")[variant],
                   frames=frames, fps=SHORT_FPS, sampling=dict(SHORT_SAMPLING),
                   meta={"video": _video_meta(SHORT_FRAMES, SHORT_FPS, r)})


def _frames_to_span(start: int, length: int, fps: float) -> list[float]:
    return [round(start / fps, 3), round((start + length) / fps, 3)]


@register_task("order", kind="video", description="which of two coloured flashes came first; 4 colour options")
def order_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant = cycle(index, len(COLOR_NAMES), 2)
    first = COLOR_NAMES[cls]
    second = COLOR_NAMES[int(rng.choice([i for i in range(len(COLOR_NAMES)) if i != cls]))]
    flash = 3
    gap = int(rng.integers(6, 9)) if variant == 0 else int(rng.integers(4, 6))  # start-to-start, frames
    s1 = int(rng.integers(1, SHORT_FRAMES - gap - flash + 1))
    s2 = s1 + gap
    frames = np.repeat(_bg(rng, r)[None], SHORT_FRAMES, axis=0)
    half = r * 0.3
    for start, name in ((s1, first), (s2, second)):
        cx, cy = rng.uniform(half + 1, r - half - 1, size=2)
        for i in range(start, start + flash):
            paint(frames[i], square(r, r, cx, cy, half), COLORS[name])
    meta = {"first": first, "second": second,
            "gold_frames": list(range(s1, s1 + flash)) + list(range(s2, s2 + flash)),
            "gold_spans": [_frames_to_span(s1, flash, SHORT_FPS), _frames_to_span(s2, flash, SHORT_FPS)],
            "video": _video_meta(SHORT_FRAMES, SHORT_FPS, r)}
    return ToyItem(question="Two coloured squares flash one after the other. What colour is the first flash?",
                   problem_type="multiple_choice", options=list(COLOR_NAMES), answer=first,
                   difficulty=("medium", "hard")[variant], frames=frames, fps=SHORT_FPS,
                   sampling=dict(SHORT_SAMPLING), meta=meta)


NEEDLE_FPS, NEEDLE_FRAMES = 4.0, 96  # 24 s
NEEDLE_LENGTHS = {"easy": 8, "medium": 4, "hard": 2}  # frames the event lasts (2 s, 1 s, 0.5 s)


@register_task("needle", kind="video",
               description="24 s video with one brief coloured square; what colour? (gold frames in meta)")
def needle_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant = cycle(index, len(COLOR_NAMES), 3)
    difficulty = ("easy", "medium", "hard")[variant]
    length = NEEDLE_LENGTHS[difficulty]
    frames = np.repeat(_bg(rng, r)[None], NEEDLE_FRAMES, axis=0)
    _grey_distractor(frames, rng, r * 0.15)
    start = int(rng.integers(4, NEEDLE_FRAMES - length - 4))
    half = r * 0.3
    cx, cy = rng.uniform(half + 1, r - half - 1, size=2)
    for i in range(start, start + length):
        paint(frames[i], square(r, r, cx, cy, half), COLORS[COLOR_NAMES[cls]])
    gold = list(range(start, start + length))
    meta = {"gold_frames": gold, "gold_timestamps": [round(i / NEEDLE_FPS, 3) for i in gold],
            "gold_span": _frames_to_span(start, length, NEEDLE_FPS),
            "video": _video_meta(NEEDLE_FRAMES, NEEDLE_FPS, r)}
    return ToyItem(question="At some point a coloured square appears briefly. What colour is it?",
                   problem_type="multiple_choice", options=list(COLOR_NAMES), answer=COLOR_NAMES[cls],
                   difficulty=difficulty, frames=frames, fps=NEEDLE_FPS, sampling={"nframes": cfg.needle_frames},
                   meta=meta)


GROUND_FPS, GROUND_FRAMES = 4.0, 32  # 8 s


@register_task("grounding", kind="video",
               description="[start, end] seconds during which a coloured disc is visible (temporal_grounding)")
def grounding_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    _, variant = cycle(index, 1, 2)
    length = int(rng.integers(8, 17)) if variant == 0 else int(rng.integers(4, 7))  # 2-4 s or 1-1.5 s
    start = int(rng.integers(1, GROUND_FRAMES - length))
    color = COLOR_NAMES[index // 2 % len(COLOR_NAMES)]
    frames = np.repeat(_bg(rng, r)[None], GROUND_FRAMES, axis=0)
    _grey_distractor(frames, rng, r * 0.12)
    size = r * 0.25
    cx, cy = rng.uniform(size + 1, r - size - 1, size=2)
    for i in range(start, start + length):
        paint(frames[i], disk(r, r, cx, cy, size), COLORS[color])
    span = _frames_to_span(start, length, GROUND_FPS)
    meta = {"color": color, "gold_span": span, "gold_frames": list(range(start, start + length)),
            "video": _video_meta(GROUND_FRAMES, GROUND_FPS, r)}
    return ToyItem(question=f"When is the {color} disc visible? Answer with its start and end time in seconds.",
                   problem_type="temporal_grounding", answer=span, difficulty=("medium", "hard")[variant],
                   frames=frames, fps=GROUND_FPS, sampling={"nframes": 16}, meta=meta)
