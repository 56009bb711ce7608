"""A resumed run uses exactly the data, model and settings it started with, or refuses and says why (issue 47):
a data file edited in place, another model in the run's model folder or another ``--model`` are refused unless
``--force-settings`` (and then the report says from which step); weights of another architecture never end in a
``state_dict`` traceback; a refused resume writes nothing; ``config.yaml`` records paths absolute, so ``--resume``
works from any working folder; a run folder moved with its data is accepted when the content is the same. Also:
the logged learning rate is the one the step's optimizer update used."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import tiny_runs
import yaml
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)

from mmrl_common.errors import MmrlError

RUN = [*TINY_RUN, "train.steps=3", "train.save_every=1"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` but the lock, and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ------------------------------------------------------------------------------------------ unit: fingerprints
def test_a_data_files_fingerprint_sees_an_edit_that_keeps_its_size_and_time(tmp_path: Path) -> None:
    from mmrl.run import inputs as run_inputs
    from mmrl.run.inputs import data_difference, fingerprint

    f = tmp_path / "train.jsonl"
    f.write_text('{"answer": "A"}\n')
    st = f.stat()
    before = fingerprint(str(f))
    f.write_text('{"answer": "B"}\n')  # the same size ...
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the same modification time
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    run_inputs._CACHE.clear()  # as in the resume's own process (the hashes a process made are kept for it)
    why = data_difference(before, fingerprint(str(f)))
    assert why is not None and "same size" in why and "sha256" in why
    assert data_difference(fingerprint(str(f)), fingerprint(str(f))) is None
    copy = tmp_path / "elsewhere" / "moved.jsonl"  # the same bytes under another name: the same data
    copy.parent.mkdir()
    shutil.copy(f, copy)
    assert data_difference(fingerprint(str(f)), fingerprint(str(copy))) is None
    f.unlink()
    assert data_difference(fingerprint(str(copy)), fingerprint(str(f))) == "is gone"


def test_a_folder_or_a_glob_of_shards_is_fingerprinted_file_by_file(tmp_path: Path) -> None:
    from mmrl.run.inputs import data_difference, fingerprint

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"train-0000{i}-of-00003.parquet").write_bytes(bytes([i]) * 100)
    (data / ".cache").mkdir()
    (data / ".cache" / "x").write_text("not data")
    folder, shards = fingerprint(str(data)), fingerprint(str(data / "train-*.parquet"))
    assert folder["kind"] == "folder" and shards["kind"] == "glob"
    assert [f["name"] for f in folder["files"]] == [f"train-0000{i}-of-00003.parquet" for i in range(3)]
    assert fingerprint(f"{data}:train")["files"] == folder["files"]  # a split of a datasets folder: the folder's
    assert fingerprint(f"{data}/train-*.parquet:train")["files"] == shards["files"]
    (data / "train-00001-of-00003.parquet").write_bytes(b"\x09" * 100)
    (data / "train-00003-of-00003.parquet").write_bytes(b"new")
    assert data_difference(folder, fingerprint(str(data))) == \
        "its files changed (train-00003-of-00003.parquet added, train-00001-of-00003.parquet changed)"
    why = data_difference(shards, fingerprint(str(data / "train-*.parquet")))
    assert why is not None and "train-00001-of-00003.parquet changed" in why


def test_config_yaml_paths_are_absolute_and_compare_as_the_same_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.config import load_run_config
    from mmrl.config.io import to_dict
    from mmrl.run import settings_differences
    from mmrl.run.inputs import absolute_paths

    monkeypatch.chdir(tmp_path)
    cfg = load_run_config("video-qa", overrides=["data.train=data/train.jsonl", "data.test=shards/test-*.parquet",
                                                 "data.media_root=~/media", "train.deepspeed=zero2"])
    cfg = absolute_paths(cfg)
    assert cfg.data.train == str(tmp_path / "data" / "train.jsonl")
    assert cfg.data.test == str(tmp_path / "shards" / "test-*.parquet")  # a glob stays a glob
    assert cfg.data.media_root == str(Path.home() / "media") and cfg.train.deepspeed == "zero2"
    saved = tmp_path / "run" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    again = load_run_config("video-qa", overrides=["data.train=./data/../data/train.jsonl",
                                                   "data.test=shards/test-*.parquet", "data.media_root=~/media",
                                                   "train.deepspeed=zero2"])
    assert settings_differences(saved, again) == []  # the same files, however written
    other = load_run_config("video-qa", overrides=["data.train=data/other.jsonl", "data.test=shards/test-*.parquet",
                                                   "data.media_root=~/media", "train.deepspeed=zero2"])
    assert settings_differences(saved, other) == \
        [f"data.train: {tmp_path / 'data' / 'train.jsonl'} -> {tmp_path / 'data' / 'other.jsonl'}"]


def test_compare_reuses_a_run_whose_config_yaml_holds_the_specs_relative_paths_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.cli.compare import Arm, config_differences
    from mmrl.config import load_run_config
    from mmrl.config.io import to_dict
    from mmrl.run.inputs import absolute_paths

    monkeypatch.chdir(tmp_path)
    arm = Arm("base", task="video-qa", overrides=["data.train=data/train.jsonl", "model.path=models/m"])
    folder = tmp_path / "out" / "base" / "seed-0"
    folder.mkdir(parents=True)
    cfg = load_run_config("video-qa", overrides=[*arm.overrides, "train.seed=0"], extra={"out": str(folder)})
    (folder / "config.yaml").write_text(yaml.safe_dump(to_dict(absolute_paths(cfg)), sort_keys=False))
    assert config_differences(arm, 0, folder) == []
    moved = Arm("base", task="video-qa", overrides=["data.train=data/other.jsonl", "model.path=models/m"])
    assert config_differences(moved, 0, folder) == \
        [f"data.train: {tmp_path / 'data' / 'train.jsonl'} -> {tmp_path / 'data' / 'other.jsonl'}"]


@pytest.mark.slow
def test_checkpoint_weights_of_another_model_give_one_line_naming_both(tmp_path: Path, module_cache: None) -> None:  # noqa: F811
    from mmrl.engine.checkpoint import load_weights, save_model
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import ensure_tiny

    small = load_policy(ensure_tiny("qwen2_5_vl", hidden_size=64, intermediate_size=192), device="cpu")
    big = load_policy(ensure_tiny("qwen2_5_vl"), device="cpu")
    save_model(tmp_path / "checkpoint-1", small.model, small.processor, None)
    with pytest.raises(MmrlError) as err:
        load_weights(big.model, tmp_path / "checkpoint-1")
    text = str(err.value)
    assert "\n" not in text and "holds the weights of another model than the one loaded" in text
    assert "hidden 64" in text and "hidden 128" in text and "is [" in text and "tensors differ" in text


# ------------------------------------------------------------------------------------------ unit: logged LR
@pytest.mark.slow
def test_the_logged_learning_rate_is_the_one_the_steps_update_used(tmp_path: Path, module_cache: None) -> None:  # noqa: F811
    from mmrl.engine.optim import lr_lambda

    rows = tiny_runs.run_rl(tmp_path, "train.steps=4", "train.warmup_steps=2", "train.lr=1e-3",
                            "train.min_lr_ratio=0.1")
    schedule = lr_lambda(2, 4, 0.1)
    # step N (1-based) is the schedule's position N-1: warm-up 1/2, 2/2, then the cosine from the peak
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * schedule(n) for n in range(4)])
    assert rows[0]["lr"] == pytest.approx(5e-4) and rows[1]["lr"] == pytest.approx(1e-3)


def test_the_logged_sft_learning_rate_is_the_one_its_step_used(tmp_path: Path, module_cache: None,  # noqa: F811
                                                                capsys: pytest.CaptureFixture) -> None:
    from mmrl.engine.optim import lr_lambda

    rc, _, err = run_cli(capsys, "sft", "--quiet", "--steps", "3", "--out", str(tmp_path / "sft"), *TINY_RUN,
                     "sft.warmup_steps=2", "sft.lr=1e-3")
    assert rc == 0, err
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    schedule = lr_lambda(2, 3, 0.0)
    assert [r["lr"] for r in rows if r["stage"] == "sft"] == pytest.approx([1e-3 * schedule(n) for n in range(3)])


# ------------------------------------------------------------------------------------------ real runs
@pytest.fixture
def started(module_cache: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:  # noqa: F811
    """A user's run started in ``tmp_path/start`` with relative paths (``--data data/train.jsonl --model model
    --out run``), stopped in step 2 (checkpoint-1 written); the working folder is ``tmp_path/elsewhere``."""
    from mmrl.config import load_run_config
    from mmrl.run import resolve_model, split_path, train

    start = tmp_path / "start"
    toy_cfg = load_run_config("video-qa", overrides=RUN)
    shutil.copytree(Path(split_path(toy_cfg, "train", show_progress=False)).parent, start / "data")
    shutil.copytree(resolve_model(toy_cfg), start / "model")
    monkeypatch.chdir(start)
    tiny_runs.STOP_AT[:] = [2]
    try:
        with pytest.raises(tiny_runs.StopRun):
            train(load_run_config("video-qa", overrides=[*RUN, "plugins={test-stop-at: {}}", "data.train=data/train.jsonl",
                                                         "model.path=model"]),
                  run_dir=Path("run"), show_progress=False)
    finally:
        tiny_runs.STOP_AT[:] = []
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return {"start": start, "run": start / "run", "data": start / "data" / "train.jsonl", "model": start / "model"}


@pytest.mark.slow
def test_resume_from_another_working_folder_finds_the_runs_model_and_data(
        started: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    run = started["run"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["train"] == str(started["data"]) and saved["model"]["path"] == str(started["model"])
    inputs = json.loads((run / "inputs.json").read_text())
    assert inputs["started_in"] == str(started["start"]) and inputs["data"]["data.train"]["files"][0]["sha256"]
    rc, out, err = run_cli(capsys, "train", "--out", str(run), "--resume")
    assert rc == 0, err
    assert "resumed from" in out + err and [r["step"] for r in rl_rows(run)] == [1, 2, 3]

    # the run folder, its data and model moved (another machine): given at their new place, the same content
    moved = started["start"].parent / "moved"
    shutil.move(started["start"], moved)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(moved / "run"), "--resume", "--data",
                     str(moved / "data" / "train.jsonl"), "--model", str(moved / "model"))
    assert rc == 0, err
    assert yaml.safe_load((moved / "run" / "config.yaml").read_text())["data"]["train"] == \
        str(moved / "data" / "train.jsonl")


@pytest.mark.slow
def test_resume_on_edited_or_other_data_is_refused_and_forced_the_report_says_from_which_step(
        started: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    run, data = started["run"], started["data"]
    other = data.with_name("other.jsonl")
    shutil.copy(data, other)
    lines = data.read_text().splitlines(keepends=True)
    other.write_text("".join(lines[:-1]))
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--data", str(other))
    assert rc == 2 and f"data.train: {data} -> {other}" in err and "--force-settings" in err
    assert snapshot(run) == before

    data.write_text("".join(reversed(lines)))  # the same path, the same size, other content (another order)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 2, err
    assert f"data.train {data}: its content changed (same size" in err and "--force-settings" in err
    assert "\n" not in err.strip() and snapshot(run) == before  # one line; nothing written

    rc, _, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--force-settings")
    assert rc == 0, err
    changes = json.loads((run / "run_state.json").read_text())["settings_changes"]
    assert len(changes) == 1 and changes[0]["from_step"] == 1
    assert changes[0]["changes"][0].startswith(f"data.train {data}: its content changed")
    report = (run / "report.md").read_text()
    assert "## Changed on resume" in report and f"- from step 1: data.train {data}: its content changed" in report
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3]


@pytest.mark.slow
def test_resume_with_another_model_is_refused_in_one_line_and_writes_nothing(
        started: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    from mmrl.toy.tiny_models import ensure_tiny

    run, model = started["run"], started["model"]
    small = ensure_tiny("qwen2_5_vl", hidden_size=64, intermediate_size=192)
    before = snapshot(run)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--model", str(small))
    assert rc == 2 and f"model.path: {model} -> {small}" in err
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--force-settings", "--model",
                     str(small))
    assert rc == 2 and "cannot be loaded into this model" in err and "hidden 64" in err and "hidden 128" in err
    assert "Traceback" not in err and "\n" not in err.strip()
    assert snapshot(run) == before  # config.yaml still names the run's model

    shutil.rmtree(model)  # another model in the run's own model folder (the same path)
    shutil.copytree(small, model)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--force-settings")
    assert rc == 2 and "cannot be loaded into this model" in err and "Traceback" not in err
    shutil.rmtree(model)  # the same architecture, other weights: refused unless --force-settings
    shutil.copytree(ensure_tiny("qwen2_5_vl", seed=1), model)
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 2 and f"model.path {model}: other weights" in err and "--force-settings" in err
    assert snapshot(run) == before



@pytest.mark.slow
def test_a_forced_resume_that_fails_before_it_resumes_leaves_the_runs_record_as_it_was(
        started: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    run, data = started["run"], started["data"]
    bad = data.with_name("bad.jsonl")
    records = [json.loads(line) for line in data.read_text().splitlines()]
    records[0]["media"][0]["path"] = "media/missing.mp4"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    kept = {name: (run / name).read_bytes() for name in ("config.yaml", "inputs.json")}
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume", "--force-settings", "--data", str(bad))
    assert rc != 0 and "missing.mp4" in err
    assert {name: (run / name).read_bytes() for name in kept} == kept  # still the run's own data
    assert "settings_changes" not in json.loads((run / "run_state.json").read_text())
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")  # continues as the run started
    assert rc == 0, err
    assert "settings_changes" not in json.loads((run / "run_state.json").read_text())
    assert [r["step"] for r in rl_rows(run)] == [1, 2, 3]
