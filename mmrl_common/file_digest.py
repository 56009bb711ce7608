"""Content digests of files: the sha256 of each 64 MiB block, the blocks hashed in parallel threads (hashlib drops
the GIL). The checkpoints' ``digest.json`` (:mod:`mmrl.engine.checkpoint`) and the run's record of its data files
(:mod:`mmrl.run.inputs`) both hash this way."""

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
