"""Pure helpers of the interleaved comparisons: the ratio of each A/B pair and their median."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def pair_ratios(slow_seconds: Sequence[float], fast_seconds: Sequence[float]) -> list[float]:
    """Per-pair speed-ups ``slow / fast`` of two interleaved series of seconds (pair i = the i-th block of
    each, run back to back). For blocks of the same work this is the ratio of their throughputs
    (``fast`` samples/s over ``slow`` samples/s)."""
    if len(slow_seconds) != len(fast_seconds):
        raise ValueError(f"{len(slow_seconds)} vs {len(fast_seconds)} blocks: the series must pair up")
    if not slow_seconds:
        raise ValueError("no pairs")
    if any(s <= 0 for s in (*slow_seconds, *fast_seconds)):
        raise ValueError("seconds must be positive")
    return [s / f for s, f in zip(slow_seconds, fast_seconds)]


def median_pair_ratio(slow_seconds: Sequence[float], fast_seconds: Sequence[float]) -> float:
    """The median of :func:`pair_ratios`: robust to a pair that another process on the machine slowed."""
    return statistics.median(pair_ratios(slow_seconds, fast_seconds))
