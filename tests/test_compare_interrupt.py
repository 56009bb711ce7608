"""``mmrl compare`` stopped (issue 46): SIGINT stops the running ``mmrl train`` child and its process group,
starts no queued run and exits 130 naming what was stopped and what was not run; a compare killed outright
(SIGKILL) takes its child with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN

REPO = Path(__file__).resolve().parents[1]


def _spec(tmp_path: Path) -> Path:
    overrides = "".join(f"\n  - {o!r}" for o in [*TINY_RUN, "train.steps=100000"])
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"arms:\n  grpo: {{task: video-qa}}\nseeds: [0, 1]\nparallel: 1\nout: {tmp_path / 'out'}\n"
                    f"overrides:{overrides}\n")
    return spec


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _trainers(pid: int) -> list[int]:
    """The ``mmrl train`` children of ``pid`` (not any helper process an import may start and end)."""
    found = []
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in argv:
            found.append(child)
    return found


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """A compare of two queued tiny runs, once its first ``mmrl train`` child has started."""
    env = {**os.environ, "MMRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    compare = subprocess.Popen([sys.executable, "-m", "mmrl", "compare", str(_spec(tmp_path)), "--quiet"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _trainers(compare.pid):
        assert compare.poll() is None, compare.communicate()
        assert time.monotonic() < deadline, "no mmrl train child started"
        time.sleep(0.1)
    child = _trainers(compare.pid)[0]
    time.sleep(1.0)  # the child is inside mmrl train's start-up
    return compare, child


def _clean_up(compare: subprocess.Popen, child: int) -> None:
    for pid in (compare.pid, child):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    compare.communicate(timeout=120)


def test_sigint_stops_the_running_child_and_starts_no_queued_run(tmp_path: Path) -> None:
    compare, child = _start(tmp_path)
    try:
        compare.send_signal(signal.SIGINT)
        try:
            _, err = compare.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("mmrl compare did not stop on SIGINT") from None
        assert compare.returncode == 130, err
        assert "stopped by SIGINT: runs stopped: grpo seed 0; runs not started: grpo seed 1" in err
        assert not _alive(child) and not _group(child)  # the trainer and anything it started
        assert (tmp_path / "out" / "grpo" / "seed-0" / "train.log").read_text().rstrip().endswith(
            "[mmrl compare] exit status -15")
        assert not (tmp_path / "out" / "grpo" / "seed-1").exists()  # the queued run never started
    finally:
        _clean_up(compare, child)


@pytest.mark.slow
def test_a_killed_compare_takes_its_child_with_it(tmp_path: Path) -> None:
    compare, child = _start(tmp_path)
    try:
        compare.kill()
        compare.wait(timeout=120)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the mmrl train child outlived its compare"
    finally:
        _clean_up(compare, child)
