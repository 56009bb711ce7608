"""Localized re-sampling around selected key frames (EARL's environment step, docs/methods/earl.md, Protocol).

Rule (our reading of "nearest neighbours": the adjacent frames of the current grid): the current frame
grid has sorted timestamps ``t_0 < ... < t_{m-1}``.
Selecting grid frame ``k`` opens the interval ``[t_{k-1}, t_{k+1}]``. The first/last frame's open side
reaches the ``start``/``end`` bound (``edge="bound"``, the default) or mirrors its one neighbour
(``edge="mirror"``: ``[t_0 - (t_1 - t_0), t_1]``), which keeps a second round's edge frames from opening
the whole rest of the video. Overlapping intervals are merged. Up to ``max_frames`` new frames
are allocated across the merged intervals proportionally to their length (Sainte-Laguë highest
averages; ``allocation="equal"`` gives every interval the same weight), never more than an interval has
unseen frames, and spread evenly over each interval's unseen frames. Everything is compared at frame
resolution (``index = round(t * fps)``): frames of the grid and of ``shown`` are never returned again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from .reader import VideoReader
from .sampling import SampledVideo, decode_indices

Allocation = Literal["proportional", "equal"]


@dataclass
class Resampled:
    """New frames: ``indices`` (into the video, ascending), ``timestamps`` (``index / fps``), and the
    merged ``intervals`` (seconds) they were drawn from."""

    indices: list[int]
    timestamps: list[float]
    intervals: list[tuple[float, float]]

    def __len__(self) -> int:
        return len(self.indices)


Edge = Literal["bound", "mirror"]


def neighbour_intervals(
    grid: Sequence[float], selected: Iterable[int], start: float, end: float, *, edge: Edge = "bound"
) -> list[tuple[float, float]]:
    """Merged ``[t_{k-1}, t_{k+1}]`` intervals of the selected grid positions, clipped to ``[start, end]``.

    ``edge``: what the first/last grid frame's open side reaches: the bound (``"bound"``) or as far as its
    one neighbour on the other side (``"mirror"``; a grid of one frame always reaches the bounds)."""
    if edge not in ("bound", "mirror"):
        raise ValueError(f"edge must be 'bound' or 'mirror', got {edge!r}")
    times = [float(t) for t in grid]
    if any(b < a for a, b in pairwise(times)):
        raise ValueError("grid timestamps must be sorted in ascending order")
    spans = []
    for k in sorted({int(k) for k in selected}):
        if not 0 <= k < len(times):
            raise ValueError(f"selected frame {k} is not in the current grid of {len(times)} frames")
        mirror = edge == "mirror" and len(times) > 1
        if k > 0:
            lo = times[k - 1]
        else:
            lo = times[0] - (times[1] - times[0]) if mirror else start
        if k + 1 < len(times):
            hi = times[k + 1]
        else:
            hi = times[-1] + (times[-1] - times[-2]) if mirror else end
        lo, hi = max(lo, start), min(hi, end)
        if hi >= lo:
            spans.append((lo, hi))
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _allocate(weights: list[float], capacity: list[int], total: int) -> list[int]:
    """Sainte-Laguë: hand out ``total`` seats one by one to the highest ``w / (2a + 1)`` with room."""
    alloc = [0] * len(weights)
    for _ in range(min(total, sum(capacity))):
        best, best_q = -1, -1.0
        for i, (w, cap) in enumerate(zip(weights, capacity)):
            if alloc[i] < cap:
                q = w / (2 * alloc[i] + 1)
                if q > best_q:
                    best, best_q = i, q
        alloc[best] += 1
    return alloc


def resample_around(
    grid: Sequence[float],
    selected: Iterable[int],
    max_frames: int,
    *,
    fps: float,
    num_frames: int,
    start: float | None = None,
    end: float | None = None,
    shown: Iterable[float] = (),
    allocation: Allocation = "proportional",
    edge: Edge = "bound",
) -> Resampled:
    """Up to ``max_frames`` new frame timestamps around the ``selected`` grid positions (0-based).

    ``grid``: timestamps (s) of the frames currently shown, sorted. ``fps``/``num_frames``: the video.
    ``start``/``end``: bounds in seconds (default the whole video). ``shown``: timestamps already shown
    in earlier rounds (the grid counts as shown too). ``edge``: see :func:`neighbour_intervals`. Returns
    ascending, unique, unseen frames.
    """
    if fps <= 0 or num_frames <= 0:
        raise ValueError(f"need a positive fps and frame count, got fps={fps}, num_frames={num_frames}")
    if allocation not in ("proportional", "equal"):
        raise ValueError(f"allocation must be 'proportional' or 'equal', got {allocation!r}")
    duration = num_frames / fps
    lo_t = 0.0 if start is None else max(0.0, float(start))
    hi_t = duration if end is None else min(duration, float(end))
    if hi_t <= lo_t:
        raise ValueError(f"empty bounds [{start}, {end}] for a {duration:.3f} s video")
    first = math.ceil(lo_t * fps - 1e-9)
    last = min(math.floor(hi_t * fps + 1e-9), num_frames - 1)
    seen = {round(float(t) * fps) for t in (*grid, *shown)}

    intervals = neighbour_intervals(grid, selected, lo_t, hi_t, edge=edge)
    free: list[list[int]] = []
    for a, b in intervals:
        lo_i = max(first, math.ceil(a * fps - 1e-9))
        hi_i = min(last, math.floor(b * fps + 1e-9))
        free.append([i for i in range(lo_i, hi_i + 1) if i not in seen])
    # a frame on the border of two merged intervals cannot appear twice: intervals do not overlap
    weights = [b - a if allocation == "proportional" else 1.0 for a, b in intervals]
    counts = _allocate(weights, [len(f) for f in free], max(0, int(max_frames)))

    picked: set[int] = set()
    for cand, k in zip(free, counts):
        n = len(cand)
        picked.update(cand[int((j + 0.5) * n / k)] for j in range(k))
    indices = sorted(picked)
    return Resampled(indices=indices, timestamps=[i / fps for i in indices], intervals=intervals)


def resample_video(
    reader: VideoReader,
    grid: Sequence[float],
    selected: Iterable[int],
    max_frames: int = 16,
    *,
    start: float | None = None,
    end: float | None = None,
    shown: Iterable[float] = (),
    allocation: Allocation = "proportional",
    edge: Edge = "bound",
    **resize: Any,
) -> tuple[Resampled, SampledVideo | None]:
    """:func:`resample_around` on ``reader``'s video, then decode and fit the frames to the pixel budget
    (``resize``: ``min_pixels``, ``max_pixels``, ``total_pixels``, ``image_patch_size``). The
    :class:`SampledVideo` is ``None`` when no unseen frame is left. Its ``sample_fps`` counts frames per
    second of the merged intervals."""
    res = resample_around(
        grid, selected, max_frames, fps=reader.fps, num_frames=reader.num_frames,
        start=start, end=end, shown=shown, allocation=allocation, edge=edge,
    )
    if not res.indices:
        return res, None
    span = sum(max(1, round((b - a) * reader.fps)) for a, b in res.intervals)
    video = decode_indices(reader, res.indices, window_frames=span, policy="resample",
                           options={"max_frames": max_frames, "allocation": allocation, "edge": edge}, **resize)
    return res, video


# ---------------------------------------------------------------------------------------- frame cells
def cells(timestamps: Sequence[float]) -> list[tuple[float, float]]:
    """Each frame's time cell: from the midpoint with its previous frame to the midpoint with its next one
    (the first and last reach -inf and +inf). A time belongs to the cell of its nearest frame."""
    ts = [float(t) for t in timestamps]
    mids = [(a + b) / 2 for a, b in pairwise(ts)]
    lows = [float("-inf"), *mids]
    highs = [*mids, float("inf")]
    return list(zip(lows, highs))


def cell_of(t: float, timestamps: Sequence[float]) -> int:
    """0-based index of the frame nearest to time ``t`` (ties go to the earlier frame)."""
    return min(range(len(timestamps)), key=lambda k: (abs(float(timestamps[k]) - t), k))


def frames_on_spans(timestamps: Sequence[float], spans: Sequence[Sequence[float]]) -> list[int]:
    """0-based indices of the frames whose cell overlaps any ``[start, end]`` span (seconds)."""
    out = []
    for k, (lo, hi) in enumerate(cells(timestamps)):
        if any(lo <= float(b) and float(a) <= hi for a, b in spans):
            out.append(k)
    return out
