"""Scoring: one prediction at a time (:func:`score_item`), then the benchmark's breakdowns (:func:`summarize`).

Multiple choice: the letter :func:`rewards.answers.extract_choice` reads from the answer part of the output
(after :func:`~rewards.answers.extract_answer`). An output with no readable letter is *unparsed*. Each
benchmark's **headline** is the figure its literature prints (its spec's ``headline``), and the other conventions
stand beside it (``beside``), each named (:data:`CONVENTIONS`; each benchmark's module cites its sources):

* ``accuracy`` — every question; unparsed answers and questions whose media failed count as wrong.
* ``accuracy_answered`` — only the questions with a readable answer (Video-MME's official scorer).
* ``task_mean`` — the mean of the per-task accuracies (MVBench papers and leaderboard).
* ``random_unparsed`` — lmms-eval's LongVideoBench rule, a random option for an unparsed answer, as its
  expected value (each unparsed question adds 1/number of options), so it needs no random seed.

Closed and open questions (a spec with ``scoring="closed_open"``: VQA-RAD, PathVQA, SLAKE; LLaVA-Med's
metrics, microsoft/LLaVA-Med ``llava/eval/run_eval_batch.py`` and ``llava/eval/eval_metrics/``): closed
questions — ``accuracy`` (yes/no read by :func:`~rewards.answers.extract_yes_no`; other closed answers by
normalised exact match) and LLaVA-Med's
``hit`` (the normalised reference is a substring of the normalised output). Open questions — LLaVA-Med's
``recall`` / ``precision`` / ``f1`` (:func:`rewards.metrics.llava_med_overlap`), SQuAD ``token_f1``,
``bleu1`` (NLTK BLEU-1) and ``exact``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from data_pipelines.benchmarks import get_benchmark
from rewards.answers import (
    extract_answer,
    extract_choice,
    extract_yes_no,
    normalize_gold_yes_no,
    normalize_text,
)
from rewards.metrics import bleu1, llava_med_overlap, token_f1

CONVENTIONS: dict[str, str] = {
    "accuracy": "every question; unparsed answers and failed media count as wrong",
    "accuracy_answered": "answered questions only (unparsed answers left out, as Video-MME's official scorer does)",
    "task_mean": "mean of the per-task accuracies (MVBench papers and leaderboard 'Avg')",
    "overall_share": "correct / all questions over every task (MVBench notebook; equals the task mean when "
                     "every task has the same number of questions)",
    "random_unparsed": "lmms-eval's rule: a random option for each unparsed answer, as its expected value",
}


def response_text(completion: str, prefill: str) -> str:
    """What the official scorer reads: with MVBench's ``Best option:(`` pre-fill, ``"(" +`` the first line."""
    if prefill.endswith("("):
        return "(" + completion.split("\n")[0]
    return completion


def score_item(sample: Any, completion: str, *, benchmark: str, prefill: str = "") -> dict[str, Any]:
    """Score one output; returns ``pred``, ``parsed``, ``correct`` and, for open questions, text metrics."""
    text = response_text(completion, prefill)
    answer = extract_answer(text)
    pt = sample.problem_type
    medical = get_benchmark(benchmark).scoring == "closed_open"
    if pt == "multiple_choice":
        pred = extract_choice(answer, sample.options)
        return {"pred": pred, "parsed": pred is not None, "correct": pred == str(sample.answer).upper(),
                "n_options": len(sample.options or [])}
    if pt == "yes_no":
        gold = normalize_gold_yes_no(sample.answer)
        pred = extract_yes_no(answer)
        out: dict[str, Any] = {"pred": pred, "parsed": pred is not None, "correct": pred == gold}
        if medical:
            out["hit"] = normalize_text(gold) in normalize_text(answer)
        return out
    if medical:
        gold = str(sample.answer)
        p, r, f = llava_med_overlap(answer, gold)
        exact = normalize_text(answer) == normalize_text(gold)
        out = {"pred": answer, "parsed": bool(answer.strip()), "recall": r, "precision": p, "f1": f,
               "token_f1": token_f1(answer, gold), "bleu1": bleu1(answer, gold), "exact": exact}
        if sample.meta.get("answer_type") == "closed":
            out.update(correct=exact, hit=bool(normalize_text(gold)) and normalize_text(gold) in normalize_text(answer))
        return out
    # the toy world's other question types: the training accuracy reward
    from rewards import get_reward

    score = get_reward("accuracy")([completion], problem_type=[pt], options=[sample.options],
                                   answer=[sample.answer], question=[sample.question], meta=[sample.meta],
                                   id=[sample.id])[0]
    return {"pred": answer, "parsed": score is not None, "correct": bool(score and score >= 1.0),
            "score": float(score or 0.0)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def mc_stats(preds: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(preds)
    correct = sum(1 for p in preds if p.get("correct"))
    answered = sum(1 for p in preds if p.get("parsed"))
    guess = sum(1.0 / p["n_options"] for p in preds if not p.get("parsed") and p.get("n_options"))
    return {"n": n, "correct": correct, "answered": answered, "unparsed": n - answered,
            "errors": sum(1 for p in preds if p.get("error")),
            "accuracy": _ratio(correct, n), "accuracy_answered": _ratio(correct, answered),
            "random_unparsed": _ratio(correct + guess, n)}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def medical_stats(preds: list[dict[str, Any]]) -> dict[str, Any]:
    closed = [p for p in preds if p.get("answer_type") == "closed"]
    open_ = [p for p in preds if p.get("answer_type") == "open"]
    c = mc_stats(closed)
    c["hit"] = _mean([float(bool(p.get("hit"))) for p in closed])
    o = {"n": len(open_)}
    for key in ("recall", "precision", "f1", "token_f1", "bleu1", "exact"):
        o[key] = _mean([float(p.get(key) or 0.0) for p in open_])
    return {"closed": c, "open": o, "errors": sum(1 for p in preds if p.get("error"))}


def summarize(benchmark: str, preds: list[dict[str, Any]], judge: dict[str, Any] | None = None) -> dict[str, Any]:
    """Metrics over prediction records (as written to ``predictions.jsonl``), as ``benchmark``'s spec says:
    its scoring, breakdowns, headline and the conventions beside it. ``judge`` (the judge's description, with
    ``mmrl eval --judge``): the open-ended questions are scored apart (``open_ended``, judged), the headline stays
    the multiple-choice one, and ``judge`` names the judge beside them."""
    spec = get_benchmark(benchmark)
    opened: list[dict[str, Any]] = []
    if judge is not None:
        opened = [p for p in preds if p.get("problem_type") == "open"]
        preds = [p for p in preds if p.get("problem_type") != "open"]
    groups = spec.breakdowns
    if spec.scoring == "closed_open":
        out: dict[str, Any] = medical_stats(preds)
        out["official_metric"] = "closed.hit (LLaVA-Med closed accuracy), open.recall"
        out["headline"] = {"closed_accuracy": out["closed"]["accuracy"], "closed_hit": out["closed"]["hit"],
                           "open_recall": out["open"]["recall"]}
        for g in groups:
            by = defaultdict(list)
            for p in preds:
                by[str(p.get("group", {}).get(g))].append(p)
            out[f"by_{g}"] = {k: medical_stats(v) for k, v in sorted(by.items())}
        return out
    out = {"overall": mc_stats(preds)}
    for g in groups:
        by = defaultdict(list)
        for p in preds:
            by[str(p.get("group", {}).get(g))].append(p)
        out[f"by_{g}"] = {k: mc_stats(v) for k, v in sorted(by.items())}
    values = dict(out["overall"])
    if spec.task_mean_over is not None:
        accs = [v["accuracy"] for v in out[f"by_{spec.task_mean_over}"].values() if v["accuracy"] is not None]
        values["task_mean"] = out["task_mean"] = _mean(accs)
        values["overall_share"] = out["overall"]["accuracy"]
    metric, why = spec.headline
    out["headline"] = {"metric": metric, "value": values.get(metric), "convention": CONVENTIONS[metric],
                       "why": why}
    out["beside"] = {k: {"value": values.get(k), "convention": CONVENTIONS[k]} for k in spec.beside}
    if judge is not None:
        from mmrl.benchmarks.judged import open_stats

        out["open_ended"] = open_stats(opened)
        out["judge"] = judge
    return out
