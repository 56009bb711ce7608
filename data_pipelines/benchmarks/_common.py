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


class MediaIndex:
    """Directory listings read once per folder, for finding thousands of media files by name without a
    ``stat`` per candidate spelling. Make one per benchmark read (a listing is not refreshed afterwards)."""

    def __init__(self) -> None:
        self._dirs: dict[Path, dict[tuple[str, str], list[tuple[str, bool]]]] = {}

    def _listing(self, folder: Path) -> dict[tuple[str, str], list[tuple[str, bool]]]:
        """``(stem, lower-case suffix) -> [(name, is_dir), ...]`` for the entries of ``folder``."""
        got = self._dirs.get(folder)
        if got is None:
            got = {}
            try:
                with os.scandir(folder) as it:
                    for entry in it:
                        try:
                            is_dir = entry.is_dir()
                        except OSError:
                            continue
                        stem, suffix = os.path.splitext(entry.name)
                        got.setdefault((stem, suffix.lower()), []).append((entry.name, is_dir))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                pass
            self._dirs[folder] = got
        return got

    def lookup(self, folder: Path, stem: str, suffix: str, *, allow_dir: bool = False) -> Path | None:
        """``folder/<stem><suffix>`` with the suffix in any case (the exact spelling first); a file, or a
        folder when ``allow_dir``."""
        entries = [(n, d) for n, d in self._listing(folder).get((stem, suffix.lower()), []) if allow_dir or not d]
        if not entries:
            return None
        exact = [n for n, _ in entries if n == stem + suffix]
        return folder / (exact[0] if exact else min(n for n, _ in entries))


def find_media(bases: Sequence[Path], name: str, *, allow_dir: bool = False,
               suffixes: Sequence[str] = VIDEO_SUFFIXES, index: MediaIndex | None = None,
               ) -> tuple[Path | None, Path | None]:
    """``(path, base)`` of ``name`` under the first base that has it, else ``(None, None)``.

    The extension's case does not matter (``<id>.MP4`` is found for ``<id>.mp4``), and another video
    extension is accepted (MVBench's ``.webm``/``.avi`` names point to ``.mp4`` copies in the converted
    folders); the name as given is preferred in every base before other extensions are tried. Pass one
    ``index`` for a whole benchmark so each folder is listed once."""
    index = index or MediaIndex()
    rel = Path(name)
    stem, suffix = os.path.splitext(rel.name)
    for base in bases:
        p = index.lookup((base / rel).parent, stem, suffix, allow_dir=allow_dir)
        if p is not None:
            return p, base
    for base in bases:
        for suf in suffixes:
            if suf.lower() == suffix.lower():
                continue
            p = index.lookup((base / rel).parent, stem, suf)
            if p is not None:
                return p, base
    return None, None


def expected_media_path(bases: Sequence[Path], name: str) -> Path:
    """Where a missing ``name`` was expected: under the first of ``bases`` that exists (else the first)."""
    base = next((b for b in bases if b.is_dir()), bases[0])
    return base / name


def mark_missing(meta: dict[str, Any], what: str) -> dict[str, Any]:
    """``meta`` with ``missing_media`` set to ``what`` (what was looked for, and where)."""
    meta["missing_media"] = what
    return meta


def missing_media(title: str, root: Path, samples: Sequence[Sample], expected: Sequence[str],
                  what: str = "videos") -> list[dict[str, str]]:
    """``[{"id", "path"}]`` of the samples whose media is missing (``meta["missing_media"]``), for
    ``BenchmarkData.info["missing_media"]``. When every sample's media is missing the folder is surely the
    wrong one, so that raises a :class:`LayoutError` instead."""
    missing = [{"id": s.id, "path": s.media[0].path if s.media else ""} for s in samples
               if s.meta.get("missing_media")]
    if samples and len(missing) == len(samples):
        first = next(s for s in samples if s.meta.get("missing_media")).meta["missing_media"]
        raise layout_error(title, root, f"none of the {what} of the {len(samples)} question(s) were found under "
                           f"{root} (e.g. {first}); is --data-root the {title} folder?", expected)
    return missing


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
