"""The toy world's ``evidence`` task: the answer is visible only in a short span of a long video.

A 32 s video at 4 fps (128 frames) with a slowly moving grey disc. A grey square (the cue, half the frame
side) sits in one place for 5 s; in the middle of that time it lights up in a colour for 1 s (``hard``,
4 frames) or 1.5 s (``medium``, 6 frames). "What colour does the grey square light up?" (red, green, blue,
yellow). The record asks for 8 uniformly sampled frames (stride about 4.5 s): the cue is always on at
least one of them, the coloured moment on one only 22-33 % of the time, so a model that sees 8 frames must
guess unless it looks closer around the cue (EARL's ``select_frames``), or sees many more frames.

``meta``: ``gold_span`` (seconds, the coloured moment), ``gold_frames`` / ``gold_timestamps`` (its frame
numbers in the source video and their times, the toy world's convention), ``cue_span`` (seconds) and
``video`` (fps, frames, duration).
"""

from __future__ import annotations

import numpy as np

from .draw import COLOR_NAMES, COLORS, background, disk, lerp, paint, square
from .registry import ToyConfig, ToyItem, cycle, register_task

EVIDENCE_FPS, EVIDENCE_FRAMES = 4.0, 128  # 32 s
CUE_FRAMES = 20  # 5 s: longer than the 8-frame stride, so one initial frame always shows the cue
EVENT_FRAMES = {"medium": 6, "hard": 4}
INITIAL_FRAMES = 8
GREY = (128, 128, 128)


@register_task("evidence", kind="video",
               description="32 s video; a grey square lights up in a colour for 1-1.5 s; what colour? "
                           "(gold span in meta; 8 initial frames usually miss it)")
def evidence_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    cls, variant = cycle(index, len(COLOR_NAMES), 2)
    difficulty = ("medium", "hard")[variant]
    length = EVENT_FRAMES[difficulty]
    frames = np.repeat(background(r, r, rng, level=50, noise=4.0)[None], EVIDENCE_FRAMES, axis=0)
    gx0, gy0, gx1, gy1 = rng.uniform(r * 0.15, r * 0.85, size=4)
    level = int(rng.integers(95, 120))
    for i in range(EVIDENCE_FRAMES):  # a moving grey disc: frames are never static
        t = i / (EVIDENCE_FRAMES - 1)
        paint(frames[i], disk(r, r, lerp(gx0, gx1, t), lerp(gy0, gy1, t), r * 0.1), (level, level, level))
    cue = int(rng.integers(2, EVIDENCE_FRAMES - CUE_FRAMES - 2))
    start = cue + (CUE_FRAMES - length) // 2 + int(rng.integers(-1, 2))
    half = r * 0.25
    cx, cy = rng.uniform(half + 1, r - half - 1, size=2)
    for i in range(cue, cue + CUE_FRAMES):
        colour = COLORS[COLOR_NAMES[cls]] if start <= i < start + length else GREY
        paint(frames[i], square(r, r, cx, cy, half), colour)
    gold = list(range(start, start + length))
    meta = {"gold_span": [round(start / EVIDENCE_FPS, 3), round((start + length) / EVIDENCE_FPS, 3)],
            "gold_frames": gold, "gold_timestamps": [round(i / EVIDENCE_FPS, 3) for i in gold],
            "cue_span": [round(cue / EVIDENCE_FPS, 3), round((cue + CUE_FRAMES) / EVIDENCE_FPS, 3)],
            "video": {"num_frames": EVIDENCE_FRAMES, "fps": EVIDENCE_FPS, "duration": EVIDENCE_FRAMES / EVIDENCE_FPS,
                      "width": r, "height": r}}
    return ToyItem(question="A grey square lights up in a colour for a moment. What colour does it light up?",
                   problem_type="multiple_choice", options=list(COLOR_NAMES), answer=COLOR_NAMES[cls],
                   difficulty=difficulty, frames=frames, fps=EVIDENCE_FPS,
                   sampling={"nframes": INITIAL_FRAMES}, meta=meta)
