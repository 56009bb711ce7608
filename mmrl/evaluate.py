"""Held-out evaluation: greedy answers on a split, scored with the same answer matching as the rewards.

Accuracy is reported overall, per problem type, and per task (``meta.task``). ``min_options`` restricts the
headline ``accuracy`` to multiple-choice questions with at least that many options (the rest still count
in the breakdowns).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from mmrl.service import RolloutService
from mmrl_common.errors import MediaError


def evaluate(
    service: RolloutService, samples: Sequence[Any], *, max_new_tokens: int = 64, batch_size: int = 16,
    min_options: int = 0, desc: str = "eval", skip_bad: bool = True, show_progress: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy evaluation through the rollout service (the run's prompt, media and stop settings, so
    evaluation reads the same answer the rewards read); returns ``(metrics, predictions)``."""
    from rewards import get_reward

    accuracy = get_reward("accuracy")
    predictions: list[dict[str, Any]] = []
    skipped = 0
    bar = tqdm(total=len(samples), desc=desc, unit="q", disable=not show_progress, leave=False)
    for start in range(0, len(samples), batch_size):
        chunk = list(samples[start:start + batch_size])
        kept = []
        for s in chunk:  # decode first, so one unreadable sample does not sink the batch
            try:
                service.preparer.prepare(s)
                kept.append(s)
            except MediaError:
                if not skip_bad:
                    raise
                skipped += 1
        if kept:
            texts = [a[0].text for a in service.generate(kept, max_new_tokens=max_new_tokens)]
            scores = accuracy(texts, **reward_columns(kept))
            for s, text, score in zip(kept, texts, scores):
                predictions.append({"id": s.id, "task": s.meta.get("task"), "problem_type": s.problem_type,
                                    "n_options": len(s.options or []), "answer": s.answer,
                                    "completion": text, "score": float(score or 0.0)})
        bar.update(len(chunk))
    bar.close()
    return summarize(predictions, min_options=min_options, skipped=skipped), predictions


def reward_columns(samples: Sequence[Any]) -> dict[str, list[Any]]:
    """The reward columns of a list of samples (TRL style: one list per field); built here only."""
    return {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
            "question": [s.question for s in samples], "options": [s.options for s in samples],
            "answer": [s.answer for s in samples], "meta": [s.meta for s in samples]}


def summarize(predictions: list[dict[str, Any]], *, min_options: int = 0, skipped: int = 0) -> dict[str, Any]:
    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    headline = [p["score"] for p in predictions
                if min_options <= 0 or (p["problem_type"] == "multiple_choice" and p["n_options"] >= min_options)]
    by_type: dict[str, list[float]] = defaultdict(list)
    by_task: dict[str, list[float]] = defaultdict(list)
    for p in predictions:
        by_type[p["problem_type"]].append(p["score"])
        by_task[str(p["task"])].append(p["score"])
    return {
        "accuracy": mean(headline),
        "n": len(headline),
        "n_total": len(predictions),
        "skipped": skipped,
        "min_options": min_options,
        "by_problem_type": {k: mean(v) for k, v in sorted(by_type.items())},
        "by_task": {k: mean(v) for k, v in sorted(by_task.items())},
    }
