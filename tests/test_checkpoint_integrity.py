"""A run folder nothing can corrupt (issue 46).

* A resume trims ``metrics.jsonl`` / ``rollouts.jsonl`` by writing a new file and renaming it over the old:
  a process SIGKILLed at any point of the trim leaves every row up to the checkpoint, and the next trim works.
* Each checkpoint carries ``digest.json``; a resume checks the checkpoint it starts from. A damaged one (a flipped
  bit, a cut ``trainer_state.pt``, a missing file) is named and the previous intact one used: the resumed run ends
  bitwise equal to an uninterrupted one. None intact: one clear error. A checkpoint without a digest (written
  before mmrl wrote them) still loads, saying it is not verified.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from synthetic_media import weights
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_rl  # noqa: F401  (module_cache: a fixture)

from mmrl_common.errors import MmrlError

STEPS = ["train.steps=4", "train.save_every=2", "train.keep_checkpoints=2", "grpo.entropy_coef=0.01"]

# ------------------------------------------------------------------------------------ the log trim, killed

TRIM = """
import sys, time
from pathlib import Path
from mmrl.run_log import RunLog
log = RunLog(Path(sys.argv[1]), enabled=True)
print("ready", flush=True)
t0 = time.perf_counter()
log.truncate_after("rl", int(sys.argv[2]))
print(time.perf_counter() - t0, flush=True)
"""


def _write_log(run: Path, steps: int, per_step: int) -> None:
    pad = "x" * 1500
    with (run / "rollouts.jsonl").open("w") as f:
        for step in range(1, steps + 1):
            for i in range(per_step):
                f.write(json.dumps({"stage": "rl", "step": step, "id": f"{step}-{i}", "prompt": pad}) + "\n")
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"stage": "rl", "step": step, "loss": 0.5}) + "\n")


def _ids(path: Path, upto: int) -> list[str]:
    """The ids of the rows of steps <= ``upto``, in order (every line must be whole JSON)."""
    out = []
    with path.open() as f:
        for line in f:
            rec = json.loads(line)
            if rec["step"] <= upto:
                out.append(rec["id"])
    return out


def _trim(run: Path, keep: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", TRIM, str(run), str(keep)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow
def test_a_trim_killed_at_any_point_leaves_every_row_up_to_the_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    steps, per_step, keep = 40, 1000, 30  # ~60 MB of rollouts, trimmed to step 30
    _write_log(run, steps, per_step)
    want = [f"{s}-{i}" for s in range(1, keep + 1) for i in range(per_step)]
    original = (run / "rollouts.jsonl").stat().st_size

    pristine = tmp_path / "pristine"  # the untrimmed logs, and how long one whole trim takes (on a copy)
    shutil.copytree(run, pristine)
    spare = tmp_path / "spare"
    shutil.copytree(run, spare)
    proc = _trim(spare, keep)
    seconds = float(proc.stdout.readline())
    assert proc.wait() == 0
    assert _ids(spare / "rollouts.jsonl", steps) == want
    trimmed = (spare / "rollouts.jsonl").stat().st_size

    for fraction in (0.05, 0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97):
        proc = _trim(run, keep)
        time.sleep(seconds * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        log = run / "rollouts.jsonl"
        assert log.stat().st_size in (original, trimmed), f"killed at {fraction:.0%} of the trim: a partial log"
        assert _ids(log, keep) == want, f"killed at {fraction:.0%} of the trim"
        assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()][:keep] == list(range(1, keep + 1))
        for name in ("rollouts.jsonl", "metrics.jsonl"):  # the next kill hits the untrimmed logs again
            shutil.copy(pristine / name, run / name)

    proc = _trim(run, keep)  # the next resume's trim completes
    proc.stdout.readline()
    assert proc.wait() == 0
    assert _ids(run / "rollouts.jsonl", steps) == want
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == list(range(1, keep + 1))
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "rollouts.jsonl"]  # no file left behind
