"""A run folder nothing can corrupt (issue 46): one writer at a time (a lock held for the whole run, taken over
once its holder dies; on several ranks rank 0 decides and every rank stops on a refusal), no silent resume into
an existing ``--out`` (``--resume`` or ``--overwrite``), no silent change of settings on ``--resume``
(``--force-settings``), ``config.yaml`` untouched by a refused resume, and "no checkpoint found" when the
checkpoints of a run are gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiny_runs
import yaml
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)

from mmrl_common.errors import MmrlError

ROOT = Path(__file__).resolve().parent.parent
RUN = [*TINY_RUN, "train.steps=3", "train.save_every=1"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (checkpoints and the lock left out) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock" and not p.relative_to(folder).parts[0].startswith("checkpoint-")}


@pytest.fixture(scope="module")
def made(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    """``stopped``: a 3-step run that crashed in step 2 (checkpoint-1 written, no stage finished); ``finished``:
    the same run to its end."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    root = tmp_path_factory.mktemp("made")
    tiny_runs.STOP_AT[:] = [2]
    try:
        with pytest.raises(tiny_runs.StopRun):
            train(load_run_config("video-qa", overrides=[*RUN, "plugins={test-stop-at: {}}"]),
                  run_dir=root / "stopped", show_progress=False)
    finally:
        tiny_runs.STOP_AT[:] = []
    assert (root / "stopped" / "checkpoint-1").is_dir() and not (root / "stopped" / "checkpoint-2").exists()
    train(load_run_config("video-qa", overrides=RUN), run_dir=root / "finished", show_progress=False)
    return {"stopped": root / "stopped", "finished": root / "finished"}


def copy(made: dict[str, Path], which: str, tmp_path: Path) -> Path:
    run = tmp_path / which
    shutil.copytree(made[which], run)
    return run


# ------------------------------------------------------------------------------------------- one writer

HOLDER = textwrap.dedent("""
    import sys, time
    from mmrl.run import lock as run_lock
    lock = run_lock.acquire(sys.argv[1], command="the-holder --out " + sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin or kills it
    lock.release()
""")


def hold(run: Path) -> subprocess.Popen:
    """Another live process holding ``run``'s lock through :mod:`mmrl.run.lock`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(
        tmp_path: Path, module_cache: None, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    from mmrl.config import load_run_config
    from mmrl.run import train
    from mmrl.run.lock import RunFolderBusy, holder

    run = tmp_path / "run"
    proc = hold(run)
    try:
        expected = f"{run} is in use by pid {proc.pid} on {socket.gethostname()} since "
        rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), *RUN)
        assert rc == 2 and expected in err and f"(command: the-holder --out {run})" in err
        with pytest.raises(RunFolderBusy, match="is in use by pid"):  # the API alike, resume or not
            train(load_run_config("video-qa", overrides=RUN), run_dir=run, resume=True, show_progress=False)
        rc, _, err = run_cli(capsys, "sft", "--quiet", "--steps", "1", "--out", str(run), *TINY_RUN)
        assert rc == 2 and expected in err
        assert [p.name for p in run.iterdir()] == [".lock"]  # nobody wrote anything
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert holder(run)["pid"] == proc.pid  # what the dead holder left
    rc, out, err = run_cli(capsys, "train", "--out", str(run), *RUN)  # its lock is free: the kernel released it
    assert rc == 0, err
    assert f"took over the lock left by pid {proc.pid}" in out
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3]
    assert holder(run) is None  # released at the end of the run


@pytest.mark.slow
def test_several_ranks_all_stop_when_rank_0_is_refused(tmp_path: Path) -> None:
    """Two gloo ranks: rank 0 is refused the held folder and both ranks raise the refusal (neither waits)."""
    run = tmp_path / "run"
    proc = hold(run)
    script = textwrap.dedent("""
        import os, sys, datetime, json
        import torch.distributed as dist
        from mmrl.engine.distributed import World
        from mmrl.run.lock import acquire_on_main
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        try:
            acquire_on_main(sys.argv[1], World(rank=rank, size=2))
            said = "taken"
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
        print(json.dumps(said), flush=True)
        dist.destroy_process_group()  # left to the interpreter's exit, gloo's threads can abort the process
    """)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    try:
        ranks = [subprocess.Popen([sys.executable, "-c", script, str(run)], cwd=ROOT, env={**env, "RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=120) for p in ranks]
    finally:
        proc.kill()
        proc.wait()
    assert all(p.returncode == 0 for p in ranks), [err[-2000:] for _, err in outs]
    said = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    for s in said:
        assert s.startswith("RunFolderBusy: ") and f"is in use by pid {proc.pid}" in s, s


# ---------------------------------------------------------------------------------- an existing --out

@pytest.mark.slow
def test_a_rerun_without_resume_is_refused_and_overwrite_starts_afresh(
        made: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = copy(made, "stopped", tmp_path)
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), *RUN, "train.lr=5e-4")
    assert rc == 2 and f"{run} already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert "resumed from" not in err
    assert snapshot(run) == before and (run / "checkpoint-1").is_dir()

    rc, out, err = run_cli(capsys, "train", "--out", str(run), "--overwrite", *RUN, "train.lr=5e-4")
    assert rc == 0, err
    assert "resumed from" not in out + err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("stopped.replaced-")]
    assert len(aside) == 1 and f"moved aside into {aside[0]}" in out
    assert snapshot(aside[0]) == before and (aside[0] / "checkpoint-1").is_dir()  # the old run, kept whole
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3]  # a new run from step 1, no row twice
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == 5e-4


# ------------------------------------------------------------------------------------------- --resume

@pytest.mark.slow
def test_resume_with_a_changed_setting_is_refused_and_forced_it_continues(
        made: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = copy(made, "stopped", tmp_path)
    lr = yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"]
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "train.lr=5e-4")
    assert rc == 2 and f"train.lr: {yaml.safe_dump(lr).splitlines()[0]} -> 0.0005" in err
    assert "--force-settings" in err
    assert snapshot(run) == before  # config.yaml byte for byte, and the logs

    rc, out, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--force-settings", "train.lr=5e-4")
    assert rc == 0, err
    assert "resumed from" in out + err and "train.lr:" in out
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == 5e-4
    changes = json.loads((run / "run_state.json").read_text())["settings_changes"]
    assert changes == [{"from_step": 1, "changes": [f"train.lr: {yaml.safe_dump(lr).splitlines()[0]} -> 0.0005"]}]
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3]


@pytest.mark.slow
def test_resume_of_a_finished_run_with_more_steps_leaves_config_yaml_alone(
        made: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = copy(made, "finished", tmp_path)
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "train.steps=25")
    assert rc == 2 and "train.steps: 3 -> 25" in err
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--force-settings", "train.steps=25")
    assert rc == 2 and "RL finished its 3 steps" in err and f"--model {run / 'final'}" in err
    assert snapshot(run) == before


@pytest.mark.slow
def test_resume_with_every_checkpoint_gone_says_no_checkpoint_found(
        made: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = copy(made, "stopped", tmp_path)
    shutil.rmtree(run / "checkpoint-1")
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 2 and f"no checkpoint found in {run}" in err and "checkpoint-<step>" in err and "--overwrite" in err
    assert snapshot(run) == before
    with pytest.raises(MmrlError, match="no checkpoint found"):  # the API alike
        from mmrl.config import resume_run_config
        from mmrl.run import train

        train(resume_run_config(run / "config.yaml"), run_dir=run, resume=True, show_progress=False)


@pytest.mark.slow
def test_sft_refuses_a_folder_holding_a_run(made: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    run = copy(made, "finished", tmp_path)
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "sft", "--quiet", "--steps", "1", "--out", str(run), *TINY_RUN)
    assert rc == 2 and f"{run} already holds a run" in err and "--overwrite" in err
    assert snapshot(run) == before
