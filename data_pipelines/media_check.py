"""Check that a sample's media files exist and decode (used by ``mmrl data validate``, the loaders and, before
any training, ``mmrl train`` / ``sft`` / ``eval``).

Images are fully decoded with :func:`vision.open_image`; videos are opened with
:func:`video.reader.open_video` and their first, middle and last frames decoded, which catches truncated
MP4 files whose header still reads fine. :func:`check_files` checks many files at once on a thread pool and
remembers each verdict in ``<mmrl cache>/media-check.json`` under the file's path, size and modification
time, so a second run (or a resume) re-checks only files that changed. The decoders' own messages on the
console (ffmpeg, decord) are held back while checking: the reason returned says what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mmrl_common.errors import MediaError

from .schema import MediaItem, Sample

CACHE_FILE = "media-check.json"


def check_media_file(path: str | Path, kind: str, *, decode: bool = True) -> str | None:
    """The reason ``path`` is not a usable ``kind`` ("image"/"video") file, or None when it is."""
    p = Path(path)
    if not p.exists():
        return f"{kind} file not found: {p}; check the path or pass --media-root / media_root"
    if p.is_dir():
        return f"{kind} path is a folder, not a file: {p}"
    size = p.stat().st_size
    if size == 0:
        return f"{kind} file is empty (0 bytes): {p}; re-create or re-download it"
    if not decode:
        return None
    try:
        if kind == "image":
            from vision import open_image

            img = open_image(p)
            img.load()
            if img.width == 0 or img.height == 0:
                return f"image has no pixels: {p}"
        elif kind == "video":
            from video.reader import open_video

            with open_video(p) as reader:
                n = int(reader.num_frames)
                if n <= 0:
                    return f"video has no frames: {p}; re-encode it"
                idx = sorted({0, n // 2, n - 1})
                frames = reader.get_frames(idx)
            if len(frames) != len(idx):
                return f"video decoded {len(frames)} of frames {idx}: {p}; the file looks truncated, re-encode it"
        else:
            return f"unknown media type {kind!r} for {p}"
    except MediaError as exc:
        return f"cannot decode {kind} {p}: {short_reason(exc.reason, p)}; the file may be truncated or corrupt, replace it"
    except Exception as exc:  # noqa: BLE001 -- decoders raise many types; all mean "bad file" here
        return (f"cannot decode {kind} {p}: {type(exc).__name__}: {short_reason(str(exc), p)}; the file may be truncated "
                "or corrupt, replace it")
    return None


def short_reason(reason: str, path: str | Path) -> str:
    """A decoder's reason once: without the second reader's repeat of it and without the path again
    (:func:`video.reader.open_video` reports both readers' failures, each naming the file)."""
    reason = reason.split("; decord also failed")[0]
    for quoted in (f": '{path}'", f" '{path}'", f": {path}", str(path)):
        reason = reason.replace(quoted, "")
    reason = reason.replace("[Errno 1094995529] ", "").replace(" (truncated or corrupt?)", "")
    return reason.strip(" :;") or "unreadable"


# ------------------------------------------------------------------------------------------ many files
_stderr_lock = threading.Lock()


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[Any]:
    """Hold back what native decoders (ffmpeg, decord) write to file descriptor 2; yields a text stream on
    the real stderr (for a progress bar)."""
    with _stderr_lock:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no real stderr (embedded interpreters): nothing to hold back
            yield sys.stderr
            return
        real = os.fdopen(os.dup(saved), "w", buffering=1)
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 2)
            yield real
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            real.close()


def _cache_key(path: str, kind: str, decode: bool) -> str:
    return f"{kind}:{'decode' if decode else 'exists'}:{path}"


class CheckCache:
    """Verdicts of earlier checks, valid while a file keeps its size and modification time."""

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, list[Any]] = {}
        self.changed = False
        if path is not None and path.is_file():
            try:
                self.data = json.loads(path.read_text())
            except (OSError, ValueError):
                self.data = {}

    @staticmethod
    def stamp(path: str) -> list[int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns]

    def get(self, key: str, stamp: list[int] | None) -> tuple[bool, str | None]:
        entry = self.data.get(key)
        if stamp is None or entry is None or entry[:2] != stamp:
            return False, None
        return True, entry[2]

    def put(self, key: str, stamp: list[int] | None, reason: str | None) -> None:
        if stamp is not None:  # a missing file is checked again next time (it may appear)
            self.data[key] = [*stamp, reason]
            self.changed = True

    def save(self) -> None:
        """Write the verdicts, merged with any another process added meanwhile; those of files that no longer
        exist are dropped (a deleted dataset's, a temporary folder's), so the file does not grow for ever."""
        if self.path is None or not self.changed:
            return
        merged = {**CheckCache(self.path).data, **self.data}
        kept = {k: v for k, v in merged.items() if os.path.exists(k.split(":", 2)[2])}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept))
        tmp.replace(self.path)


def default_cache_file() -> Path:
    from mmrl_common.paths import cache_dir

    return cache_dir() / CACHE_FILE


def check_files(files: Iterable[tuple[str | Path, str]], *, decode: bool = True, workers: int | None = None,
                cache_file: Path | None | bool = True, progress: bool = False, desc: str = "check media"
                ) -> dict[tuple[str, str], str | None]:
    """``{(path, kind): reason or None}`` for every ``(path, kind)``; checked on ``workers`` threads (default:
    the CPU count, 2 to 8) with the decoders' console messages held back. ``cache_file``: True for the mmrl
    cache's ``media-check.json``, a path, or None/False for no cache."""
    todo = list(dict.fromkeys((str(p), k) for p, k in files))
    cache = CheckCache(default_cache_file() if cache_file is True else (cache_file or None))
    out: dict[tuple[str, str], str | None] = {}
    stamps: dict[tuple[str, str], list[int] | None] = {}
    pending = []
    for path, kind in todo:
        stamps[(path, kind)] = stamp = CheckCache.stamp(path)
        hit, reason = cache.get(_cache_key(path, kind, decode), stamp)
        if hit:
            out[(path, kind)] = reason
        else:
            pending.append((path, kind))
    if pending:
        n = workers if workers is not None else max(2, min(8, os.cpu_count() or 2))
        with quiet_native_stderr() as console:
            from tqdm import tqdm

            bar = tqdm(total=len(pending), desc=desc, unit="file", leave=False, disable=not progress,
                       file=console)
            with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
                for key, reason in zip(pending, pool.map(lambda pk: check_media_file(pk[0], pk[1], decode=decode),
                                                         pending)):
                    out[key] = reason
                    cache.put(_cache_key(*key, decode), stamps[key], reason)
                    bar.update(1)
            bar.close()
        try:
            cache.save()
        except OSError:
            pass  # a read-only cache folder only costs a re-check next time
    return out


def check_samples_media(samples: Iterable[Sample], base_dir: str | Path | None, *, decode: bool = True,
                        cache: dict[tuple[str, str], str | None] | None = None, **kwargs: Any
                        ) -> list[list[str]]:
    """:func:`check_sample_media` for many samples, their files checked at once by :func:`check_files`
    (``kwargs``: its options); ``cache`` is filled with every verdict."""
    samples = list(samples)
    cache = {} if cache is None else cache
    files = [(item.resolve(base_dir), item.type) for s in samples for item in s.media if not item.is_remote()]
    for (path, kind), reason in check_files(files, decode=decode, **kwargs).items():
        cache[(path, f"{kind}:{decode}")] = reason
    return [check_sample_media(s, base_dir, decode=decode, cache=cache) for s in samples]


def check_sample_media(
    sample: Sample,
    base_dir: str | Path | None,
    *,
    decode: bool = True,
    cache: dict[tuple[str, str], str | None] | None = None,
) -> list[str]:
    """Reasons for each bad media item of ``sample`` (``media[i]: ...``). ``cache`` avoids re-checking a
    file several samples share."""
    reasons = []
    for i, item in enumerate(sample.media):
        if item.is_remote():
            continue
        reason = _cached(item, base_dir, decode, cache)
        if reason:
            shown = "" if Path(item.path).is_absolute() else f" (path {item.path!r})"
            reasons.append(f"media[{i}]{shown}: {reason}")
    return reasons


def _cached(item: MediaItem, base_dir: str | Path | None, decode: bool,
            cache: dict[tuple[str, str], str | None] | None) -> str | None:
    path = item.resolve(base_dir)
    key = (str(path), f"{item.type}:{decode}")
    if cache is not None and key in cache:
        return cache[key]
    reason = check_media_file(path, item.type, decode=decode)
    if cache is not None:
        cache[key] = reason
    return reason
