"""The command line as a user meets it on the second day: overrides among the flags, errors under the
sub-command's usage, settings that ``config show`` and ``train`` judge alike, ``data validate`` / ``inspect``
with ``--columns`` and clear import errors, Video-R1 records that TRL rewards can read (checked before the
model loads), a failed start re-run into the same ``--out``, and the quieter output."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 (module_cache is a fixture)

from mmrl.cli import build_parser, calm_progress_bars, main, parse, quiet_third_party
from mmrl_common.errors import MmrlError


def reads_solution(completions, solution, **_):
    """A TRL-style reward that reads the dataset's ``solution`` column."""
    return [1.0 if s and s in c else 0.0 for c, s in zip(completions, solution)]


def reads_problem(completions, problem, **_):
    """A TRL-style reward that reads a column mmrl's records do not have."""
    return [0.0 for _ in completions]


# ---------------------------------------------------------------------------------------- item 4: overrides

def test_overrides_may_stand_among_the_flags(capsys: pytest.CaptureFixture) -> None:
    argv = ["train", "--quiet", "train.steps=5", "--out", "x", "data.on_bad_sample=skip", "--task", "video-qa"]
    args = parse(build_parser(only="train"), argv)
    assert args.overrides == ["train.steps=5", "data.on_bad_sample=skip"] and args.quiet and args.out == "x"
    assert main(["config", "show", "train.steps=5", "--quiet", "rollout.group_size=4", "--task", "video-qa"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "train.steps: 5" in out and "rollout.group_size: 4" in out


@pytest.mark.parametrize(("argv", "usage"), [
    (["train", "train.steps=5", "--bogus"], "usage: mmrl train "),
    (["config", "show", "--nope"], "usage: mmrl config show "),
    (["data", "validate", "f.jsonl", "stray"], "usage: mmrl data validate "),
])
def test_unknown_arguments_are_shown_under_the_commands_usage(argv: list[str], usage: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(usage) and f"error: unrecognized arguments: {argv[-1]}" in err
    assert "usage: mmrl [-h]" not in err


# ------------------------------------------------------------------- item 8: config show and train agree

@pytest.mark.parametrize(("override", "message"), [
    ("rollout.max_new_tokens=0", "error: rollout.max_new_tokens=0: a completion needs at least one new token"),
    ("rollout.max_new_tokens=-5", "error: rollout.max_new_tokens=-5: a completion needs at least one new token"),
    ("eval.max_new_tokens=0", "error: eval.max_new_tokens=0: an answer needs at least one new token"),
    ("rollout.backend=vlm", "error: unknown rollout backend 'vlm' (config key 'rollout.backend'); did you mean 'vllm'?"),
    ("rewards=[{name: acuracy}]", "error: unknown reward 'acuracy' (rewards[0]); did you mean 'accuracy'?"),
])
def test_config_show_and_train_reject_the_same_settings(override: str, message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "show", override]) == 2
    shown = capsys.readouterr().err.strip()
    assert main(["train", "--quiet", "--out", str(tmp_path / "run"), override]) == 2
    trained = capsys.readouterr().err.strip()
    assert shown == trained and shown.startswith(message) and "Traceback" not in shown
    assert not (tmp_path / "run").exists()  # refused before anything was written


# --------------------------------------------------------------------- item 6: data validate and inspect

def _native(tmp_path: Path, records: list[dict], name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _mc(i: int, **extra) -> dict:
    return {"id": f"q{i}", "problem_type": "multiple_choice", "question": "Which colour?",
            "options": ["red", "green"], "answer": "A", "media": [], **extra}


def test_video_r1_format_on_a_native_file_names_the_file_and_the_field(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    path = _native(tmp_path, [_mc(0), _mc(1)])
    assert main(["data", "validate", str(path), "--format", "video-r1", "--no-progress"]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert (f"{path}:1: sample 'q0': cannot import video-r1 record: missing field(s) 'problem', 'solution': a "
            "Video-R1 record has problem, solution") in out.out
    assert "it looks like a native record (--format native, or auto)" in out.out


def test_columns_can_be_given_to_validate_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    renamed = [{**{k: v for k, v in _mc(i).items() if k != "question"}, "query": "Which colour?"} for i in range(2)]
    path = _native(tmp_path, renamed)
    assert main(["data", "validate", str(path), "--no-progress"]) == 1
    hint = capsys.readouterr().out
    assert "--columns '{source: field}' in mmrl data validate / inspect" in hint and "use `columns=`" not in hint
    assert main(["data", "validate", str(path), "--no-progress", "--columns", "{query: question}"]) == 0
    assert "OK:" in capsys.readouterr().out
    assert main(["data", "inspect", str(path), "--samples", "0", "--columns", "{query: question}"]) == 0
    assert "records: 2 loaded, 0 skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["data", "inspect", str(path), "--columns", "[query]"])
    assert "argument --columns: expected a mapping of source column -> record field" in capsys.readouterr().err


def test_inspect_names_the_skipped_records(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _native(tmp_path, [_mc(0), {**_mc(1), "answer": "C"}])
    assert main(["data", "inspect", str(path), "--samples", "0"]) == 0
    out = capsys.readouterr().out
    assert "records: 1 loaded, 1 skipped (bad):" in out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"  {path}:2"))
    assert "q1" in line


# ------------------------------------------------------- item 5: Video-R1 records and TRL-style rewards

def _video_r1(tmp_path: Path) -> Path:
    video = tmp_path / "v.mp4"
    video.write_bytes(b"")  # not opened: the checks below read records only
    rec = {"problem_id": 7, "problem": "Which colour is the ball?", "data_type": "video", "path": "v.mp4",
           "problem_type": "multiple choice", "options": ["A. red", "B. green"], "solution": "<answer>B</answer>",
           "data_source": "toy"}
    return _native(tmp_path, [rec], "vr1.jsonl")


def test_video_r1_import_keeps_the_solution_for_trl_rewards(tmp_path: Path) -> None:
    from data_pipelines.loaders import load_samples
    from mmrl.config import load_run_config
    from mmrl.run import check_rewards

    sample = load_samples(_video_r1(tmp_path), fmt="video-r1").samples[0]
    assert sample.answer == "B" and sample.meta["solution"] == "<answer>B</answer>"
    ok = load_run_config("video-qa", overrides=[("rewards=[{name: test_cli_args.reads_solution}, "
                                                "{name: trl:accuracy_reward}]")])
    check_rewards(ok, sample)  # TRL's accuracy_reward reads `solution`: present
    bad = load_run_config("video-qa", overrides=["rewards=[{name: test_cli_args.reads_problem}]"])
    with pytest.raises(MmrlError) as info:
        check_rewards(bad, sample)
    msg = str(info.value)
    assert "reward 'reads_problem' failed" in msg and "problem" in msg
    assert f"checked on the first training sample, {sample.id}" in msg and "before the model loads" in msg


@pytest.mark.slow
def test_a_start_that_failed_before_its_first_step_can_be_run_again(tmp_path: Path,
                                                                    module_cache: None) -> None:  # noqa: F811
    from mmrl.config import load_run_config
    from mmrl.run import train

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: video-qa\n")
    (run / "run_state.json").write_text(json.dumps({"stages": {"eval_before_rl": {"accuracy": 0.5}}}))
    (run / "metrics.jsonl").write_text(json.dumps({"stage": "eval", "step": 0, "accuracy": 0.5}) + "\n")
    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    with pytest.raises(MmrlError, match="already holds a run; pass --resume"):  # a folder holding a run: say how
        train(cfg, run_dir=run, show_progress=False)
    summary = train(cfg, run_dir=run, overwrite=True, show_progress=False)  # --overwrite
    assert summary["stages"]["rl"]["steps"] == 2 and [r["step"] for r in rl_rows(run)] == [1, 2]
    assert "eval_before_rl" not in json.loads((run / "run_state.json").read_text())["stages"]  # started afresh
    with pytest.raises(MmrlError, match="already holds a run; pass --resume"):  # this one took RL steps
        train(cfg, run_dir=run, show_progress=False)


# ------------------------------------------------------------------------------------ item 12: smaller

def test_eval_help_speaks_of_evaluation(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "metrics.json and predictions.jsonl" in out and "default: runs/eval-<time>" in out
    assert "training data" not in out and "train.steps=50" not in out


def test_config_show_describes_the_grpo_keys(capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "show", "grpo.kl_coef=0.001"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def meaning(key: str) -> str:
        i = lines.index(next(ln for ln in lines if ln.startswith(f"{key}:")))
        return " ".join(ln.strip() for ln in lines[i + 1:i + 6] if ln.startswith("    "))

    assert lines[lines.index("grpo.kl_coef: 0.001")]
    assert "off by default" not in meaning("grpo.kl_coef") and "Weight of the KL" in meaning("grpo.kl_coef")
    assert not meaning("grpo.advantage_estimator").startswith("advantages:")
    assert "group" in meaning("grpo.advantage_estimator")
    assert not meaning("grpo.loss_agg").startswith("aggregation:") and "token-mean" in meaning("grpo.loss_agg")


def test_deepspeed_cpu_notice_is_filtered_and_its_other_messages_are_not() -> None:
    quiet_third_party()
    quiet_third_party()  # idempotent: one filter
    ds = logging.getLogger("DeepSpeed")
    assert sum(getattr(f, "mmrl", False) for f in ds.filters) == 1

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 213, msg, None, None)

    assert not ds.filter(record("Setting accelerator to CPU. If you have GPU or other accelerator, we were "
                                "unable to detect it."))
    assert ds.filter(record("ZeRO-3: out of memory"))


def test_progress_bars_are_calm_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    import os
    import subprocess

    code = ("from mmrl.cli import calm_progress_bars; calm_progress_bars(); from tqdm import tqdm; "
            "print(tqdm(total=1, disable=False).mininterval)")

    def interval(**env: str) -> float:
        base = {k: v for k, v in os.environ.items() if k != "TQDM_MININTERVAL"}
        with (tmp_path / "err.log").open("w") as log:  # stderr a file, as with `2> log`
            done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=log, text=True,
                                  env={**base, **env}, check=True)
        return float(done.stdout)

    assert interval() == 60
    assert interval(TQDM_MININTERVAL="5") == 5  # the user's value wins
    assert calm_progress_bars.__module__ == "mmrl.cli"


def test_eval_without_out_writes_its_predictions_to_the_default_folder(
        tmp_path: Path, module_cache: None, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--quiet", "--limit", "1", *TINY_RUN]) == 0
    folders = list((tmp_path / "runs").glob("eval-*"))
    assert len(folders) == 1
    assert len((folders[0] / "predictions.jsonl").read_text().splitlines()) == 1
    assert json.loads((folders[0] / "metrics.json").read_text())["n"] == 1
    assert f"{folders[0].relative_to(tmp_path) / 'predictions.jsonl'}" in capsys.readouterr().out


@pytest.mark.slow
def test_a_logged_run_redraws_its_progress_bars_rarely(tmp_path: Path, module_cache: None) -> None:  # noqa: F811
    """The cold start's and RL's bars with their loss/reward postfix: drawn by tqdm's interval, not every step."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TQDM_MININTERVAL"}
    with (tmp_path / "err.log").open("w") as log:  # stderr a file, as with `2> log`
        subprocess.run([sys.executable, "-m", "mmrl", "train", "--out", str(tmp_path / "run"), *TINY_RUN,
                        "train.steps=30", "sft.steps=30", "sft.batch_size=2", "sft.target=random_answer"],
                       stdout=subprocess.DEVNULL, stderr=log, env=env, check=True, timeout=600)
    err = (tmp_path / "err.log").read_text()
    for bar in ("sft", "rl"):
        draws = [part for part in err.replace("\r", "\n").splitlines() if part.startswith(f"{bar}:")]
        assert 1 <= len(draws) <= 6, (bar, draws)  # a few states (first, last, a redraw), not one per step
