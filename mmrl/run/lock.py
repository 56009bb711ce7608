"""One writer per run folder, and what a run folder holds.

A run (``mmrl train``, ``mmrl sft``) holds an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for its whole
life, and writes into that file who holds it (pid, host, start time, command). A second writer on the same
folder is refused with those details. The kernel releases a flock when the process holding it dies (SIGKILL,
a crash, a lost node), so a lock left by a dead process is simply taken over by the next run: there is no
pid file to judge stale. On several ranks only the process that writes the folder (rank 0) holds the lock;
:func:`acquire_on_main` has rank 0 decide and every rank learn the decision, so a refusal stops every rank.

On a network file system Linux maps ``flock`` to the server's byte-range locks (NFSv4, or NFSv3 with lockd),
so two nodes sharing the folder see each other's lock; a file system without lock support raises here,
naming the folder, rather than running unguarded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl_common.errors import MmrlError

LOCK_NAME = ".lock"


class RunFolderBusy(MmrlError):
    """Another live process holds the run folder's lock."""


@dataclass
class RunLock:
    """A held lock on ``run_dir``; :meth:`release` (or the process ending) frees it.
    ``previous``: what a holder that died without releasing it had written (None after a clean release)."""

    run_dir: Path
    fd: int | None
    info: dict[str, Any]
    previous: dict[str, Any] | None = field(default=None)

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)  # a clean release leaves no holder behind
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def _read_info(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        info = json.loads(raw.decode()) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def holder(run_dir: str | Path) -> dict[str, Any] | None:
    """What the current (or last, if it died) holder of ``run_dir``'s lock wrote: pid, host, started, command."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_info(fd)
    finally:
        os.close(fd)


def describe_holder(run_dir: str | Path, info: dict[str, Any] | None) -> str:
    """``RUN_DIR is in use by pid N on HOST since T (command ...)``; says when that pid is gone on this host
    (a child process it started still holds the lock)."""
    if not info:
        return f"{run_dir} is in use by another process (it has not written its details into {lock_path(run_dir)} yet)"
    pid, host = info.get("pid"), info.get("host")
    text = f"{run_dir} is in use by pid {pid} on {host} since {info.get('started')} (command: {info.get('command')})"
    if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        text += (f"; pid {pid} is no longer running, but a process it started still holds the lock: end that "
                 f"process (`fuser {lock_path(run_dir)}` names it)")
    return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire(run_dir: str | Path, *, command: str | None = None) -> RunLock:
    """Take ``run_dir``'s lock (creating the folder) or raise :class:`RunFolderBusy` naming its holder."""
    run_dir = Path(run_dir)
    path = lock_path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise MmrlError(f"cannot create the run folder's lock {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        info = _read_info(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunFolderBusy(f"{describe_holder(run_dir, info)}; one run folder takes one writer at a time: "
                                "wait for that run to end (or stop it), or give another --out") from None
        raise MmrlError(f"cannot lock the run folder {run_dir} ({path}: {exc.strerror or exc}); its file system "
                        "does not support file locks") from None
    previous = _read_info(fd)  # left by a holder that died without releasing the lock
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": command if command is not None else " ".join(shlex.quote(a) for a in sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    return RunLock(run_dir, fd, info, previous)


def acquire_on_main(run_dir: str | Path, w: Any, *, command: str | None = None, show: bool = True
                    ) -> RunLock | None:
    """On several ranks (``w``: :class:`mmrl.engine.distributed.World`): rank 0 takes the lock, every rank learns
    whether it did, and on a refusal every rank raises the same error (none waits for the others). The
    lock on rank 0, None on the others."""
    lock, refusal = None, None
    if w.is_main:
        try:
            lock = acquire(run_dir, command=command)
        except MmrlError as exc:
            refusal = (type(exc).__name__, str(exc))
    refusal = w.broadcast(refusal)
    if refusal is not None:
        raise (RunFolderBusy if refusal[0] == RunFolderBusy.__name__ else MmrlError)(refusal[1])
    if lock is not None and lock.previous and show:
        p = lock.previous
        print(f"{run_dir}: took over the lock left by pid {p.get('pid')} on {p.get('host')} (started "
              f"{p.get('started')}), which ended without releasing it", flush=True)
    return lock


RUN_FILES = ("config.yaml", "run_state.json", "metrics.jsonl", "summary.json", "final", "sft-model")


def run_contents(run_dir: str | Path) -> list[str]:
    """What in ``run_dir`` shows that a run was made there: its config, state, logs, models and checkpoints
    (empty when none, e.g. a new folder or one holding only unrelated files, or only what a start that
    trained nothing left: :func:`failed_start`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    ckpts = sorted((p.name for p in run_dir.glob("checkpoint-*")), key=lambda n: (len(n), n))
    if not ckpts and failed_start(run_dir):
        return []
    return found + ckpts


START_FILES = ("config.yaml", "run_state.json", "inputs.json", "metrics.jsonl")
"""What ``mmrl train`` writes before anything trains (its settings, its state, the inputs' record, the log)."""


def failed_start(run_dir: str | Path) -> list[str]:
    """The files a start that trained nothing left in ``run_dir`` (it failed while loading its data or model, or
    was stopped then): only :data:`START_FILES`, with no finished stage in ``run_state.json``, no line in
    ``metrics.jsonl``, no model, checkpoint or report. Such a folder holds no run: a corrected start goes ahead
    there (:func:`clear_failed_start`) instead of asking for ``--overwrite``. Empty when the folder holds more
    (or a file that cannot be read: then it counts as a run)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    names = {p.name for p in run_dir.iterdir()
             if p.name != LOCK_NAME and not (p.name.startswith(".") and p.name.endswith(".tmp"))}
    if not names or not names <= set(START_FILES):
        return []
    try:
        if "run_state.json" in names:
            state = json.loads((run_dir / "run_state.json").read_text())
            if not isinstance(state, dict) or state.get("stages") != {}:
                return []
        if "metrics.jsonl" in names and (run_dir / "metrics.jsonl").read_text().strip():
            return []
    except (OSError, ValueError):
        return []
    return sorted(names)


def clear_failed_start(run_dir: str | Path, *, show: bool = True) -> list[str]:
    """Remove what a start that trained nothing left (:func:`failed_start`: its settings, state and inputs'
    record, written for a run that never took a step), saying so; the names removed. The caller holds the lock."""
    left = failed_start(run_dir)
    for name in left:
        (Path(run_dir) / name).unlink(missing_ok=True)
    if left and show:
        print(f"{run_dir}: holds only what an earlier start that trained nothing left ({', '.join(left)}); "
              "starting afresh over it", flush=True)
    return left


def move_aside(run_dir: str | Path) -> Path | None:
    """Move everything in ``run_dir`` but its lock into a new sibling folder ``<name>.replaced-<time>`` (a
    rename on the same file system: instant, and nothing is lost until that folder is deleted); the folder
    moved into, or None when there was nothing to move. The caller holds the lock."""
    run_dir = Path(run_dir)
    items = [p for p in run_dir.iterdir() if p.name != LOCK_NAME] if run_dir.is_dir() else []
    if not items:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}-{n}")
    aside.mkdir(parents=True)
    for p in items:
        p.rename(aside / p.name)
    return aside
