"""The toy world: small procedural datasets (MP4 videos, PNG scans, JSONL records) with a fixed seed.

Tasks (``toy_tasks()``): ``color``, ``shape``, ``count``, ``motion``, ``order``, ``needle``,
``grounding`` (videos) and ``scan`` (grey-scale images). See :mod:`.video_tasks` and :mod:`.scan` for what
each draws, and :func:`make_toy` / :func:`ensure_toy` to write one.
"""

from .build import GENERATOR_VERSION, SIZES, SPLITS, ensure_toy, make_toy, toy_key
from .draw import COLOR_NAMES, COLORS, SHAPES
from .registry import DIFFICULTIES, ToyConfig, ToyItem, ToyTask, cycle, get_task, register_task, toy_tasks

__all__ = [
    "COLORS",
    "COLOR_NAMES",
    "DIFFICULTIES",
    "GENERATOR_VERSION",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "ToyConfig",
    "ToyItem",
    "ToyTask",
    "cycle",
    "ensure_toy",
    "get_task",
    "make_toy",
    "register_task",
    "toy_key",
    "toy_tasks",
]
