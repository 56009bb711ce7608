"""The files of a run folder read back on ``--resume`` (issue 61, items 2 and 10, and the cosmetic "a failed start
blocks the corrected re-run"): a cut, empty or garbled ``config.yaml``, ``run_state.json`` or ``inputs.json`` is one
line naming the file and what to do, and nothing in the folder changes; a start that failed before it trained
anything does not block the corrected command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tiny_runs
from tiny_runs import TINY_RUN, module_cache, run_cli  # noqa: F401 (module_cache is a fixture)

RUN = [*TINY_RUN, "train.steps=3", "train.save_every=1", "train.lr=1e-3"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (the lock left out) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def stopped(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A 3-step run that stopped in step 2 (checkpoint-1 written): one a ``--resume`` continues."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    run = tmp_path_factory.mktemp("made") / "stopped"
    tiny_runs.STOP_AT[:] = [2]
    try:
        with pytest.raises(tiny_runs.StopRun):
            train(load_run_config("video-qa", overrides=[*RUN, "plugins={test-stop-at: {}}"]), run_dir=run,
                  show_progress=False)
    finally:
        tiny_runs.STOP_AT[:] = []
    assert (run / "checkpoint-1").is_dir() and (run / "inputs.json").is_file()
    return run


def resume_refused(run: Path, capsys: pytest.CaptureFixture, name: str) -> str:
    """``mmrl train --resume`` on ``run``: refused in one line naming ``run/name``, nothing in the folder changed;
    that line."""
    before = snapshot(run)
    rc, out, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(run / name) in lines[0], err
    assert snapshot(run) == before
    return lines[0]


def cut_before(text: str, key: str) -> str:
    return text[:text.index(f"\n{key}:") + 1]


CONFIG_DAMAGE = {
    "cut before its train section": lambda t: cut_before(t, "train"),
    "cut in half": lambda t: t[:len(t) // 2],
    "empty": lambda t: "",
    "garbled": lambda t: "\x00\x07 ]]: [[ {{{\n" + t[40:],
    "its learning rate changed by a flipped bit": lambda t: t.replace("lr: 0.001", "lr: 0.003"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(CONFIG_DAMAGE))
def test_a_damaged_config_yaml_is_one_line_on_resume_and_changes_nothing(
        stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    text = (run / "config.yaml").read_text()
    assert "lr: 0.001" in text
    (run / "config.yaml").write_text(CONFIG_DAMAGE[damage](text))
    line = resume_refused(run, capsys, "config.yaml")
    assert "--overwrite" in line and "nothing was changed" in line


@pytest.mark.slow
@pytest.mark.parametrize("content", ["", '{"stages": {"eval_before_rl": {"accura', "\x00\x00\x00", "[1, 2]"])
def test_a_damaged_run_state_json_is_one_line_on_resume_and_changes_nothing(
        stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture, content: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    (run / "run_state.json").write_text(content)
    line = resume_refused(run, capsys, "run_state.json")
    assert "--overwrite" in line and "Put back" in line


@pytest.mark.slow
@pytest.mark.parametrize("content", ["", '{"started_in": "/x", "data": {', "not json at all"])
def test_a_damaged_inputs_json_is_one_line_on_resume_not_the_data_check_turned_off(
        stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture, content: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    (run / "inputs.json").write_text(content)
    line = resume_refused(run, capsys, "inputs.json")
    assert "data files and model the run started with" in line


@pytest.mark.slow
def test_the_run_folder_files_round_trip_and_a_resume_of_them_continues(
        stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What mmrl writes, it reads back: an untouched folder resumes to the end, at the run's own settings."""
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 0, err
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "rl"] == [1, 2, 3]
    assert json.loads((run / "run_state.json").read_text())["stages"]["rl"]["steps"] == 3
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


@pytest.mark.slow
def test_a_start_that_failed_loading_its_data_does_not_block_the_corrected_rerun(
        tmp_path: Path, capsys: pytest.CaptureFixture, module_cache: None) -> None:  # noqa: F811
    """The failed start trained nothing, so its folder holds no run: the corrected command goes ahead without
    --overwrite (and what that start wrote is replaced, not read: its state, its inputs' record)."""
    data = tmp_path / "train.jsonl"
    good = {"id": "a", "question": "What colour is the square?", "answer": "red", "problem_type": "free-form"}
    data.write_text(json.dumps(good) + "\n" + '{"id": "b", "question": \n')  # a cut record: the data do not load
    run = tmp_path / "run"
    args = ["train", "--quiet", "--out", str(run), "--data", str(data), *TINY_RUN, "train.steps=1"]
    rc, _, err = run_cli(capsys, *args)
    assert rc != 0 and "train.jsonl" in err and "Traceback" not in err
    data.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b"}) + "\n")  # corrected
    rc, _, err = run_cli(capsys, *args)
    assert rc == 0, err
    assert "already holds a run" not in err
    assert json.loads((run / "run_state.json").read_text())["stages"]["rl"]["steps"] == 1
    assert not list(tmp_path.glob("run.replaced-*"))
    rc, _, err = run_cli(capsys, *args)  # a folder that trained is still a run: refused
    assert rc == 2 and "already holds a run" in err
