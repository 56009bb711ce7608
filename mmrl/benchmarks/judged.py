"""Open-ended benchmark questions scored by a judge model (``mmrl eval --benchmark mmvu --judge BASE_URL,MODEL``).

The judge is :mod:`rewards.judge`'s: the same OpenAI-compatible request, prompt templates, score rule, retries
and cache (here the replies are kept in the evaluation folder's ``reward_cache/``, so a resumed evaluation asks
again nothing it was answered). Each open question's whole answer is judged against its reference with the
``open`` template; a question the judge gives no score is named, counted (``failed``) and left out of the
open-ended accuracy, never counted 0. The report names the judge's endpoint, model, score rule and prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmrl_common.errors import ConfigError

__all__ = ["judge_flag", "judge_open", "open_stats", "prepare_judge"]


def judge_flag(value: str | None, key_env: str | None = None) -> dict[str, Any] | None:
    """The judge's settings from ``--judge BASE_URL,MODEL`` (and ``--judge-key-env NAME``); None without it."""
    if not value:
        return None
    url, sep, model = value.partition(",")
    if not sep or not url.strip() or not model.strip():
        raise ConfigError(f"--judge {value!r}: give BASE_URL,MODEL, e.g. --judge http://127.0.0.1:8000/v1,"
                          "Qwen/Qwen2.5-7B-Instruct (the OpenAI-compatible endpoint and the model it serves)")
    out: dict[str, Any] = {"base_url": url.strip(), "model": model.strip()}
    if key_env:
        out["api_key_env"] = key_env
    return out


def prepare_judge(judge: Mapping[str, Any]) -> Any:
    """The judge's checked settings, the endpoint reached and the model found before any model loads."""
    from rewards.judge import JudgeSettings, check_judge

    settings = JudgeSettings(judge, "--judge")
    check_judge(settings, setting="--judge")
    return settings


def judge_open(preds: Sequence[dict[str, Any]], samples: Sequence[Any], settings: Any, out: Path) -> None:
    """Score each open-ended prediction with the judge: ``judge_score`` (0..1), or ``judge_error``."""
    from rewards.remote import set_run_dir

    by_id = {s.id: s for s in samples}
    todo = [p for p in preds if p.get("problem_type") == "open" and not p.get("error") and p["id"] in by_id]
    if not todo:
        return
    items = [{"id": p["id"], "question": by_id[p["id"]].question, "options": [], "completion": p.get("completion") or "",
              "answer": by_id[p["id"]].answer, "problem_type": "open"} for p in todo]
    metrics: dict[str, float] = {}
    set_run_dir(out)  # the replies cached in the evaluation folder
    try:
        scores = settings.client()(items, metrics.__setitem__)
    finally:
        set_run_dir(None)
    for p, score in zip(todo, scores):
        p.pop("judge_error", None)
        if score is None:
            p["judge_error"] = "the judge gave no score (see the line on stderr)"
            p["judge_score"] = None
        else:
            p["judge_score"] = score
            p["correct"] = score >= 1.0


def open_stats(preds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``n`` open questions, ``judged`` (a score came back), ``failed`` (none did, or no readable media) and
    ``accuracy``: the mean judge score over the judged ones."""
    judged = [float(p["judge_score"]) for p in preds if p.get("judge_score") is not None]
    return {"n": len(preds), "judged": len(judged), "failed": len(preds) - len(judged),
            "accuracy": sum(judged) / len(judged) if judged else None}
