"""Evaluation reports say what each problem type's number is (an open question's "accuracy" is token F1,
partial credit, not exact match)."""

from mmrl.cli.commands import _table
from mmrl.engine.evaluate import summarize
from rewards import get_reward


def test_each_problem_types_score_is_named_in_the_metrics_and_the_table() -> None:
    acc = get_reward("accuracy")
    score = acc(["<answer>the red ball</answer>"], problem_type=["open"], answer=["a red ball moves"])[0]
    assert 0 < score < 1  # partial credit: what the report must not call plain accuracy
    preds = [{"id": "o", "problem_type": "open", "score": score, "task": None, "options": None},
             {"id": "m", "problem_type": "multiple_choice", "score": 1.0, "task": None, "options": ["a", "b"]}]
    m = summarize(preds)
    assert "token F1" in m["scored_as"]["open"] and "1/0" in m["scored_as"]["multiple_choice"]
    line = next(row for row in _table({**m, "skipped": 0}).splitlines() if row.strip().startswith("open"))
    assert "token F1" in line and "not exact match" in line
