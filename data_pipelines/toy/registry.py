"""Registry of toy-world tasks. A task turns ``(rng, index, config)`` into one :class:`ToyItem`.

The index decides the answer class and the difficulty variant (see :func:`cycle`), so every split is
balanced across answer letters by construction; the rng decides everything else (positions, colours
that are not the answer, timings). Add a task with :func:`register_task`::

    @register_task("my_task", kind="video", description="...")
    def my_task(rng, index, cfg) -> ToyItem: ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmrl_common.errors import DataError
from mmrl_common.registry import Registry

DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class ToyConfig:
    """Settings every task sees. ``resolution`` is the side of the square frames/images (even); the others are
    the toy world's options (``data.toy_world``, :data:`WORLD_OPTIONS`), whose defaults draw the world as it
    always was."""

    resolution: int = 64
    motion_trail: int = 0
    """Fading copies of the square drawn behind it in ``motion`` (motion blur; copy k lies 2k frames back, at
    1 - k/(n+1) of the square's contrast; 0: none). Direction then shows within a frame, where a tiny model's
    patch embedding sees it; without it, it shows only as a change of place across frames."""
    needle_frames: int = 8
    """Frames a ``needle`` video is sampled at (its records' ``sampling.nframes``): with 8 frames over 24 s a
    0.5-2 s event falls between the sampled frames in most videos."""

    def __post_init__(self) -> None:
        for name, least in WORLD_OPTIONS.items():
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
                raise DataError(f"toy world option {name}={value!r}: a whole number, {least} or more")

    def options(self) -> dict[str, int]:
        """The world options that differ from their defaults (what enters a cache key)."""
        return {k: getattr(self, k) for k in WORLD_OPTIONS if getattr(self, k) != getattr(DEFAULT_WORLD, k)}


WORLD_OPTIONS = {"motion_trail": 0, "needle_frames": 2}
"""The toy world's options (``data.toy_world``) and their least values."""
DEFAULT_WORLD = ToyConfig()


def world_config(resolution: int = 64, world: Mapping[str, Any] | None = None) -> ToyConfig:
    """A :class:`ToyConfig`; :class:`DataError` naming an unknown option and the known ones."""
    world = dict(world or {})
    if unknown := [k for k in world if k not in WORLD_OPTIONS]:
        raise DataError(f"unknown toy world option(s) {', '.join(map(str, unknown))}; known: {', '.join(WORLD_OPTIONS)}")
    return ToyConfig(resolution=resolution, **world)


@dataclass
class ToyItem:
    """One generated question. Exactly one of ``frames`` (uint8 ``(N,H,W,3)``, with ``fps``) or
    ``image`` (uint8 ``(H,W)`` grey or ``(H,W,3)``) is set."""

    question: str
    problem_type: str
    answer: Any
    difficulty: str
    options: list[str] | None = None
    frames: np.ndarray | None = None
    fps: float | None = None
    image: np.ndarray | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


TaskFn = Callable[[np.random.Generator, int, ToyConfig], ToyItem]


@dataclass
class ToyTask:
    name: str
    fn: TaskFn
    kind: str  # "video" or "image"
    description: str = ""
    version: int = 1
    """Bumped when the task's pictures or questions change; a version above 1 enters the cache key of every toy
    dataset and toy base that holds the task (:func:`task_versions`), and only theirs."""


TASKS: Registry[ToyTask] = Registry("toy task", "data.toy_tasks", error=DataError, duplicates="error")
"""Every toy task by name, in registration order (built-ins first once :func:`toy_tasks` ran)."""


def register_task(name: str, *, kind: str, description: str = "", version: int = 1,
                  overwrite: bool = False) -> Callable[[TaskFn], TaskFn]:
    """Decorator that registers a task generator under ``name`` (``version``: see :attr:`ToyTask.version`)."""
    if kind not in ("video", "image"):
        raise ValueError(f"task kind must be 'video' or 'image', got {kind!r}")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"task version must be an integer >= 1, got {version!r}")

    def deco(fn: TaskFn) -> TaskFn:
        TASKS.add(name, ToyTask(name, fn, kind, description, version), overwrite=overwrite)
        return fn

    return deco


def toy_tasks() -> dict[str, ToyTask]:
    """Registered tasks in registration order (the built-ins first: the package's face, ``data_pipelines.toy``,
    imports their modules, and importing this module imports the package first)."""
    return dict(TASKS.items())


def task_versions(names: Sequence[str]) -> dict[str, int]:
    """``{task: version}`` for those of ``names`` past version 1: the part of a cache key that follows the tasks'
    own changes (empty for tasks never changed, so their datasets and bases keep their keys)."""
    return {n: get_task(n).version for n in names if get_task(n).version > 1}


def get_task(name: str) -> ToyTask:
    """The task registered as ``name``; :class:`DataError` naming the nearest and the valid tasks otherwise."""
    return TASKS.get(name)


def cycle(index: int, n_classes: int, n_variants: int = 1) -> tuple[int, int]:
    """``index -> (answer class, variant)``. Classes cycle fastest, so any ``n_classes`` consecutive
    indices cover every class once (balanced answers); the variant is ``(class + block) % n_variants``,
    so even a small split mixes variants (difficulties) and every class meets every variant within
    ``n_classes * n_variants`` indices."""
    cls, block = index % n_classes, index // n_classes
    return cls, (cls + block) % max(1, n_variants)
