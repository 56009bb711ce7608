"""What a run's stages and the methods' own commands share: the model folder a config names (the user's, or
the tiny/toy model built into the cache), the data of a split (every media file checked first), and torch's
CPU thread count. The methods borrow these; they import nothing else of :mod:`mmrl.run`'s pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmrl.config import RunConfig
from mmrl_common.errors import ConfigError


def resolve_model(cfg: RunConfig) -> Path:
    """The model folder ``cfg`` names (the user's ``model.path``, else the tiny or toy-base model built into the
    cache). A folder mmrl wrote (``final/``, ``sft-model/``, a checkpoint) is checked against its ``digest.json``
    first (:func:`mmrl.engine.checkpoint.verify_model_folder`): a cut or changed file is named, never loaded
    or scored; a folder without a digest (a Hugging Face model) is taken as it is."""
    if cfg.model.path:
        from mmrl.engine.checkpoint import verify_model_folder

        verify_model_folder(cfg.model.path)
        return Path(cfg.model.path)
    if cfg.model.init == "toy_base":
        from mmrl.toy.base import BaseRecipe, ensure_toy_base

        return ensure_toy_base(BaseRecipe(family=cfg.model.tiny_family, seed=cfg.model.tiny_seed,
                                          size=tuple(cfg.model.tiny_size.items()),
                                          world=tuple(cfg.data.toy_world.items()), **cfg.model.toy_base))
    from mmrl.toy.tiny_models import ensure_tiny

    return Path(ensure_tiny(cfg.model.tiny_family, seed=cfg.model.tiny_seed, **cfg.model.tiny_size))


def set_cpu_threads(setting: int | str, *, show: bool = True, earlier: int | None = None) -> int:
    """Set torch's CPU thread count from ``train.cpu_threads`` and return it.

    ``auto``: ``earlier`` (the count a resumed run started with, so that it continues exactly), else
    ``OMP_NUM_THREADS`` when it is set, else the cores this process may use minus the load of other
    processes (the 1-minute load average), at least 1. Measured on a 2-core machine beside other training
    runs (load average 4-6): a tiny-model RL step took 0.58 s with 1 thread and 7-12 s with 2."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if setting == "auto" and earlier:
        n, why = int(earlier), "as when the run started"
    elif setting == "auto":
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            n, why = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
        else:
            busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
            n = max(1, min(cores, round(cores - busy)))
            why = f"{cores} cores, load {busy:.1f} from other processes"
    else:
        n, why = int(setting), "train.cpu_threads"
        if n < 1:
            raise ConfigError(f"train.cpu_threads={setting}: must be 'auto' or >= 1")
    torch.set_num_threads(n)
    if show:
        print(f"torch CPU threads: {n} ({why}; set train.cpu_threads=N to choose)", flush=True)
    return n


def load_split(cfg: RunConfig, split: str, *, show_progress: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """The samples of a split (``train``, ``val``, ``test``), filtered by the run's task and type settings.

    Every media file is checked first (``data.check_media``); with ``data.on_bad_sample=skip`` the bad
    records are left out, printed (FILE:LINE: reason) and listed in ``info["skipped_records"]``."""
    from data_pipelines.loaders import load_samples

    path = split_path(cfg, split, show_progress=show_progress)
    if path is None:
        return [], {"split": split, "path": None}  # the report says there was none
    check = None if cfg.data.check_media == "none" else cfg.data.check_media
    result = load_samples(path, fmt=cfg.data.format, columns=cfg.data.columns or None,
                          media_root=cfg.data.media_root, on_bad_sample=cfg.data.on_bad_sample,
                          check_media=check or False, progress=show_progress,
                          skip_hint="pass data.on_bad_sample=skip",
                          max_question_chars=cfg.data.max_question_chars, role=split,
                          decoding={"decoder": cfg.data.media.decoder, "decode_timeout": cfg.data.media.decode_timeout})
    samples = list(result.samples)
    left_out: dict[str, int] = {}  # good records the run's settings leave out, by setting
    if cfg.data.toy_tasks and cfg.data.train is None and getattr(cfg.data, split) is None:  # toy-world settings
        # never filter user data (nor the held-out split of a user's data.train folder)
        kept = [s for s in samples if s.meta.get("task") in cfg.data.toy_tasks]
        left_out["data.toy_tasks"], samples = len(samples) - len(kept), kept
    if cfg.data.problem_types:
        kept = [s for s in samples if s.problem_type in cfg.data.problem_types]
        left_out["data.problem_types"], samples = len(samples) - len(kept), kept
    skipped: dict[str, dict[str, Any]] = {}
    for p in result.problems:
        rec = skipped.setdefault(p.location(), {"where": p.location(), "id": p.sample_id, "reasons": []})
        rec["reasons"].append(p.reason)
    info = {"path": str(path), "split": split, "lines": result.lines, "blank_lines": result.blank_lines,
            "records": result.total, "loaded": len(result.samples), "used": len(samples), "skipped": result.skipped,
            "skipped_by": dict(result.skipped_by), "left_out": {k: n for k, n in left_out.items() if n},
            "skipped_records": list(skipped.values())}
    if skipped:
        from data_pipelines.loaders import numbering_note

        print(f"data.{split}: {result.skipped} bad record(s) of {result.total} left out "
              f"(data.on_bad_sample=skip):", flush=True)
        for p in result.problems:
            print(f"  {p}", flush=True)
        print(numbering_note(result.problems), end="", flush=True)
    return samples, info


def no_training_samples(cfg: RunConfig, info: dict[str, Any]) -> str:
    """Why a run has no training sample: every record bad (and skipped), or the settings that left out the good ones."""
    where = f"data.train {info['path']}" if cfg.data.train is not None else "the toy world's train split"
    if not info.get("loaded"):
        return (f"{where}: all {info['records']} records are bad and data.on_bad_sample=skip left each out (listed "
                f"above); fix them (mmrl data validate {info['path']} names each)")
    why = ", ".join(f"{key} left out {n}" for key, n in info["left_out"].items())
    return f"{where}: none of its {info['loaded']} good records is left ({why}); widen or drop those settings"


def split_path(cfg: RunConfig, split: str, *, show_progress: bool = True) -> str | None:
    """The data file of a split: the user's (``data.<split>``), None when the user gave training data but
    none for this split, or the toy world's, which is built here into the mmrl cache on first use."""
    from data_pipelines.loaders import dataset_exists, held_out_split

    path = getattr(cfg.data, split)
    if path is None:
        if cfg.data.train is not None:
            if split == "train":
                raise ConfigError("data.train is required")
            return held_out_split(cfg.data.train, split)  # --data FOLDER with a test split: that split
        from data_pipelines.toy import ensure_toy

        toy = ensure_toy(seed=cfg.data.toy_seed, size=cfg.data.toy_size or "default",
                         tasks=cfg.data.toy_tasks or None, world=cfg.data.toy_world, progress=show_progress)
        path = str(Path(toy) / f"{split}.jsonl")
    if not dataset_exists(path):  # a file or folder, PATH:SPLIT, or a glob of shards
        raise ConfigError(f"data.{split}: file not found: {path}")
    return str(path)


def shared_inputs(cfg: RunConfig) -> dict[str, str | Path | None]:
    """What every node of a run must see alike (on shared storage): the user's data and model."""
    files: dict[str, str | Path | None] = {f"data.{s}": getattr(cfg.data, s) for s in ("train", "val", "test")}
    files["data.media_root"] = cfg.data.media_root
    files["model.path"] = Path(cfg.model.path) / "config.json" if cfg.model.path else None
    return files


def data_identity(path: str, *, training: bool) -> tuple[str, str | None]:
    """What a data path reads: its resolved file, folder or glob and the split (training reads a folder's
    ``train`` split when none is named)."""
    from data_pipelines.loaders import split_spec

    base, split = split_spec(path)
    if training and split is None and base.is_dir():
        split = "train"
    return str(base.resolve()), split


def evaluated_on_training_data(cfg: Any) -> str | None:
    """A line when the held-out data evaluated (``data.<eval.split>``) is the training data itself (``--data
    FILE --eval-data FILE``): its accuracies are not held-out ones. None otherwise."""
    held_out, train = getattr(cfg.data, cfg.eval.split, None), cfg.data.train
    if not held_out or not train or data_identity(str(held_out), training=False) != \
            data_identity(str(train), training=True):
        return None
    return (f"data.{cfg.eval.split} {held_out} is the training data (data.train, --data): its accuracy is measured "
            "on questions the model trains on, not held-out ones; give held-out questions with --eval-data FILE")
