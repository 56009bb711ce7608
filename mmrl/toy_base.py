"""The toy base model: a tiny Qwen-VL that already sees, so RL on the toy world sharpens it as RL sharpens a
real Qwen-VL (rather than having to learn perception from a sparse reward).

It starts from the tiny random-weight model of :mod:`mmrl.tiny_models` (same architecture and tokenizer)
and is pre-trained with the ordinary supervised loop (:func:`mmrl.sft.run_sft`, loss on the answer tokens)
on the toy world's **pre-training split** (:mod:`data_pipelines.toy.pretrain`): requests to name what is
seen (colours, shapes, counts, directions, the order of flashes, a brief square's colour, a scan's finding),
on media of its own, never the RL and test splits' questions, option lists or answer letters. It answers
inside ``<answer></answer>`` with the thing seen ("red", "3", "left"); the multiple-choice questions of the
RL splits are new to it, and the accuracy reward reads an option's text as that option.

Built once and cached (``$MMRL_CACHE/toy-base/<family>-<hash>``, written atomically); ``mmrl models
make-toy-base`` builds it by hand, and a run with ``model.init: toy_base`` builds it on first use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# 2: video positions by the pre-training rule (mmrl.rope): a base pre-trained under transformers' rule would see
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
    size: tuple[tuple[str, int], ...] = ()
    """Size overrides of the tiny model it starts from, as ``(field, value)`` pairs of
    :class:`mmrl.tiny_models.TinySize` (a run's ``model.tiny_size``; empty: the default tiny size)."""

    def __post_init__(self) -> None:
        from mmrl.tiny_models import TinySize, resolve_size

        given = dict(self.size)
        resolve_size(self.family, **given)  # ConfigError on an unknown field or a bad value
        default = dataclasses.asdict(TinySize())  # an explicit default is no change: the same base
        object.__setattr__(self, "size", tuple(sorted((k, v) for k, v in given.items() if v != default[k])))


# fields added after PRETRAIN_VERSION 3: they enter the cache key only when set, so the default base (and every
# result measured on it) keeps its key
LATER_FIELDS = ("letter_share", "pointer_steps", "size")
POINTER_ITEMS = 4096
POINTER_BATCH = 32
POINTER_MIX = 0.25
"""Share of pointer-drill items among the pre-training's descriptions (with ``pointer_steps``)."""
# family, seed and size come from model.tiny_family, model.tiny_seed and model.tiny_size (as for a random tiny model)
OVERRIDABLE = tuple(f.name for f in dataclasses.fields(BaseRecipe) if f.name not in ("family", "seed", "size"))


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
        elif name == "size":
            fields[name] = dict(recipe.size)
    if versions := task_versions(recipe.tasks):  # a toy task whose pictures changed since (e.g. scan v2) moves it
        fields["task_versions"] = versions
    blob = json.dumps({**fields, "v": PRETRAIN_VERSION, "toy": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def base_dir(recipe: BaseRecipe) -> Path:
    from mmrl_common.paths import cache_dir

    return cache_dir() / "toy-base" / f"{recipe.family}-{base_key(recipe)}"


def pretrain_config(recipe: BaseRecipe) -> Any:
    """The run configuration of the pre-training (media budgets as the toy recipes, answers in tags)."""
    from mmrl.config import MediaConfig, PromptConfig, RunConfig, SFTConfig

    cfg = RunConfig()
    cfg.data.media = MediaConfig(min_frames=recipe.max_frames, max_frames=recipe.max_frames,
                                 video_min_pixels=recipe.video_pixels, video_max_pixels=recipe.video_pixels,
                                 image_min_pixels=recipe.image_pixels, image_max_pixels=recipe.image_pixels)
    cfg.prompt = PromptConfig(answer_format="answer")
    cfg.sft = SFTConfig(steps=recipe.steps, lr=recipe.lr, batch_size=recipe.batch_size,
                        warmup_steps=recipe.warmup_steps, target="gold")
    cfg.train.seed = recipe.seed
    return cfg


def make_toy_base(out: str | Path, recipe: BaseRecipe = BaseRecipe(), *, progress: bool = True) -> Path:
    """Build the toy base model into ``out`` (a Hugging Face folder with ``toy_base.json``)."""
    import torch

    from data_pipelines.loaders import load_samples
    from data_pipelines.schema import Sample
    from data_pipelines.toy.pretrain import make_pretrain, pointer_drill
    from mmrl.checkpoint import seed_everything
    from mmrl.policy import load_policy
    from mmrl.sft import run_sft
    from mmrl.tiny_models import make_tiny

    out = Path(out)
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".toy-base-work-", dir=out.parent if out.parent.exists() else None))
    try:
        say = print if progress else (lambda *a, **k: None)
        say(f"toy base model: writing the pre-training split ({len(recipe.tasks)} tasks x {recipe.per_task})",
            flush=True)
        data = make_pretrain(work / "data", recipe.seed + 1, tasks=recipe.tasks, per_task=recipe.per_task,
                             letter_share=recipe.letter_share, progress=progress)
        samples = load_samples(data).samples
        seed_everything(recipe.seed)
        start = make_tiny(recipe.family, work / "init", seed=recipe.seed, **dict(recipe.size))
        policy = load_policy(start, device="cpu")
        if recipe.pointer_steps:
            say(f"toy base model: pointer phase, {recipe.pointer_steps} steps on text-only lettered requests",
                flush=True)
            drill = [Sample.from_dict(r) for r in pointer_drill(POINTER_ITEMS, recipe.seed + 2)]
            cfg = pretrain_config(recipe)
            cfg.sft = dataclasses.replace(cfg.sft, steps=recipe.pointer_steps, batch_size=POINTER_BATCH)
            run_sft(cfg, policy, drill, show_progress=progress, keep_encoded=True, desc="toy base pointer phase")
            # and a share of them among the descriptions: without it, the pre-training forgets the pointer (measured
            # 2026-11-25: 6000 pointer steps, then 2000 steps of descriptions alone: 0.38 on 100 held-out drill items)
            samples = samples + drill[:round(len(samples) * POINTER_MIX / (1 - POINTER_MIX))]
        say(f"toy base model: pre-training on {len(samples)} descriptions for {recipe.steps} steps "
            "(once; a few minutes on 2 CPU cores)", flush=True)
        t1 = time.perf_counter()
        last = run_sft(pretrain_config(recipe), policy, samples, show_progress=progress, keep_encoded=True,
                       desc="toy base pre-training")
        out.mkdir(parents=True, exist_ok=True)
        policy.model.save_pretrained(out, safe_serialization=True)
        policy.processor.save_pretrained(out)
        info = {"recipe": {**dataclasses.asdict(recipe), "size": dict(recipe.size)}, "key": base_key(recipe),
                "parameters": sum(p.numel() for p in policy.model.parameters()), "descriptions": len(samples),
                "final_loss": last.get("loss"), "pretrain_seconds": round(time.perf_counter() - t1, 1),
                "build_seconds": round(time.perf_counter() - t0, 1), "torch_threads": torch.get_num_threads(),
                "trained_on": "data_pipelines.toy.pretrain (descriptions; no RL/test question or option list"
                              + ("; lettered options in orders of its own)" if recipe.letter_share else
                                 " or answer letter)")
                              + ("; first a text-only pointer phase (lettered options, no media)"
                                 if recipe.pointer_steps else "")}
        (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"toy base model: built in {time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return out


def ensure_toy_base(recipe: BaseRecipe = BaseRecipe(), *, progress: bool = True) -> Path:
    """The cached toy base model for ``recipe``, built first if needed (atomically: build, then rename). One
    process builds it; others that need it at the same time (the runs of a parallel ``mmrl compare``, test
    workers) wait for that build on a lock file beside the cache instead of building it again."""
    import fcntl

    final = base_dir(recipe)
    if (final / INFO_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(f".{final.name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"toy base model: another process is building {final}; waiting for it", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / INFO_FILE).is_file():
            return final
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            make_toy_base(tmp, recipe, progress=progress)
            os.rename(tmp, final)  # under the lock: nobody else renames
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
