"""The toy world: small procedural datasets (MP4 videos, PNG scans, JSONL records) with a fixed seed.

Tasks (``toy_tasks()``): ``color``, ``shape``, ``count``, ``motion``, ``order``, ``needle``,
``grounding`` (videos) and ``scan`` (grey-scale images). See :mod:`.video_tasks` and :mod:`.scan` for what
each draws, and :func:`make_toy` / :func:`ensure_toy` to write one.
"""

# isort: off
# the built-in tasks register here, in this order (videos first; toy_tasks() lists them so)
from .registry import DIFFICULTIES, ToyConfig, ToyItem, ToyTask, cycle, get_task, register_task, toy_tasks
from . import video_tasks, image_tasks, scan  # noqa: F401
from . import evidence_task  # noqa: F401  (EARL's evidence task)
from .build import GENERATOR_VERSION, SIZES, SPLITS, ensure_toy, make_toy, toy_key
from .draw import COLOR_NAMES, COLORS, SHAPES
# isort: on

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
