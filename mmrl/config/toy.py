"""The toy base model's recipe: :class:`BaseRecipe` (how it is pre-trained; every field enters its cache key),
the checks of its settings (``model.toy_base``, ``mmrl models make-toy-base``) and where it is cached. Building
it is :mod:`mmrl.toy.base`'s; this module needs neither the run configuration nor the trainer, so the
configuration checks ``model.toy_base`` with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

# 2: video positions by the pre-training rule (mmrl.model.rope): a base pre-trained under transformers' rule would see
# text after a video at other positions in every later run
# 3: question-form requests and candidate words in half of them (the v2 base answered every RL question with a
# colour: it had never seen a prompt that lists options)
PRETRAIN_VERSION = 3
INFO_FILE = "toy_base.json"


@dataclasses.dataclass(frozen=True)
class BaseRecipe:
    """How the toy base model is made (every field enters the cache key)."""

    family: str = "qwen2_5_vl"
    seed: int = 0
    tasks: tuple[str, ...] = ("color", "shape", "count", "motion", "order", "needle", "color_image", "scan")
    per_task: int = 200
    """Pictures or videos per task in the pre-training split (1-2 requests each)."""
    steps: int = 2000
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 20
    max_frames: int = 4
    video_pixels: int = 3136
    image_pixels: int = 12544
    letter_share: float = 0.0
    """Share of the requests whose answer comes from a word list that are posed as a multiple-choice question
    instead: 3-5 of the words as lettered options in a random order, answered with the letter (a real base
    model has seen exam-style questions; the default base never sees a letter and answers in words)."""
    pointer_steps: int = 0
    """Steps of a text-only pointer phase before the pre-training (``data_pipelines.toy.pretrain.pointer_drill``:
    "Pick the option red." with lettered options, answered with the letter; batch 32). The 2-layer tiny model
    needs thousands of such steps before it maps a word to its option's letter at all, far more lettered
    requests than ``letter_share`` gives it; a quarter of the pre-training's items are then drill items too
    (``POINTER_MIX``), so that it keeps the pointer. 0: no pointer phase."""
    world: tuple[tuple[str, int], ...] = ()
    """The toy world's options its pre-training split is drawn with, as ``(option, value)`` pairs (a run's
    ``data.toy_world``: the base sees the world the run's questions are drawn from; empty: the default world)."""
    size: tuple[tuple[str, int], ...] = ()
    """Size overrides of the tiny model it starts from, as ``(field, value)`` pairs of
    :class:`mmrl.config.tiny_size.TinySize` (a run's ``model.tiny_size``; empty: the default tiny size)."""

    def __post_init__(self) -> None:
        from mmrl.config.tiny_size import TinySize, resolve_size

        given = dict(self.size)
        resolve_size(self.family, **given)  # ConfigError on an unknown field or a bad value
        default = dataclasses.asdict(TinySize())  # an explicit default is no change: the same base
        object.__setattr__(self, "size", tuple(sorted((k, v) for k, v in given.items() if v != default[k])))
        from data_pipelines.toy.registry import world_config

        world = world_config(world=dict(self.world)).options()  # DataError on an unknown option; defaults dropped
        object.__setattr__(self, "world", tuple(sorted(world.items())))


# fields added after PRETRAIN_VERSION 3: they enter the cache key only when set, so the default base (and every
# result measured on it) keeps its key
LATER_FIELDS = ("letter_share", "pointer_steps", "size", "world")
POINTER_ITEMS = 4096
POINTER_BATCH = 32
POINTER_MIX = 0.25
"""Share of pointer-drill items among the pre-training's descriptions (with ``pointer_steps``)."""
# family, seed and size come from model.tiny_family, model.tiny_seed and model.tiny_size (as for a random tiny model)
OVERRIDABLE = tuple(f.name for f in dataclasses.fields(BaseRecipe) if f.name not in ("family", "seed", "size", "world"))


def check_overrides(given: dict[str, Any], prefix: str = "model.toy_base") -> None:
    """Raise :class:`ConfigError` for an override of :class:`BaseRecipe` that does not exist or is out of range."""
    from mmrl_common.errors import ConfigError

    for key, value in given.items():
        if key not in OVERRIDABLE:
            raise ConfigError(f"{prefix}.{key}: not a setting of the toy base model; settable: {', '.join(OVERRIDABLE)}"
                              " (model.tiny_family, model.tiny_seed and model.tiny_size choose the family, the seed and"
                              " the size)")
        if key == "letter_share":
            check_letter_share(value, f"{prefix}.letter_share")
        if key in COUNTS:
            check_count(value, f"{prefix}.{key}", COUNTS[key])
        if key == "tasks":
            check_tasks(value, f"{prefix}.tasks")


# whole-number settings and their least value
COUNTS = {"steps": 1, "per_task": 1, "batch_size": 1, "warmup_steps": 0, "max_frames": 1, "pointer_steps": 0}


def check_count(value: Any, name: str, least: int) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is a whole number >= ``least``."""
    from mmrl_common.errors import ConfigError

    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise ConfigError(f"{name}={value!r}: a whole number, {least} or more")


def check_tasks(names: Any, name: str) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``names`` are toy tasks the pre-training describes."""
    from data_pipelines.toy.pretrain import pretrain_tasks
    from mmrl_common.errors import ConfigError

    if isinstance(names, str) or not names:
        raise ConfigError(f"{name}={names!r}: a non-empty list of toy tasks; described: {', '.join(pretrain_tasks())}")
    if unknown := [t for t in names if t not in pretrain_tasks()]:
        raise ConfigError(f"{name}: no pre-training descriptions for {', '.join(map(str, unknown))}; "
                          f"described: {', '.join(pretrain_tasks())}")


def check_letter_share(value: Any, name: str) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is a share in [0, 1]."""
    from mmrl_common.errors import ConfigError

    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ConfigError(f"{name}={value!r}: a share, in [0, 1]")


def base_key(recipe: BaseRecipe) -> str:
    from data_pipelines.toy.build import GENERATOR_VERSION
    from data_pipelines.toy.registry import task_versions

    fields = dataclasses.asdict(recipe)
    defaults = dataclasses.asdict(BaseRecipe())
    for name in LATER_FIELDS:
        if fields[name] == defaults[name]:
            del fields[name]
        elif name in ("size", "world"):
            fields[name] = dict(getattr(recipe, name))
    if versions := task_versions(recipe.tasks):  # a toy task whose pictures changed since (e.g. scan v2) moves it
        fields["task_versions"] = versions
    blob = json.dumps({**fields, "v": PRETRAIN_VERSION, "toy": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def base_dir(recipe: BaseRecipe) -> Path:
    from mmrl_common.paths import cache_dir

    return cache_dir() / "toy-base" / f"{recipe.family}-{base_key(recipe)}"
