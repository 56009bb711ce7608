"""Write a toy-world dataset to disk: ``make_toy`` (into a folder) and ``ensure_toy`` (cached, built once).

Layout::

    OUT/train.jsonl  OUT/val.jsonl  OUT/test.jsonl      one native record per line
    OUT/media/<split>/<task>/<id>.mp4|png             H.264 MP4 videos, grey PNG scans
    OUT/manifest.json  OUT/README.md                  parameters and counts

Determinism: every (task, split) draws from its own ``numpy`` generator seeded by ``(seed, task,
split)``, so the same arguments give byte-identical JSONL, manifest and PNG files. Videos are encoded
losslessly (H.264, crf 0), so they decode to identical frames whatever the encoder does (libx264 was seen
to vary its lossy bitstream in rare runs). Splits use different generator streams and ids, so no sample
(or media file) is shared between them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmrl_common.errors import DataError

from ..schema import option_letter
from .registry import DIFFICULTIES, ToyItem, get_task, task_versions, toy_tasks, world_config

GENERATOR_VERSION = 3
SPLITS = ("train", "val", "test")
SIZES: dict[str, dict[str, int]] = {  # records per task and split
    "small": {"train": 8, "val": 4, "test": 4},
    "default": {"train": 48, "val": 10, "test": 10},
}
_OUR_FILES = ("train.jsonl", "val.jsonl", "test.jsonl", "manifest.json", "README.md", "media")


def _sizes(size: str | Mapping[str, int]) -> dict[str, int]:
    if isinstance(size, str):
        if size not in SIZES:
            raise DataError(f"unknown toy size {size!r}; use one of {', '.join(SIZES)} or a dict "
                            "{'train': n, 'val': n, 'test': n}")
        return dict(SIZES[size])
    bad = [k for k in size if k not in SPLITS]
    if bad:
        raise DataError(f"toy size has unknown split(s) {bad}; splits are {', '.join(SPLITS)}")
    return {s: int(size.get(s, 0)) for s in SPLITS}


def _task_names(tasks: Sequence[str] | None) -> list[str]:
    known = toy_tasks()
    names = list(known) if not tasks else list(dict.fromkeys(tasks))
    for n in names:
        get_task(n)  # raises with the list of known tasks
    return names


def seeded_rng(seed: int, *parts: str | int) -> np.random.Generator:
    """A generator of its own for ``seed`` and the ``parts`` (names hashed with CRC-32, numbers as they are),
    so each task, split or item draws from a stream that no other one shifts."""
    words = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts]
    return np.random.default_rng(words)


def _to_record(task: str, split: str, index: int, item: ToyItem, media_rel: str, seed: int,
               shuffle_options: bool) -> dict[str, Any]:
    sid = f"toy-{task}-{split}-{index:04d}"
    options = item.options
    answer: Any = item.answer
    extra: dict[str, Any] = {}
    if item.problem_type == "multiple_choice":
        assert options is not None and answer in options, f"{task}: answer {answer!r} not in {options}"
        if shuffle_options:
            perm = seeded_rng(seed, task, split, index, "options").permutation(len(options))
            options = [options[int(p)] for p in perm]
            extra["option_order"] = [int(p) for p in perm]
        answer = option_letter(options.index(item.answer))
    media_type = "video" if item.frames is not None else "image"
    media: dict[str, Any] = {"type": media_type, "path": media_rel}
    if item.sampling:
        media["sampling"] = dict(item.sampling)
    meta = {"task": task, "difficulty": item.difficulty, "source": "toy", "split": split, "seed": seed,
            **extra, **item.meta}
    return {"id": sid, "problem_type": item.problem_type, "question": item.question,
            "options": list(options) if options is not None else None, "answer": answer,
            "media": [media], "meta": meta}


def write_media(item: ToyItem, path: Path) -> None:
    """Write ``item``'s media to ``path`` (folders made): its frames as a lossless mp4, else its image as a
    PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if item.frames is not None:
        from video.writer import write_mp4

        # crf=0 is lossless: decoded frames are a pure function of the drawn frames (the yuv420p round
        # trip), so they stay identical even if the encoder's bitstream ever varies between runs.
        write_mp4(path, item.frames, item.fps or 8.0, crf=0)
    else:
        from PIL import Image

        assert item.image is not None
        Image.fromarray(item.image).save(path, format="PNG")


def _prepare_out(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise DataError(f"{out} exists and is not a folder; choose another --out")
        entries = list(out.iterdir())
        if entries and not (out / "manifest.json").exists():
            raise DataError(f"{out} is not empty and holds no toy dataset (no manifest.json); "
                            "choose an empty or new folder")
        for name in _OUR_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def make_toy(
    out: str | Path,
    seed: int = 0,
    *,
    size: str | Mapping[str, int] = "default",
    tasks: Sequence[str] | None = None,
    shuffle_options: bool = False,
    resolution: int = 64,
    world: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> Path:
    """Generate the toy world into ``out`` and return ``out``.

    ``size``: ``"small"`` (8/4/4 records per task for train/val/test), ``"default"`` (48/10/10) or a dict.
    ``tasks``: subset of :func:`toy_tasks` (default: all). ``shuffle_options``: permute multiple-choice
    options per record (default: canonical order, so the letter follows the content). ``resolution``:
    frame/image side in pixels (even). ``world``: the toy world's options (:data:`registry.WORLD_OPTIONS`,
    e.g. ``{"motion_trail": 4}``; empty: the world as always drawn).
    """
    if resolution < 16 or resolution % 2:
        raise DataError(f"resolution must be an even number >= 16, got {resolution}")
    out = Path(out)
    sizes = _sizes(size)
    names = _task_names(tasks)
    cfg = world_config(resolution, world)
    t0 = time.perf_counter()
    _prepare_out(out)
    counts: dict[str, dict[str, Any]] = {}
    jobs = [(split, name, i) for split in SPLITS for name in names for i in range(sizes[split])]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"toy world -> {out}", unit="rec", file=sys.stderr, leave=False)
    for split in SPLITS:
        records: list[dict[str, Any]] = []
        for name in names:
            task = get_task(name)
            rng = seeded_rng(seed, name, split)
            for i in range(sizes[split]):
                item = task.fn(rng, i, cfg)
                ext = "mp4" if item.frames is not None else "png"
                rel = f"media/{split}/{name}/toy-{name}-{split}-{i:04d}.{ext}"
                write_media(item, out / rel)
                records.append(_to_record(name, split, i, item, rel, seed, shuffle_options))
                if bar is not None:
                    bar.update(1)
        order = seeded_rng(seed, "order", split).permutation(len(records))
        records = [records[int(k)] for k in order]
        with open(out / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
        counts[split] = {
            "records": len(records),
            "by_task": dict(Counter(r["meta"]["task"] for r in records)),
            "by_problem_type": dict(Counter(r["problem_type"] for r in records)),
            "by_difficulty": dict(Counter(r["meta"]["difficulty"] for r in records)),
        }
    if bar is not None:
        bar.close()
    params = {"seed": seed, "size": sizes, "tasks": names, "shuffle_options": shuffle_options,
              "resolution": resolution, **({"world": cfg.options()} if cfg.options() else {})}
    manifest = {"generator": "data_pipelines.toy", "version": GENERATOR_VERSION, **params,
                "task_versions": {n: get_task(n).version for n in names},
                "splits": counts, "total": sum(c["records"] for c in counts.values()),
                "task_descriptions": {n: toy_tasks()[n].description for n in names}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(_readme(manifest), encoding="utf-8")
    if progress:
        per_split = ", ".join(f"{s} {counts[s]['records']}" for s in SPLITS)
        print(f"toy world: {manifest['total']} records ({per_split}) written to {out} in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def _readme(m: dict[str, Any]) -> str:
    lines = [
        "# mmrl toy world", "",
        (f"Generated by `data_pipelines.toy` v{m['version']} with seed {m['seed']}, resolution "
        f"{m['resolution']} px, options {'shuffled' if m['shuffle_options'] else 'in canonical order'}."),
        "Regenerate with `mmrl data make-toy --out DIR --seed SEED`; the same seed gives identical files.", "",
        "| split | records | by task |", "| --- | --- | --- |",
    ]
    for s in SPLITS:
        c = m["splits"][s]
        lines.append(f"| {s} | {c['records']} | {', '.join(f'{k} {v}' for k, v in c['by_task'].items())} |")
    lines += ["", "## Tasks", ""]
    lines += [f"- `{k}`: {v}" for k, v in m["task_descriptions"].items()]
    lines += ["", "## Fields", "",
              "Records follow the mmrl sample schema (id, problem_type, question, options, answer, media, meta).",
              (f"`meta.difficulty` is one of {', '.join(DIFFICULTIES)} (per-task meaning in the task docs: "
              "object size and noise, count, event length, lesion size and contrast)."),
              ("`meta.task`, `meta.source` (`toy`), `meta.split`; temporal tasks carry `gold_frames`, "
              "`gold_span`/`gold_spans` (seconds) and `video` (fps, frames, duration); scans carry "
              "`finding`, `stage` (0 closed yes/no, 1 multiple choice, 2 open) and `synonyms`."), ""]
    return "\n".join(lines)


def toy_key(seed: int = 0, *, size: str | Mapping[str, int] = "default", tasks: Sequence[str] | None = None,
            shuffle_options: bool = False, resolution: int = 64, world: Mapping[str, Any] | None = None) -> str:
    """Short hash of the generation parameters (and generator version): the cache folder name."""
    names = _task_names(tasks)
    params = {"v": GENERATOR_VERSION, "seed": seed, "size": _sizes(size), "tasks": names,
              "shuffle_options": shuffle_options, "resolution": resolution}
    if options := world_config(resolution, world).options():  # the default world keeps its keys
        params["world"] = options
    if versions := task_versions(names):  # a changed task moves only the keys of the datasets that hold it
        params["task_versions"] = versions
    return hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def ensure_toy(seed: int = 0, *, size: str | Mapping[str, int] = "default", tasks: Sequence[str] | None = None,
               shuffle_options: bool = False, resolution: int = 64, world: Mapping[str, Any] | None = None,
               progress: bool = True) -> Path:
    """The toy world for these parameters under ``mmrl_common.paths.cache_dir()/toy/<hash>``, built on first use.

    Built in a temporary folder and renamed into place, so concurrent callers never see a half-written
    dataset; if another process wins the race, its copy is used.
    """
    from mmrl_common.paths import cache_dir

    root = cache_dir() / "toy"
    final = root / toy_key(seed, size=size, tasks=tasks, shuffle_options=shuffle_options, resolution=resolution,
                           world=world)
    if (final / "manifest.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        make_toy(tmp, seed, size=size, tasks=tasks, shuffle_options=shuffle_options, resolution=resolution,
                 world=world, progress=progress)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "manifest.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
