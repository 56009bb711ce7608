"""A user's own model and data, as the README shows them: ``mmrl train --model DIR --data FILE --eval-data FILE``
with ``prompt.answer_format=think_answer rollout.max_new_tokens=... data.media.max_frames=...``, then the
README's ``mmrl eval --model RUN/final --eval-data FILE``.

* the eval uses the settings the model was trained with (``final/mmrl_eval.json``), says so, and scores
  exactly what the run's own after-RL evaluation scored (same questions, same completions);
* ``--recipe-settings`` evaluates with the recipe's settings instead (other completions);
* the random-answer cold start of the recipe never runs on a model given with ``--model``;
* a two-option question counts in the accuracy by default, and a question left out by ``eval.min_options``
  is named with its reason on the console and in ``metrics.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 -- module_cache is a fixture

from mmrl import cli
from mmrl.config import EvalConfig, load_run_config, resume_run_config
from mmrl.engine.evaluate import evaluate, summarize
from mmrl.run import load_split, resolve_model

pytestmark = pytest.mark.usefixtures("module_cache")

TRAINED = ["prompt.answer_format=think_answer", "rollout.max_new_tokens=12", "data.media.max_frames=8"]


def own_test_file(toy_test: Path, out: Path) -> Path:
    """The toy test questions (media paths made absolute) plus a two-option question on the first video."""
    rows = [json.loads(line) for line in toy_test.read_text().splitlines() if line.strip()]
    for r in rows:
        for m in r["media"]:
            m["path"] = str((toy_test.parent / m["path"]).resolve())
    first = rows[0]
    right = first["options"]["ABCDEFGH".index(first["answer"])]
    wrong = next(o for o in first["options"] if o != right)
    rows.append({**first, "id": "two-options", "options": [wrong, right], "answer": "B"})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@pytest.fixture(scope="module")
def own_run(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    import contextlib
    import io

    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    model = resolve_model(cfg)
    _, train_info = load_split(cfg, "train", show_progress=False)
    _, test_info = load_split(cfg, "test", show_progress=False)
    root = tmp_path_factory.mktemp("own")
    test_file = own_test_file(Path(test_info["path"]), root / "my_test.jsonl")
    run = root / "run"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["train", "--quiet", "--model", str(model), "--data", train_info["path"], "--eval-data",
                       str(test_file), "--out", str(run), *TINY_RUN, "train.steps=1", "sft.steps=2",
                       "eval.after_rl=true", *TRAINED])
    assert rc == 0, out.getvalue()
    return {"run": run, "test_file": test_file, "stdout": out.getvalue(),
            "summary": json.loads((run / "summary.json").read_text())}


def test_random_answer_cold_start_never_runs_on_a_given_model(own_run: dict) -> None:
    assert "cold start not run: sft.target=random_answer" in own_run["stdout"]
    assert "mmrl sft --model DIR --data FILE --steps N" in own_run["stdout"]
    assert "sft.target=gold sft.steps=N" in own_run["stdout"]
    assert "skipped" in own_run["summary"]["stages"]["sft"]
    rows = [json.loads(line) for line in (own_run["run"] / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["stage"] == "sft"] and not (own_run["run"] / "sft-model").exists()


def test_every_saved_model_folder_carries_its_evaluation_settings(own_run: dict) -> None:
    for folder in (own_run["run"] / "final", own_run["run"] / "checkpoint-1"):
        settings = json.loads((folder / "mmrl_eval.json").read_text())
        assert settings["prompt"]["answer_format"] == "think_answer"
        assert settings["rollout"]["max_new_tokens"] == 12 and settings["data"]["media"]["max_frames"] == 8


def test_readme_eval_line_scores_what_the_run_scored(own_run: dict, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy

    final, out = own_run["run"] / "final", tmp_path / "eval"
    assert cli.main(["eval", "--model", str(final), "--eval-data", str(own_run["test_file"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "evaluating as the model was trained" in printed
    for setting in ("prompt.answer_format=think_answer", "rollout.max_new_tokens=12", "data.media.max_frames=8"):
        assert setting in printed
    metrics = json.loads((out / "metrics.json").read_text())
    after = own_run["summary"]["eval_after_rl"]
    for key in ("accuracy", "n", "n_total", "excluded", "by_problem_type"):
        assert metrics[key] == after[key], key

    # the completions are the ones the run's own settings give on the final weights
    cfg = resume_run_config(own_run["run"] / "config.yaml")
    samples, _ = load_split(cfg, "test", show_progress=False)
    policy = load_policy(final, dtype=cfg.model.dtype, device="cpu")
    _, expected = evaluate(RolloutService.from_config(policy, cfg), samples,
                           max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                           batch_size=cfg.eval.batch_size, show_progress=False)
    got = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["completion"] for p in got] == [p["completion"] for p in expected]

    # --recipe-settings: the recipe's prompt and lengths, so other completions (the settings matter)
    other = tmp_path / "recipe"
    assert cli.main(["eval", "--quiet", "--recipe-settings", "--model", str(final), "--eval-data",
                     str(own_run["test_file"]), "--out", str(other)]) == 0
    captured = capsys.readouterr()
    assert "evaluating as the model was trained" not in captured.out
    assert "%|" not in captured.err  # --quiet: no loading or progress bars
    recipe = [json.loads(line) for line in (other / "predictions.jsonl").read_text().splitlines()]
    assert [p["completion"] for p in recipe] != [p["completion"] for p in got]


def test_two_option_questions_count_by_default_and_exclusions_are_named(own_run: dict, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    assert EvalConfig().min_options == 0
    preds = [{"id": "q4", "task": None, "problem_type": "multiple_choice", "n_options": 4, "score": 1.0},
             {"id": "q2", "task": None, "problem_type": "multiple_choice", "n_options": 2, "score": 0.0},
             {"id": "yn", "task": None, "problem_type": "yes_no", "n_options": 0, "score": 1.0}]
    every = summarize(preds)
    assert every["n"] == 3 and every["excluded"] == [] and every["by_task"] == {}  # no `task: None` row
    strict = summarize(preds, min_options=3, unreadable=[{"id": "bad", "reason": "unreadable media: x"}])
    assert strict["n"] == 1 and strict["accuracy"] == 1.0
    reasons = {e["id"]: e["reason"] for e in strict["excluded"]}
    assert set(reasons) == {"q2", "yn", "bad"} and "2 options, fewer than eval.min_options=3" in reasons["q2"]

    # the command names the left-out question with its reason, on the console and in metrics.json
    out = tmp_path / "eval3"
    assert cli.main(["eval", "--quiet", "--model", str(own_run["run"] / "final"), "--eval-data",
                     str(own_run["test_file"]), "--out", str(out), "eval.min_options=3"]) == 0
    printed = capsys.readouterr().out
    assert "not counted: 1 question(s), 2 options, fewer than eval.min_options=3" in printed and "two-options" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["excluded"] == [{"id": "two-options", "reason": "2 options, fewer than eval.min_options=3"}]
    assert metrics["n"] == metrics["n_total"] - 1
