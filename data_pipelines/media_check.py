"""Check that a sample's media files exist and decode (used by ``mmrl data validate``, the loaders and, before
any training, ``mmrl train`` / ``sft`` / ``eval``).

Images are fully decoded with :func:`vision.open_image`; videos are opened with
:func:`video.reader.open_video` and their first, middle and last frames decoded, which catches truncated
MP4 files whose header still reads fine. What would stop a run when a record is drawn is refused here too: a
shape past the 200:1 aspect ratio Qwen-VL's resize takes, and a record's sampling that takes no frames of its
video (a window after the video's end or under 2 frames, more frames than it has, a one-frame video:
:func:`video.sampling.sampling_problem`, checked against the frame count and rate each verdict keeps). :func:`check_files` checks many files at once on a thread pool and
remembers each verdict in ``<mmrl cache>/media-check.json`` under the file's path and a digest of its content
(:func:`content_stamp`), so a second run (or a resume) re-checks only files whose bytes changed; a file
overwritten with other bytes of the same size, its modification time put back, is checked again. The decoders' own messages on the
console (ffmpeg, decord) are held back while checking: the reason returned says what is wrong.

In a distributed run (:func:`spread_checks`, which ``mmrl train`` sets up through
``mmrl.engine.distributed.World.spread_media_checks``) the processes share the work out: the files that any
process's cache has no verdict for are split among all of them, each checks its share, and the verdicts are
gathered, so that a large video set is checked by every GPU's process, on every node, at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl_common.errors import ConfigError, DataError, MediaError
from video.decoders import DEFAULT_DECODE_TIMEOUT

from .schema import MediaItem, Sample, check_media_item, guess_media_type

CACHE_FILE = "media-check.json"


def check_media_file(path: str | Path, kind: str, *, decode: bool = True, decoder: str = "auto",
                     decode_timeout: float | None = DEFAULT_DECODE_TIMEOUT) -> str | None:
    """The reason ``path`` is not a usable ``kind`` ("image"/"video") file, or None when it is. A video is decoded
    with ``decoder`` (``data.media.decoder``), each call into it bounded by ``decode_timeout`` seconds
    (``data.media.decode_timeout``)."""
    return probe_media_file(path, kind, decode=decode, decoder=decoder, decode_timeout=decode_timeout)[0]


def probe_media_file(path: str | Path, kind: str, *, decode: bool = True, decoder: str = "auto",
                     decode_timeout: float | None = DEFAULT_DECODE_TIMEOUT
                     ) -> tuple[str | None, dict[str, Any] | None]:
    """:func:`check_media_file`'s reason, and what decoding a good file found: ``{"width", "height"}`` and, of a
    video, ``{"frames", "fps"}`` (None for bad files and unopened ones), against which a record's sampling window
    is checked."""
    facts: dict[str, Any] = {}
    reason = _check_file(Path(path), kind, decode, facts, decoder, decode_timeout)
    return reason, (facts or None) if reason is None else None


def _check_file(p: Path, kind: str, decode: bool, facts: dict[str, Any], decoder: str = "auto",
                decode_timeout: float | None = DEFAULT_DECODE_TIMEOUT) -> str | None:
    try:
        os.stat(p)
    except FileNotFoundError:
        return (f"{kind} file not found: {p}; check the path, or the folder it is relative to (--media-root in "
                "mmrl data, data.media_root=DIR in mmrl train / eval)")
    except OSError as exc:  # a symlink loop, no permission on a folder, a name too long: said as it is
        cause = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or type(exc).__name__)
        return f"cannot open {kind} file {p}: {cause}; fix the path or the link"
    if p.is_dir():
        return f"{kind} path is a folder, not a file: {p}"
    size = p.stat().st_size
    if size == 0:
        return f"{kind} file is empty (0 bytes): {p}; re-create or re-download it"
    if not decode:
        if kind == "video":  # even unopened, an image named .mp4 is no video (its first bytes say so)
            from video.reader import image_format_of

            try:
                with open(p, "rb") as fh:
                    found = image_format_of(fh.read(16))
            except OSError as exc:
                return f"cannot read video file {p}: {exc.strerror or exc}"
            if found:
                return f"video {p}: is a {found} image, not a video; give it as an image item, or replace it"
        return None
    try:
        if kind == "image":
            from vision import open_image

            img = open_image(p)
            img.load()
            if img.width == 0 or img.height == 0:
                return f"image has no pixels: {p}"
            facts.update(width=img.width, height=img.height)
        elif kind == "video":
            from video.reader import open_video

            with open_video(p, backend=decoder, timeout=decode_timeout) as reader:  # type: ignore[arg-type]
                n = int(reader.num_frames)
                if n <= 0:
                    return f"video has no frames: {p}; re-encode it"
                idx = sorted({0, n // 2, n - 1})
                frames = reader.get_frames(idx)
                facts.update(frames=n, fps=float(reader.fps), width=int(reader.width), height=int(reader.height))
            if len(frames) != len(idx):
                return f"video decoded {len(frames)} of frames {idx}: {p}; the file looks truncated, re-encode it"
        else:
            return f"unknown media type {kind!r} for {p}"
    except ConfigError:  # a decoder that cannot run here (torchcodec without FFmpeg): the setup, not the file
        raise
    except MediaError as exc:
        reason = short_reason(exc.reason, p)
        if kind == "image" and guess_media_type(str(p)) == "video":
            return f"image {p}: is a {p.suffix} video file, not an image; give it as a video item (type: video)"
        if any(what in reason for what in _NOT_CORRUPTION):  # the file is what it is: no "may be truncated"
            return f"{kind} {p}: {reason}"
        return f"cannot decode {kind} {p}: {reason}; the file may be truncated or corrupt, replace it"
    except Exception as exc:  # noqa: BLE001 -- decoders raise many types; all mean "bad file" here
        return (f"cannot decode {kind} {p}: {type(exc).__name__}: {short_reason(str(exc), p)}; the file may be truncated "
                "or corrupt, replace it")
    return _shape_problem(p, kind, facts)


def _shape_problem(p: Path, kind: str, facts: dict[str, Any]) -> str | None:
    """Why a decoded image or video's frames cannot be resized for the model (an aspect ratio past the 200:1
    Qwen-VL's resize rule takes, which would stop a run when the record is drawn); None when they can."""
    from qwen_vl_utils.vision_process import MAX_RATIO

    w, h = facts.get("width"), facts.get("height")
    if not w or not h or max(w, h) / min(w, h) <= MAX_RATIO:
        return None
    facts.clear()
    what = "its frames are" if kind == "video" else "it is"
    return (f"{kind} {p}: {what} {w}x{h} pixels, an aspect ratio of {max(w, h) / min(w, h):.0f}:1, past the "
            f"{MAX_RATIO}:1 Qwen-VL's resize takes; crop or pad it")


_NOT_CORRUPTION = ("not a video", "too large to decode", "decoding took longer than", "cannot open the video file", "cannot open the image file",
                   "cannot read the image file")
"""Reasons of a decoder's MediaError that say what the file is (an image named .mp4, a decompression bomb, a
symlink loop, no permission) rather than that it is damaged."""


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


def _cache_key(path: str, kind: str, decode: bool, decoder: str = "auto") -> str:
    how = "exists" if not decode else "decode" if decoder == "auto" or kind != "video" else f"decode-{decoder}"
    return f"{kind}:{how}:{path}"  # a verdict is the decoder's: auto's key as before the setting existed


def _lasting(reason: str | None) -> bool:
    """Whether a verdict holds for the file's content whatever the machine's load: not a decode past its timeout
    (video.reader.within's words)."""
    return reason is None or "(data.media.decode_timeout)" not in reason


DIGEST_WINDOW = 64 * 1024
"""Bytes :func:`content_stamp` reads at each of a file's start, middle and end."""


def content_stamp(path: str | Path) -> list[Any] | None:
    """``[size, digest]`` of a file's content, None when it cannot be read. The digest is a 128-bit BLAKE2b of
    the size and of the whole file when it is at most three :data:`DIGEST_WINDOW` (64 KiB) long, else of
    the first, middle and last 64 KiB. Chosen so that a cached verdict costs three small reads per file
    whatever its size (hashing every byte would read a whole video set again on every run, as long as
    checking it), while a file replaced by other bytes of the same size is seen: a container's
    header (MP4 ``ftyp``/``moov``, an image's header) is at its start or end, and the middle window catches
    the middle frame's data. A change confined to bytes outside the three windows that keeps the size is not
    seen: run ``mmrl data validate`` with ``MMRL_CACHE`` pointed at an empty folder (or delete
    ``media-check.json``) to re-check every file after such an edit."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            h = hashlib.blake2b(str(size).encode(), digest_size=16)
            if size <= 3 * DIGEST_WINDOW:
                h.update(fh.read())
            else:
                for offset in (0, size // 2 - DIGEST_WINDOW // 2, size - DIGEST_WINDOW):
                    fh.seek(offset)
                    h.update(fh.read(DIGEST_WINDOW))
    except OSError:
        return None
    return [size, h.hexdigest()]


class CheckCache:
    """Verdicts of earlier checks, valid while a file keeps its content (:func:`content_stamp`). Entries
    written by earlier versions (keyed on size and modification time) never match and are checked again."""

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
    def stamp(path: str) -> list[Any] | None:
        """The file's ``[size, content digest]`` (:func:`content_stamp`); None when it cannot be read."""
        return content_stamp(path)

    def get(self, key: str, stamp: list[Any] | None) -> tuple[bool, str | None, dict[str, Any] | None]:
        """``(hit, reason, facts)``; a good decoded file's verdict without its facts (written by an earlier
        version) is no hit: it is checked again once (its frame count, rate and size; a shape the model cannot
        take was not checked then)."""
        entry = self.data.get(key)
        if stamp is None or entry is None or entry[:2] != stamp:
            return False, None, None
        facts = entry[3] if len(entry) > 3 else None
        if facts is None and entry[2] is None and key.startswith(("video:decode:", "image:decode:")):
            return False, None, None
        return True, entry[2], facts

    def put(self, key: str, stamp: list[Any] | None, reason: str | None, facts: dict[str, Any] | None = None) -> None:
        if stamp is not None:  # a missing file is checked again next time (it may appear)
            self.data[key] = [*stamp, reason] if facts is None else [*stamp, reason, facts]
            self.changed = True

    def save(self) -> None:
        """Write the verdicts, merged with any another process added meanwhile; those of files that no longer
        exist are dropped (a deleted dataset's, a temporary folder's), so the file does not grow for ever."""
        if self.path is None or not self.changed:
            return
        merged = {**CheckCache(self.path).data, **self.data}
        kept = {k: v for k, v in merged.items() if os.path.exists(k.split(":", 2)[2])}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # a shared cache:
        # another machine's process may have this pid
        tmp.write_text(json.dumps(kept))
        tmp.replace(self.path)


def default_cache_file() -> Path:
    from mmrl_common.paths import cache_dir

    return cache_dir() / CACHE_FILE


@dataclass(frozen=True)
class Spread:
    """How :func:`check_files` shares its work among the processes of a distributed run: ``gather(obj)``
    returns every process's ``obj`` in process order, on every process (a collective: every process calls
    it); ``rank`` / ``size``: this process's place; ``save``: this process writes the verdicts into its
    cache file (one process per machine, whose cache it is); ``local_size``: processes on this machine
    (their checking threads share its cores)."""

    gather: Callable[[Any], list[Any]]
    rank: int
    size: int
    save: bool = True
    local_size: int = 1


LAST_CHECK: dict[str, int] = {}
"""What this process's last :func:`check_files` call did: ``files``; ``cached_here`` (verdicts its cache
had); ``checked`` (files checked by all processes); ``checked_here`` (by this one); ``processes``."""

_SPREAD: contextvars.ContextVar[Spread | None] = contextvars.ContextVar("mmrl_media_check_spread", default=None)


@contextlib.contextmanager
def spread_checks(spread: Spread) -> Iterator[None]:
    """Inside the block, :func:`check_files` shares its work out as ``spread`` says. Every process must make
    the same calls (the same data, in the same order), as the ranks of a run loading their data do."""
    token = _SPREAD.set(spread)
    try:
        yield
    finally:
        _SPREAD.reset(token)


def check_files(files: Iterable[tuple[str | Path, str]], *, decode: bool = True, workers: int | None = None,
                cache_file: Path | None | bool = True, progress: bool = False, desc: str = "check media",
                facts: dict[tuple[str, str], dict[str, Any] | None] | None = None, decoder: str = "auto",
                decode_timeout: float | None = DEFAULT_DECODE_TIMEOUT) -> dict[tuple[str, str], str | None]:
    """``{(path, kind): reason or None}`` for every ``(path, kind)``; checked on ``workers`` threads (default:
    the CPU count, 2 to 8, divided among the processes on this machine when the check is spread) with the
    decoders' console messages held back. ``cache_file``: True for the mmrl cache's ``media-check.json``, a
    path, or None/False for no cache. Inside :func:`spread_checks` the files are shared out among the
    processes, which must all pass the same files (the same kinds and sizes in the same order; the paths may
    differ, as a toy world in each machine's own cache does): a difference raises :class:`DataError` on
    every process. ``facts``, when given, is filled with what :func:`probe_media_file` found of each file.
    Videos are decoded with ``decoder`` within ``decode_timeout`` seconds a call (:func:`check_media_file`); a
    video's verdict is cached per decoder, and a decode past the timeout is not cached (it may pass another time).
    """
    todo = list(dict.fromkeys((str(p), k) for p, k in files))
    cache = CheckCache(default_cache_file() if cache_file is True else (cache_file or None))
    out: dict[tuple[str, str], str | None] = {}
    stamps: dict[tuple[str, str], list[Any] | None] = {}
    pending: list[int] = []  # indices into todo
    for i, (path, kind) in enumerate(todo):
        stamps[(path, kind)] = stamp = CheckCache.stamp(path)
        hit, reason, found = cache.get(_cache_key(path, kind, decode, decoder), stamp)
        if hit:
            out[(path, kind)] = reason
            if facts is not None:
                facts[(path, kind)] = found
        else:
            pending.append(i)
    spread = _SPREAD.get()
    if spread is not None and spread.size > 1:
        mine = _spread_pending(spread, todo, stamps, pending)
        share = max(1, spread.local_size)
    else:
        mine, share = pending, 1
    verdicts: dict[int, tuple[str | None, dict[str, Any] | None]] = {}
    if mine:
        n = workers if workers is not None else max(2, min(8, os.cpu_count() or 2)) // share or 1
        with quiet_native_stderr() as console:
            from tqdm import tqdm

            bar = tqdm(total=len(mine), desc=desc, unit="file", leave=False, disable=not progress, file=console)
            with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
                for i, verdict in zip(mine, pool.map(lambda i: probe_media_file(
                        *todo[i], decode=decode, decoder=decoder, decode_timeout=decode_timeout), mine)):
                    verdicts[i] = verdict
                    bar.update(1)
            bar.close()
    if spread is not None and spread.size > 1:
        for part in spread.gather(sorted(verdicts.items())):
            verdicts.update(part)
    for i, (reason, found) in verdicts.items():
        key = todo[i]
        out[key] = reason
        if facts is not None:
            facts[key] = found
        if _lasting(reason):
            cache.put(_cache_key(*key, decode, decoder), stamps[key], reason, found)
    if verdicts and (spread is None or spread.save):
        try:
            cache.save()
        except OSError:
            pass  # a read-only cache folder only costs a re-check next time
    if verdicts and spread is not None and spread.size > 1:
        spread.gather(None)  # the caches written before any process reads them again (its next check)
    LAST_CHECK.clear()
    LAST_CHECK.update(files=len(todo), cached_here=len(todo) - len(pending), checked=len(verdicts),
                      checked_here=len(mine), processes=spread.size if spread is not None else 1)
    return out


def _spread_pending(spread: Spread, todo: list[tuple[str, str]], stamps: dict[tuple[str, str], list[Any] | None],
                    pending: list[int]) -> list[int]:
    """This process's share of the files that some process has no cached verdict for (one collective).
    Every process must see the same files: a different list (a file missing on one machine, another size)
    raises the same DataError on all of them."""
    digest = hashlib.sha256(json.dumps([[k, (stamps[(p, k)] or [None])[0]] for p, k in todo]).encode()).hexdigest()
    missing = bytearray((len(todo) + 7) // 8)
    for i in pending:
        missing[i >> 3] |= 1 << (i & 7)
    views = spread.gather((digest, len(todo), bytes(missing)))
    if any(v[0] != views[0][0] for v in views):
        odd = next(r for r, v in enumerate(views) if v[0] != views[0][0])
        detail = _first_difference(spread, todo, stamps, odd)
        raise DataError(f"media check: process {odd} sees other media files than process 0 ({detail}); every "
                        "machine of a run must see the same data (put it on storage every machine shares)")
    union = bytearray(len(views[0][2]))
    for _, _, bits in views:
        for j, b in enumerate(bits):
            union[j] |= b
    todo_missing = [i for i in range(len(todo)) if union[i >> 3] >> (i & 7) & 1]
    return todo_missing[spread.rank::spread.size]  # strided: a folder's large files spread over everyone


def _first_difference(spread: Spread, todo: list[tuple[str, str]], stamps: dict[tuple[str, str], list[Any] | None],
                      odd: int) -> str:
    """Where process ``odd``'s files first differ from process 0's (a second collective, on the error path)."""
    views = spread.gather([(p, k, (stamps[(p, k)] or [None])[0]) for p, k in todo])
    a, b = views[0], views[odd]
    if len(a) != len(b):
        return f"{len(b)} files there, {len(a)} on process 0"
    for (p0, _, s0), (p1, _, s1) in zip(a, b):
        if s0 != s1:
            def say(s: int | None) -> str:
                return "missing" if s is None else f"{s} bytes"
            return f"{p1}: {say(s1)} there, {p0}: {say(s0)} on process 0"
    return "the kinds of the files differ"


def check_samples_media(samples: Iterable[Sample], base_dir: str | Path | None, *, decode: bool = True,
                        cache: dict[tuple[str, str], str | None] | None = None, **kwargs: Any
                        ) -> list[list[str]]:
    """:func:`check_sample_media` for many samples, their files checked at once by :func:`check_files`
    (``kwargs``: its options); ``cache`` is filled with every verdict."""
    samples = list(samples)
    cache = {} if cache is None else cache
    files = [(item.resolve(base_dir), item.type) for s in samples for item in s.media if _checkable(item)]
    found: dict[tuple[str, str], dict[str, Any] | None] = {}
    for (path, kind), reason in check_files(files, decode=decode, facts=found, **kwargs).items():
        cache[(path, f"{kind}:{decode}")] = reason
    facts = {path: f for (path, kind), f in found.items() if f and kind == "video"}
    return [check_sample_media(s, base_dir, decode=decode, cache=cache, facts=facts) for s in samples]


def check_sample_media(
    sample: Sample,
    base_dir: str | Path | None,
    *,
    decode: bool = True,
    cache: dict[tuple[str, str], str | None] | None = None,
    facts: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """Reasons for each bad media item of ``sample`` (``media[i]: ...``): a file missing or not decoding as its
    type, or (with ``decode``) a video whose record's sampling takes none of its frames (a window past its end,
    more frames than it has: :func:`video.sampling.sampling_problem`). ``cache`` avoids re-checking a file
    several samples share; ``facts``: what decoding found of each video (``{path: {"frames", "fps"}}``)."""
    reasons = []
    for i, item in enumerate(sample.media):
        if not _checkable(item):
            continue
        reason = _cached(item, base_dir, decode, cache)
        if reason is None and decode and item.type == "video":
            reason = _window_problem(item, base_dir, facts)
        if reason:
            shown = "" if Path(item.path).is_absolute() else f" (path {item.path!r})"
            reasons.append(f"media[{i}]{shown}: {reason}")
    return reasons


def _checkable(item: MediaItem) -> bool:
    """A local file of a known type (a URL or another type is the schema's problem: said once, there)."""
    return bool(item.path) and not item.is_remote() and item.type in ("image", "video")


def _window_problem(item: MediaItem, base_dir: str | Path | None, facts: dict[str, dict[str, Any]] | None
                    ) -> str | None:
    """Why ``item``'s sampling (or none: the default rule) takes no frames of its (good) video, naming the file;
    None when it takes some, or its settings are already wrong as written (the schema says so)."""
    if check_media_item(item):
        return None
    path = item.resolve(base_dir)
    found = (facts or {}).get(str(path))
    if found is None:
        found = probe_media_file(path, "video")[1]
        if found is None:
            return None
        if facts is not None:
            facts[str(path)] = found
    from video.sampling import sampling_problem

    why = sampling_problem(int(found["frames"]), float(found["fps"]), item.sampling)
    return None if why is None else f"video {path}: {why}"


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
