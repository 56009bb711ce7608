"""Helpers shared by the benchmark readers: layout errors, file lookup, Parquet rows, embedded images."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipelines.schema import Sample
from mmrl_common.errors import DataError
from mmrl_common.registry import Registry

VIDEO_SUFFIXES = (".mp4", ".webm", ".avi", ".mkv", ".mov", ".m4v")


class LayoutError(DataError):
    """A benchmark folder that is missing or not laid out as the benchmark publishes it."""


@dataclass
class BenchmarkData:
    """What a reader returns: the questions as :class:`Sample` records plus facts about the copy read."""

    name: str
    root: Path
    samples: list[Sample]
    info: dict[str, Any] = field(default_factory=dict)


def layout_error(title: str, root: Path, problem: str, expected: Sequence[str]) -> LayoutError:
    lines = "\n".join(f"  {root}/{e}" if not e.startswith("(") else f"  {e}" for e in expected)
    return LayoutError(f"{title}: {problem}\nexpected layout under {root}:\n{lines}")


def check_root(title: str, root: str | os.PathLike[str], expected: Sequence[str]) -> Path:
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "folder not found"
        raise layout_error(title, root, f"--data-root {what}: {root}", expected)
    return root


def first_existing(paths: Iterable[Path]) -> Path | None:
    for p in paths:
        if p.exists():
            return p
    return None


def find_media(bases: Sequence[Path], name: str, *, allow_dir: bool = False,
               suffixes: Sequence[str] = VIDEO_SUFFIXES) -> tuple[Path | None, Path | None]:
    """``(path, base)`` of ``name`` under the first base that has it; a different video extension is
    accepted (MVBench's ``.webm``/``.avi`` names point to ``.mp4`` copies in the converted folders)."""
    for base in bases:
        p = base / name
        if p.is_file() or (allow_dir and p.is_dir()):
            return p, base
    for base in bases:
        stem = (base / name).with_suffix("")
        for suf in suffixes:
            p = stem.with_suffix(suf)
            if p.is_file():
                return p, base
    return None, None


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc


def read_parquet(paths: Sequence[Path], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of one or more Parquet files (a split sharded as ``test-0000N-of-0000M.parquet``)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in sorted(paths):
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for broken files
            raise DataError(f"{path}: cannot read Parquet ({exc})") from exc
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DataError(f"{path}: missing column(s) {missing}; found {table.column_names}")
        rows.extend(table.to_pylist())
    return rows


def save_embedded_image(value: Any, cache: Path, where: str) -> Path:
    """Write an image stored inside a Parquet row (``{"bytes": ..., "path": ...}`` as ``datasets`` saves it)
    to ``cache/<content hash><suffix>`` once, and return that file."""
    if isinstance(value, dict):
        data, name = value.get("bytes"), value.get("path") or ""
    elif isinstance(value, (bytes, bytearray)):
        data, name = bytes(value), ""
    else:
        data, name = None, ""
    if not data:
        raise DataError(f"{where}: the image column holds no image bytes")
    suffix = Path(name).suffix.lower() or ".png"
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{hashlib.sha1(data).hexdigest()[:20]}{suffix}"
    if not out.is_file():
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------- the registry
@dataclass
class BenchmarkReader:
    name: str
    fn: Callable[..., BenchmarkData]
    title: str
    kind: str  # "video_mc" | "medical" | "toy"
    splits: tuple[str, ...] = ("test",)


def _spelling(name: str) -> str:
    return name.strip().lower().replace("_", "-")


READERS: Registry[BenchmarkReader] = Registry("benchmark", duplicates="replace", normalize=_spelling)
"""Every benchmark reader by name; case, ``_`` vs ``-`` and the aliases below do not matter."""


def register_benchmark(name: str, *, title: str, kind: str, splits: tuple[str, ...] = ("test",),
                       aliases: tuple[str, ...] = ()) -> Callable:
    """Decorator registering a reader ``fn(root, *, split, media_cache, **options) -> BenchmarkData``."""
    def deco(fn: Callable[..., BenchmarkData]) -> Callable[..., BenchmarkData]:
        READERS.add(name, BenchmarkReader(name, fn, title, kind, splits), aliases=aliases)
        return fn
    return deco


def read_with(reader: BenchmarkReader, root: str | os.PathLike[str], *, split: str | None = None,
              media_cache: str | os.PathLike[str] | None = None, **options: Any) -> BenchmarkData:
    """Read ``reader``'s benchmark from ``root`` (:func:`data_pipelines.benchmarks.load_benchmark` does, by name)."""
    from mmrl_common.errors import ConfigError

    split = split or reader.splits[0]
    if split not in reader.splits:
        raise ConfigError(f"{reader.title} has no split '{split}' with answers; use one of {', '.join(reader.splits)}")
    if media_cache is None:
        from mmrl_common.paths import cache_dir

        media_cache = cache_dir() / "benchmark-images"
    return reader.fn(Path(root), split=split, media_cache=Path(media_cache), **options)
