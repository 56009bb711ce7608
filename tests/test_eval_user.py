"""``mmrl eval`` on a user's own questions (issue 47): unreadable media stop the evaluation naming the file, or with
``data.on_bad_sample=skip`` are left out and counted, as in a training run's evaluation (item 4); ``--data``
without a split to evaluate, and a file that leaves no question to evaluate, are errors that say what to do
(item 17); a benchmark folder is checked before the model loads."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tiny_runs import module_cache  # noqa: F401 (a fixture)

from mmrl import cli

CHEAP = ["model.tiny_family=qwen2_5_vl", "model.init=random", "data.media.min_frames=2", "data.media.max_frames=2",
         "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136", "rollout.max_new_tokens=2",
         "eval.max_new_tokens=2", "train.cpu_threads=1"]


def _mc(i: int) -> dict:
    return {"id": f"q{i}", "problem_type": "multiple_choice", "question": "Which colour?",
            "options": ["red", "green"], "answer": "A", "media": []}


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------ item 17: nothing to evaluate is an error

def test_eval_with_data_but_no_eval_split_says_to_use_eval_data(tmp_path: Path, module_cache: None,  # noqa: F811
                                                                capsys: pytest.CaptureFixture) -> None:
    data = _jsonl(tmp_path / "test.jsonl", [_mc(0), _mc(1)])
    out = tmp_path / "eval"
    assert cli.main(["eval", "--quiet", "--data", str(data), "--out", str(out), *CHEAP]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: eval: nothing to evaluate: --data {data} is the training data")
    assert f"mmrl eval --eval-data {data} evaluates that file" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("case", ["all_bad", "filtered"])
def test_eval_data_that_leaves_no_question_names_the_file(case: str, tmp_path: Path, module_cache: None,  # noqa: F811
                                                          capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "broken.mp4").write_bytes(os.urandom(4000))
    bad = {**_mc(0), "media": [{"type": "video", "path": "broken.mp4"}]}
    data = _jsonl(tmp_path / "qs.jsonl", [bad] if case == "all_bad" else [_mc(0), _mc(1)])
    out = tmp_path / "eval"
    extra = ["data.problem_types=[yes_no]"] if case == "filtered" else ["data.on_bad_sample=skip"]
    assert cli.main(["eval", "--quiet", "--eval-data", str(data), "--out", str(out), *CHEAP, *extra]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"error: data.test: {data}: no question to evaluate: ") and "Traceback" not in err
    if case == "filtered":
        assert "data.problem_types leaves out all 2" in err
    else:
        assert "all 1 record(s) were bad and skipped (data.on_bad_sample=skip" in err
    assert not out.exists()


def test_train_with_a_held_out_file_left_without_questions_stops_before_training(tmp_path: Path, module_cache: None,  # noqa: F811
                                                             capsys: pytest.CaptureFixture) -> None:
    """A held-out file with no question the run evaluates (here: none of the type data.problem_types keeps) is an
    error before training, not two evaluations skipped without a word."""
    train = _jsonl(tmp_path / "train.jsonl", [_mc(0), _mc(1)])
    yes_no = {"id": "y0", "problem_type": "yes_no", "question": "Is it red?", "answer": "yes", "media": []}
    held_out = _jsonl(tmp_path / "held_out.jsonl", [yes_no])
    out = tmp_path / "run"
    assert cli.main(["train", "--quiet", "--data", str(train), "--eval-data", str(held_out), "--out", str(out),
                     *CHEAP, "train.steps=1", "rollout.group_size=2", "train.prompts_per_step=1",
                     "data.problem_types=[multiple_choice]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: data.test: {held_out}: no question to evaluate: data.problem_types leaves out all 1")
    assert "Traceback" not in err
    assert not (out / "final").exists() and not list(out.glob("checkpoint-*"))
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()


# ----------------------------------------------------- item 4: unreadable media in mmrl eval, as in training

@pytest.fixture()
def with_broken_video(tmp_path: Path) -> Path:
    """A toy question with its video, and one whose video is random bytes (present, not empty: it passes
    ``data.check_media=exists`` and fails when decoded)."""
    from data_pipelines.toy import make_toy

    toy = make_toy(tmp_path / "toy", 0, size={"train": 1, "val": 1, "test": 1}, tasks=["color"], progress=False)
    good = json.loads((toy / "test.jsonl").read_text().splitlines()[0])
    (toy / "broken.mp4").write_bytes(os.urandom(4000))
    broken = {**good, "id": "broken-one", "media": [{"type": "video", "path": "broken.mp4"}]}
    return _jsonl(toy / "mine.jsonl", [good, broken])


@pytest.mark.slow
def test_unreadable_media_stop_mmrl_eval_naming_the_file_or_are_skipped_and_counted(
        with_broken_video: Path, tmp_path: Path, module_cache: None, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    data = with_broken_video
    common = ["eval", "--quiet", "--eval-data", str(data), *CHEAP, "data.check_media=exists"]
    out = tmp_path / "raise"
    assert cli.main([*common, "--out", str(out)]) == 2  # data.on_bad_sample=raise, the default
    err = capsys.readouterr().err
    assert err.startswith(f"error: {data.parent / 'broken.mp4'}: ") and "question broken-one" in err
    assert "data.on_bad_sample=skip" in err and "Traceback" not in err
    assert not (out / "metrics.json").exists()
    out = tmp_path / "skip"
    assert cli.main([*common, "--out", str(out), "data.on_bad_sample=skip"]) == 0
    said = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["skipped"] == 1 and metrics["n_total"] == 1
    assert [e["id"] for e in metrics["excluded"]] == ["broken-one"]
    assert "(1 evaluated, 1 skipped)" in said and "broken-one" in said


def test_a_training_runs_evaluation_follows_on_bad_sample_too(with_broken_video: Path, module_cache: None,  # noqa: F811
                                                             ) -> None:
    """The service a run evaluates through (RolloutService.from_config) carries data.on_bad_sample, so the
    in-run evaluation and mmrl eval decide alike."""
    from mmrl.config import load_run_config
    from mmrl.engine.evaluate import evaluate
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model
    from mmrl_common.errors import MediaError

    cfg = load_run_config("video-qa", overrides=[*CHEAP, "data.check_media=exists", f"data.test={with_broken_video}",
                                                 f"data.train={with_broken_video}"])
    samples, _ = load_split(cfg, "test", show_progress=False)
    policy = load_policy(resolve_model(cfg), dtype="fp32", device="cpu")
    with pytest.raises(MediaError, match="broken.mp4: .*question broken-one"):
        evaluate(RolloutService.from_config(policy, cfg), samples, max_new_tokens=2, show_progress=False)
    skip = load_run_config("video-qa", overrides=[*CHEAP, "data.check_media=exists", "data.on_bad_sample=skip"])
    metrics, _ = evaluate(RolloutService.from_config(policy, skip), samples, max_new_tokens=2, show_progress=False)
    assert metrics["skipped"] == 1 and metrics["n_total"] == 1


# -------------------------------------------------------------------- the benchmark folder before the model

def test_eval_benchmark_checks_its_folder_before_loading_the_model(tmp_path: Path, module_cache: None,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture) -> None:
    from mmrl.toy.tiny_models import ensure_tiny

    model = tmp_path / "model"
    shutil.copytree(ensure_tiny("qwen2_5_vl"), model)
    for weights in model.glob("*.safetensors"):  # weights that cannot load: the model must not be loaded
        weights.write_bytes(b"not weights")
    missing = tmp_path / "no-mvbench-here"
    assert cli.main(["eval", "--quiet", "--benchmark", "mvbench", "--data-root", str(missing),
                     "--model", str(model), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(missing) in err and "Traceback" not in err
    assert "safetensors" not in err
