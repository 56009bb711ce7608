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
from mmrl.engine.run_log import RunLog
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
    assert proc.wait(timeout=300) == 0
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
    assert proc.wait(timeout=300) == 0
    assert _ids(run / "rollouts.jsonl", steps) == want
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == list(range(1, keep + 1))
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "rollouts.jsonl"]  # no file left behind


# ------------------------------------------------------------------------------------ checkpoints verified


@pytest.fixture(scope="module")
def straight(module_cache, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """An uninterrupted run of 4 steps, checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("straight")
    run_rl(root, *STEPS)
    return root / "run"


def _resume(straight: Path, tmp_path: Path, damage) -> Path:
    """A copy of ``straight`` as a run killed after its last checkpoint left it, damaged by ``damage(run)``,
    then resumed."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "final")
    state = json.loads((run / "run_state.json").read_text())
    state["stages"].pop("rl", None)
    (run / "run_state.json").write_text(json.dumps(state))
    damage(run)
    train(load_run_config("video-qa", overrides=[*TINY_RUN, *STEPS]), run_dir=run, resume=True, show_progress=False)
    return run


def _flip(path: Path, offset: int, n: int = 64) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def _same_end(straight: Path, run: Path) -> None:
    """The resumed run ends as the uninterrupted one: final weights bitwise, each RL step logged once."""
    a, b = weights(straight / "final"), weights(run / "final")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3, 4]
    assert [r["loss"] for r in rl_rows(run)] == [r["loss"] for r in rl_rows(straight)]


@pytest.mark.slow
def test_flipped_bits_in_the_latest_weights_fall_back_to_the_previous_checkpoint(
        straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    size = (straight / "checkpoint-4" / "model.safetensors").stat().st_size
    run = _resume(straight, tmp_path, lambda run: _flip(run / "checkpoint-4" / "model.safetensors", size // 2))
    out = capsys.readouterr().out
    assert "checkpoint-4: model.safetensors does not match its digest (sha256 of bytes 0-" in out
    assert "checkpoint-2 is intact: resuming from it" in out
    assert "resumed from" in out and "(step 2)" in out
    _same_end(straight, run)
    from mmrl.engine.checkpoint import check_digest

    for ckpt in (straight / "checkpoint-2", straight / "checkpoint-4", run / "checkpoint-4"):
        assert check_digest(ckpt) is None  # the resumed run wrote checkpoint-4 again, whole


@pytest.mark.slow
def test_a_truncated_trainer_state_falls_back_to_the_previous_checkpoint(
        straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def cut(run: Path) -> None:
        state = run / "checkpoint-4" / "trainer_state.pt"
        os.truncate(state, state.stat().st_size // 2)

    run = _resume(straight, tmp_path, cut)
    out = capsys.readouterr().out
    size = (straight / "checkpoint-4" / "trainer_state.pt").stat().st_size
    assert f"checkpoint-4: trainer_state.pt does not match its digest (size {size // 2} != {size})" in out
    assert "checkpoint-2 is intact: resuming from it" in out
    _same_end(straight, run)


@pytest.mark.slow
def test_no_intact_checkpoint_is_one_clear_error(straight: Path, tmp_path: Path) -> None:
    def ruin(run: Path) -> None:
        (run / "checkpoint-4" / "trainer_state.pt").unlink()
        _flip(run / "checkpoint-2" / "model.safetensors", 4096, 1)

    with pytest.raises(MmrlError) as err:
        _resume(straight, tmp_path, ruin)
    message = str(err.value)
    assert "no intact checkpoint to resume from" in message and "\n" not in message
    assert "checkpoint-4: trainer_state.pt is missing" in message
    assert "checkpoint-2: model.safetensors does not match its digest" in message


@pytest.mark.slow
def test_a_checkpoint_written_without_a_digest_still_loads(straight: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    def old(run: Path) -> None:
        for ckpt in ("checkpoint-2", "checkpoint-4"):
            (run / ckpt / "digest.json").unlink(missing_ok=True)
        shutil.rmtree(run / "checkpoint-4")  # resume from step 2, so steps 3 and 4 run again

    run = _resume(straight, tmp_path, old)
    out = capsys.readouterr().out
    assert out.count("checkpoint-2: no digest: not verified") == 1
    _same_end(straight, run)


def test_a_trainer_state_of_pickled_objects_is_refused_as_such_not_as_a_cut_write(tmp_path: Path) -> None:
    """A ``trainer_state.pt`` holding Python objects (not written by mmrl: replaced or planted) is refused for what
    it is, and an empty one is still a damaged checkpoint."""
    import argparse

    import torch

    from mmrl.engine.checkpoint import load_trainer_state
    from mmrl_common.errors import MmrlError

    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    torch.save({"step": 3, "args": argparse.Namespace(lr=1.0)}, ckpt / "trainer_state.pt")
    with pytest.raises(MmrlError) as err:
        load_trainer_state(ckpt)
    text = str(err.value)
    assert "holds pickled Python objects" in text and "Namespace" in text and "cut short" not in text
    assert "\n" not in text and "checkpoint-3" in text
    (ckpt / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(MmrlError, match="is empty.*a write cut short"):
        load_trainer_state(ckpt)
    torch.save({"step": 3, "lr": torch.tensor([1.0])}, ckpt / "trainer_state.pt")
    assert load_trainer_state(ckpt)["step"] == 3
