"""Content digests of files: the sha256 of each 64 MiB block, the blocks hashed in parallel threads (hashlib drops
the GIL). The checkpoints' ``digest.json`` (:mod:`mmrl.engine.checkpoint`) and the run's record of its data files
(:mod:`mmrl.run.inputs`) both hash this way. Also: a small file written whole or not at all (:func:`write_atomic`),
and why a write failed for lack of room (:func:`no_room`: the file-size limit, a full disk, a quota)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DIGEST_BLOCK = 64 << 20  # each file is hashed in blocks of this size, the blocks in parallel threads


def block_hashes(path: Path, size: int, pool: Any) -> list[str]:
    """The sha256 of each ``DIGEST_BLOCK`` of the file (``pool``: a thread pool that hashes the blocks)."""
    import hashlib

    fd = os.open(path, os.O_RDONLY)
    try:
        def block(offset: int) -> str:
            h, end = hashlib.sha256(), min(offset + DIGEST_BLOCK, size)
            while offset < end:
                chunk = os.pread(fd, min(8 << 20, end - offset), offset)
                if not chunk:
                    break  # the file is shorter than its size said (cut meanwhile): the digest will not match
                h.update(chunk)
                offset += len(chunk)
            return h.hexdigest()

        return list(pool.map(block, range(0, size, DIGEST_BLOCK))) if size else [hashlib.sha256().hexdigest()]
    finally:
        os.close(fd)


def hash_threads() -> int:
    """Threads for hashing: the cores this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


# ------------------------------------------------------------------------------------ writing files whole
def write_atomic(path: Path, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, then renamed over it (a
    process killed while writing leaves the old file). A write that fails (a full disk, the file-size limit)
    raises :class:`mmrl_common.errors.MmrlError` naming ``path`` and why, the old file kept."""
    from mmrl_common.errors import MmrlError

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise MmrlError(f"{path}: cannot be written: {no_room(exc, tmp) or exc.strerror or exc}; the file is as it "
                        "was before") from None


NO_ROOM = {27: "the file-size limit was reached (ulimit -f; raise it, e.g. `ulimit -f unlimited`)",  # EFBIG
           28: "the disk is full (free some space)",  # ENOSPC
           122: "the disk quota is used up (free some space or raise the quota)"}  # EDQUOT
_NO_ROOM_WORDS = {27: ("file too large", "os error 27"), 28: ("no space left", "os error 28"),
                  122: ("quota exceeded", "os error 122")}


def no_room(exc: BaseException, file: Path | None = None) -> str | None:
    """Why a write failed for lack of room, in words with the fix (the file-size limit, a full disk, a used-up
    quota), or None for any other failure. Read from the error (its errno, or the words of one a library raised
    in its own type: safetensors, torch), its causes, and else from the file being written: at the size limit
    (``RLIMIT_FSIZE``), or on a disk with under 1 MiB free."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return NO_ROOM[e.errno]
        text = str(e).lower()
        for code, words in _NO_ROOM_WORDS.items():
            if any(w in text for w in words):
                return NO_ROOM[code]
        e = e.__cause__ or e.__context__
    if file is None:
        return None
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and Path(file).is_file() and Path(file).stat().st_size >= limit - (64 << 10):
            return NO_ROOM[27]
    except (ImportError, OSError, ValueError):
        pass
    try:
        import shutil

        folder = Path(file) if Path(file).is_dir() else Path(file).parent
        if folder.exists() and shutil.disk_usage(folder).free < (1 << 20):
            return NO_ROOM[28]
    except OSError:
        pass
    return None


def newest_file(folder: Path) -> Path | None:
    """The file of ``folder`` (and its sub-folders) written last: the one a write that failed was writing."""
    best: tuple[int, Path] | None = None
    try:
        for p in Path(folder).rglob("*"):
            if p.is_file() and not p.is_symlink():
                t = p.stat().st_mtime_ns
                if best is None or t >= best[0]:
                    best = (t, p)
    except OSError:
        return None
    return best[1] if best else None
