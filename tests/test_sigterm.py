"""SIGTERM (what a scheduler sends before it kills a job) during ``mmrl train``: the step in flight finishes, a
checkpoint is written, the console says at which step the run stopped and how to resume, the process exits
with 143 (128 + SIGTERM), and ``--resume`` ends with the weights and metrics of a run never stopped. Under
torchrun a SIGTERM to one rank stops every rank at the same step, without a hang (issue 46)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from synthetic_media import weights
from tiny_runs import TINY_RUN

MMRL = str(Path(sys.executable).with_name("mmrl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# the entropy bonus makes every step move the weights, so a resume that replayed other rollouts would show
# (the run-health warnings are off: they look at the steps of one session, so a resumed run's differ)
RUN = [*TINY_RUN, "train.steps=6", "train.save_every=0", "grpo.entropy_coef=0.01", "train.seed=5",
       "train.health_window=0"]
VOLATILE = ("time/", "memory/")  # wall-clock and memory readings differ between any two runs


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**os.environ, "MMRL_CACHE": str(tmp_path_factory.mktemp("cache")), "TQDM_DISABLE": "1",
            "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}


def command(out: Path, *extra: str, ranks: int = 1) -> list[str]:
    args = ["train", "--quiet", "--out", str(out), *RUN, *extra]
    if ranks == 1:
        return [MMRL, *args]
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "mmrl", *args]


def rl_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


def wait_for_first_step(proc: subprocess.Popen, out: Path) -> None:
    """Until the run has logged its first RL step (the run itself ends the wait if it fails)."""
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and '"stage": "rl"' in metrics.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_checkpoints_says_how_to_resume_and_the_resume_equals_an_unbroken_run(
        env: dict[str, str], tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    done = subprocess.run(command(straight), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "stopped"
    proc = subprocess.Popen(command(out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_first_step(proc, out)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]  # 128 + SIGTERM, as a shell reports a process it ended
    said = re.search(r"stopped by SIGTERM at step (\d+) of 6; checkpoint-\1 written", stderr)
    assert said, stderr[-3000:]
    step = int(said.group(1))
    assert 1 <= step < 6  # stopped mid-run, after the step in flight
    assert f"mmrl train --out {out} --resume" in stderr
    assert (out / f"checkpoint-{step}" / "trainer_state.pt").is_file()
    assert not (out / "final").exists()
    assert [r["step"] for r in rl_rows(out)] == list(range(1, step + 1))

    resumed = subprocess.run(command(out, "--resume"), env=env, capture_output=True, text=True, timeout=600,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / f'checkpoint-{step}'} (step {step})" in resumed.stdout + resumed.stderr
    a, b = weights(straight / "final"), weights(out / "final")
    assert set(a) == set(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ after the resume, e.g. {differ[:5]}"
    at_stop = weights(out / f"checkpoint-{step}")
    assert any(not torch.equal(a[k], at_stop[k]) for k in a)  # the steps after the stop moved the weights
    one, two = rl_rows(straight), rl_rows(out)
    assert [r["step"] for r in two] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(one, two):
        same = {k: v for k, v in ra.items() if not k.startswith(VOLATILE)}
        assert same == {k: v for k, v in rb.items() if not k.startswith(VOLATILE)}, ra["step"]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "two"
    proc = subprocess.Popen(command(out, "rollout.seed_per_prompt=true", ranks=2), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_first_step(proc, out)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if "mmrl" in " ".join(p.cmdline())]
        assert len(ranks) == 2
        ranks[-1].send_signal(signal.SIGTERM)  # one rank only: the other learns of it at the step boundary
        _, stderr = proc.communicate(timeout=300)  # no rank waits forever in a collective
    finally:
        if proc.poll() is None:
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                p.kill()
            proc.wait()
    assert proc.returncode != 0
    said = re.search(r"stopped by SIGTERM at step (\d+) of 6; checkpoint-\1 written", stderr)
    assert said, stderr[-4000:]  # rank 0's words, though the signal went to rank 1
    step = int(said.group(1))
    ckpt = out / f"checkpoint-{step}"
    assert (ckpt / "trainer_state.pt").is_file()
    assert {p.name for p in ckpt.glob("rng_state_rank*.pt")} == {"rng_state_rank0.pt", "rng_state_rank1.pt"}
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [ckpt.name]
    assert [r["step"] for r in rl_rows(out)] == list(range(1, step + 1))
