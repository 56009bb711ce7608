"""The kill-and-resume guarantee at random points (issue 46): a real ``mmrl train`` is SIGKILLed several times,
at points drawn from a seeded generator (two or more of them inside a checkpoint write: while the temporary
``.tmp-checkpoint-<step>`` folder that :func:`mmrl.engine.checkpoint.publish_checkpoint` renames exists, as soon as it
appears or between its files), and restarted each time with the same command plus ``--resume`` until it
finishes. Its final weights are bitwise those of an unbroken run with the same settings, and its metrics rows
are the unbroken run's, row for row (wall-clock and memory readings left out)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from synthetic_media import weights
from tiny_runs import TINY_RUN

MMRL = str(Path(sys.executable).with_name("mmrl"))
STEPS, SAVE_EVERY = 16, 2
# the entropy bonus makes every step move the weights, so a resume that replayed other rollouts would show
RUN = [*TINY_RUN, f"train.steps={STEPS}", f"train.save_every={SAVE_EVERY}", "train.keep_checkpoints=2",
       "grpo.entropy_coef=0.01", "train.seed=11"]
VOLATILE = ("time/", "memory/")  # wall-clock and memory readings differ between any two runs
SEED = 46  # the kill plan's generator
IN_WRITE = ("tmp-appears", "between-files")  # kills inside a checkpoint write
TIMEOUT = 120  # seconds any one wait may take before the test gives up


def command(out: Path, *extra: str) -> list[str]:
    return [MMRL, "train", "--quiet", "--out", str(out), *extra, *RUN]


def rl_steps(run: Path) -> list[int]:
    """The RL steps logged in ``run``'s metrics.jsonl (a line cut by a kill left out)."""
    path, out = run / "metrics.jsonl", []
    if not path.is_file():
        return out
    for line in path.read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("stage") == "rl":
            out.append(rec["step"])
    return out


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def steady(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def wait_for(proc: subprocess.Popen, ready, what: str, log: Path, every: float = 0.0005) -> None:
    """Poll (every ``every`` seconds) until ``ready()``; the run must not end first."""
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"no {what} after {TIMEOUT} s"
        time.sleep(every)


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL, f"the run had ended (rc {proc.returncode}) before the kill"


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_bitwise_identical(tmp_path: Path) -> None:
    env = {**os.environ, "MMRL_CACHE": str(tmp_path / "cache"), "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    rng = random.Random(SEED)
    # the unbroken run goes alongside the broken one (two cores), once it has built the tiny model and toy set
    straight_log = tmp_path / "straight.log"
    with straight_log.open("w") as f:
        unbroken = subprocess.Popen(command(straight), env=env, stdout=f, stderr=subprocess.STDOUT)
    wait_for(unbroken, lambda: (straight / "metrics.jsonl").is_file(), "the unbroken run's first step", straight_log)

    # the plan: four kills, two of them inside a checkpoint write (one of each kind), two of any kind, in an
    # order drawn; a kill meant for a checkpoint write that lands after the rename is logged and redrawn
    plan = [*IN_WRITE, *rng.choices([*IN_WRITE, "after-step"], k=2)]
    rng.shuffle(plan)
    kills: list[dict] = []
    misses = 0
    session = 0
    while plan:
        kind = plan.pop(0)
        done = rl_steps(broken)  # logged before this session (it trims what its checkpoint does not cover)
        last = max(done, default=0)
        log = tmp_path / f"broken-{session}.log"
        with log.open("w") as f:
            proc = subprocess.Popen(command(broken, *(["--resume"] if session else [])), env=env, stdout=f,
                                    stderr=subprocess.STDOUT)
        session += 1
        try:
            if kind in IN_WRITE:  # a checkpoint step this session has still to reach (no stale folder of it)
                first = last - last % SAVE_EVERY + SAVE_EVERY
                step = rng.choice(range(first, min(first + SAVE_EVERY, STEPS) + 1, SAVE_EVERY))
                tmp = broken / f".tmp-checkpoint-{step}"
                assert not tmp.exists()
                mark = tmp if kind == "tmp-appears" else tmp / "model.safetensors"
                wait_for(proc, mark.exists, f"{mark.relative_to(broken)}", log)
                kill(proc)
                landed = tmp.is_dir() and not (broken / f"checkpoint-{step}").exists()
                kills.append({"kind": kind, "step": step, "tmp_present": landed,
                              "files": sorted(p.name for p in tmp.iterdir()) if landed else None})
                if not landed:  # the write won the race: try again at a later checkpoint
                    misses += 1
                    assert misses <= 2, f"kills meant for a checkpoint write kept missing it: {kills}"
                    plan.insert(0, kind)
            else:  # a random moment after a step this session logs (in its update, its save, or the next step)
                step = rng.randint(last + 1, min(last + 2, STEPS - 3))
                delay = rng.uniform(0.0, 0.4)
                wait_for(proc, lambda s=step: s in rl_steps(broken), f"RL step {step} in metrics.jsonl", log,
                         every=0.002)
                time.sleep(delay)
                kill(proc)
                kills.append({"kind": kind, "step": step, "delay_s": round(delay, 3),
                              "tmp_present": any(broken.glob(".tmp-checkpoint-*"))})
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not (broken / "final").exists()
    log = tmp_path / f"broken-{session}.log"
    with log.open("w") as f:
        resumed = subprocess.run(command(broken, "--resume"), check=False, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 timeout=TIMEOUT)
    assert resumed.returncode == 0, log.read_text()[-3000:]
    assert "resumed from" in log.read_text()
    assert unbroken.wait(timeout=TIMEOUT) == 0, straight_log.read_text()[-3000:]
    print(f"kills: {kills}")

    # the kills happened where planned: at least four, and two or more inside a checkpoint write with its
    # temporary folder there (and its checkpoint not yet published) after the process was dead
    assert len(kills) >= 4, kills
    in_write = [k for k in kills if k["kind"] in IN_WRITE and k["tmp_present"]]
    assert len(in_write) >= 2, kills
    assert {k["kind"] for k in in_write} == set(IN_WRITE), kills
    assert all("model.safetensors" in k["files"] for k in in_write if k["kind"] == "between-files"), kills
    assert not list(broken.glob(".tmp-checkpoint-*")), "a temporary checkpoint folder outlived the run"

    # bitwise the same weights: the final model and the last checkpoint's
    for folder in ("final", f"checkpoint-{STEPS}"):
        a, b = weights(straight / folder), weights(broken / folder)
        assert set(a) == set(b), folder
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"{folder}: {len(differ)} tensors differ after the kills, e.g. {differ[:5]}"
    # the last steps changed the weights (so the comparison means something)
    a, before = weights(straight / "final"), weights(straight / f"checkpoint-{STEPS - SAVE_EVERY}")
    assert any(not torch.equal(a[k], before[k]) for k in a)

    # every metrics row, in order: the same stage and step, the same values (timing and memory left out)
    ra, rb = rows(straight), rows(broken)
    assert [(r["stage"], r["step"]) for r in ra] == [(r["stage"], r["step"]) for r in rb]
    assert [r["step"] for r in ra if r["stage"] == "rl"] == list(range(1, STEPS + 1))
    for a_row, b_row in zip(ra, rb):
        assert steady(a_row) == steady(b_row), (a_row["stage"], a_row["step"],
                                                {k for k in steady(a_row).keys() | steady(b_row).keys()
                                                 if a_row.get(k) != b_row.get(k)})
