"""Registry of toy-world tasks. A task turns ``(rng, index, config)`` into one :class:`ToyItem`.

The index decides the answer class and the difficulty variant (see :func:`cycle`), so every split is
balanced across answer letters by construction; the rng decides everything else (positions, colours
that are not the answer, timings). Add a task with :func:`register_task`::

    @register_task("my_task", kind="video", description="...")
    def my_task(rng, index, cfg) -> ToyItem: ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmrl_common.errors import DataError
from mmrl_common.registry import Registry

DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class ToyConfig:
    """Settings every task sees. ``resolution`` is the side of the square frames/images (even)."""

    resolution: int = 64


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
