"""The :class:`Benchmark` spec and its registry, and what the benchmark modules share: layout errors, file lookup,
Parquet rows, embedded images, option lines for prompts, toy media for fixtures."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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


# ------------------------------------------------------------------------------------ prompt pieces
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DIRECT_MC = "Answer with the option's letter from the given choices directly."
LMMS_SYSTEM = "You are a helpful assistant."
"""The system prompt of lmms-eval's ``qwen2_5_vl`` model (``lmms_eval/models/simple/qwen2_5_vl.py``)."""
_LABEL = re.compile(r"^\s*[\(\[]?([A-Z])[\)\]\.:]\s*")


def plain_options(options: Sequence[str] | None) -> list[str]:
    """Option texts without a leading ``A.``/``(A)`` label that matches their position."""
    out = []
    for i, o in enumerate(options or []):
        m = _LABEL.match(o)
        out.append(o[m.end():] if m and m.group(1) == LETTERS[i] else o)
    return out


def option_lines(options: Sequence[str], fmt: str) -> str:
    """One line per option, ``fmt`` with ``{letter}`` and ``{text}`` (e.g. ``"({letter}) {text}"``)."""
    return "\n".join(fmt.format(letter=LETTERS[i], text=o) for i, o in enumerate(options))


# ---------------------------------------------------------------------------------------------- the registry
Prompt = Callable[[Sample, "str | None"], "tuple[str | None, str, str]"]
"""``prompt(sample, subtitles) -> (system or None, user text, pre-fill)``; ``subtitles`` is the subtitle text
when ``--subtitles`` asked for lines in the prompt, else None."""
Cues = Callable[[Sample], "list[tuple[float, float, str]]"]
"""``cues(sample) -> [(start, end, text), ...]`` seconds of the sample's clip, in file order."""
SCORINGS = ("choice", "closed_open")


@dataclass(frozen=True)
class Benchmark:
    """Everything mmrl knows about one benchmark, in one place: its module builds one and calls
    :func:`register_benchmark`. Only ``name``, ``title`` and ``reader`` are required; the defaults describe a
    multiple-choice benchmark scored by plain accuracy.

    Reading: ``reader(root, *, split, media_cache, **options) -> BenchmarkData``; ``splits`` (the first is the
    default); ``aliases`` (other spellings); ``kind`` (``video_mc``, ``medical`` or ``toy``: what the samples
    hold, for people and listings).

    Protocols and prompts (read by :func:`mmrl.benchmarks.protocols.make_protocol` / ``build_prompt``):
    ``official`` — the :class:`~mmrl.benchmarks.protocols.Protocol` fields of ``--protocol official``
    (``source`` says where they come from); ``prompt`` — the official prompt (None: the training prompt, the
    ``reasoning`` template); ``fixed_protocol`` — the official settings also under ``--protocol qwen`` (the toy
    world); ``lmms_eval`` / ``lmms_prompt`` — the fields and prompt of ``--protocol lmms-eval`` (None: not
    written down for this benchmark); ``lmms_task`` / ``lmms_subtitle_task`` — lmms-eval's task names for
    ``mmrl eval --lmms-eval`` (without, with ``--subtitles``).

    Frames: ``frame_rule`` — a frame-sampling policy (``fn(num_frames, fps, /, *, start, end, nframes, ...)``,
    as :func:`video.register_policy` takes) registered under the benchmark's name, for ``official`` to name as
    its ``video_policy``.

    Subtitles: ``subtitles`` — the cues of a sample (None: ``--subtitles`` does not apply); ``subtitle_style``
    — ``lines`` (the lines shown at the sampled frames' times, in the prompt text, as Video-MME) or
    ``interleaved`` (each frame an image, the cues between them, as LongVideoBench).

    Scoring and report: ``scoring`` — ``choice`` (the option letter read from the output; named accuracy
    conventions) or ``closed_open`` (LLaVA-Med's closed and open metrics); ``breakdowns`` — the ``meta`` fields
    (or ``problem_type``) the scores are broken down by; ``headline`` — ``(metric, why)``: the figure the
    literature prints; ``beside`` — the other conventions reported next to it; ``task_mean_over`` — the
    breakdown whose per-group accuracies average to the ``task_mean`` metric (MVBench: ``task``).

    Fixture: ``fixture(out, *, n, seed, **options)`` writes a tiny copy in the public layout (returns the
    folder, or None for ``out``); ``fixture_layouts`` — the other layouts it can write (``layout=``)."""

    name: str
    title: str
    reader: Callable[..., BenchmarkData]
    splits: tuple[str, ...] = ("test",)
    aliases: tuple[str, ...] = ()
    kind: str = "video_mc"
    official: Mapping[str, Any] = field(default_factory=dict)
    prompt: Prompt | None = None
    fixed_protocol: bool = False
    lmms_eval: Mapping[str, Any] | None = None
    lmms_prompt: Prompt | None = None
    lmms_task: str | None = None
    lmms_subtitle_task: str | None = None
    frame_rule: Callable[..., list[int]] | None = None
    subtitles: Cues | None = None
    subtitle_style: str = "lines"
    scoring: str = "choice"
    breakdowns: tuple[str, ...] = ()
    headline: tuple[str, str] = ("accuracy", "every question")
    beside: tuple[str, ...] = ("accuracy_answered",)
    task_mean_over: str | None = None
    fixture: Callable[..., Path | None] | None = None
    fixture_layouts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(f"benchmark {self.name!r}: scoring must be one of {', '.join(SCORINGS)}, "
                             f"got {self.scoring!r}")
        if self.subtitle_style not in ("lines", "interleaved"):
            raise ValueError(f"benchmark {self.name!r}: subtitle_style must be 'lines' or 'interleaved', "
                             f"got {self.subtitle_style!r}")
        if not self.splits:
            raise ValueError(f"benchmark {self.name!r}: give at least one split")
        if self.task_mean_over is not None and self.task_mean_over not in self.breakdowns:
            raise ValueError(f"benchmark {self.name!r}: task_mean_over {self.task_mean_over!r} is not one of "
                             f"its breakdowns {self.breakdowns}")


def _spelling(name: str) -> str:
    return name.strip().lower().replace("_", "-")


BENCHMARKS: Registry[Benchmark] = Registry("benchmark", duplicates="replace", normalize=_spelling)
"""Every benchmark by name; case, ``_`` vs ``-`` and each benchmark's aliases do not matter."""


def register_benchmark(spec: Benchmark) -> Benchmark:
    """Register ``spec`` (a module calls this once, at import) and its frame rule; returns ``spec``."""
    if spec.frame_rule is not None:
        from video.sampling import register_policy

        register_policy(spec.name, spec.frame_rule, overwrite=True)
    BENCHMARKS.add(spec.name, spec, aliases=spec.aliases)
    return spec


def read_with(spec: Benchmark, root: str | os.PathLike[str], *, split: str | None = None,
              media_cache: str | os.PathLike[str] | None = None, **options: Any) -> BenchmarkData:
    """Read ``spec``'s benchmark from ``root`` (:func:`data_pipelines.benchmarks.load_benchmark` does, by name)."""
    from mmrl_common.errors import ConfigError

    split = split or spec.splits[0]
    if split not in spec.splits:
        raise ConfigError(f"{spec.title} has no split '{split}' with answers; use one of {', '.join(spec.splits)}")
    if media_cache is None:
        from mmrl_common.paths import cache_dir

        media_cache = cache_dir() / "benchmark-images"
    return spec.reader(Path(root), split=split, media_cache=Path(media_cache), **options)


# ------------------------------------------------------------------------------ fixtures from toy media
@contextmanager
def toy_questions(task: str, n: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """``n`` toy-world test questions of ``task`` (``color``: a video; ``scan``: an image) as their JSON records,
    each with ``file``, the absolute path of its media, sorted by id; the files live until the block ends.
    What a benchmark's ``fixture`` copies into its public layout."""
    import tempfile

    from data_pipelines.toy import make_toy

    with tempfile.TemporaryDirectory() as tmp:
        make_toy(Path(tmp), seed, size={"train": 0, "val": 0, "test": n}, tasks=[task], progress=False)
        recs = [json.loads(line) for line in (Path(tmp) / "test.jsonl").read_text().splitlines()]
        for r in recs:
            r["file"] = Path(tmp) / r["media"][0]["path"]
        yield sorted(recs, key=lambda r: r["id"])


def copy_media(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst``, making ``dst``'s folder."""
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
