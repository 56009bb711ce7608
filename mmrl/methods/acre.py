"""ACRE (arXiv 2510.10104): the ``acre`` reward, the ``consistency`` evaluation check and the
``eval_consistency`` plug-in; ``imports: [mmrl.methods.acre]``.

The reward and the check ask the policy again, through the rollout service, with the options of each
multiple-choice question shuffled, the policy continuing its own first reasoning trace; the cases, their
values, the permutations and the consistency rate are pure formulas in :mod:`rewards.consistency` (read
there for the method and its settings).

* the ``acre`` reward -- the case value of each rollout (settings: :mod:`rewards.consistency`);
* the ``consistency`` evaluation check (``mmrl eval --check consistency``; the ``eval_consistency`` plug-in
  runs it in every evaluation of a training run): ``metrics["consistency"]`` holds the option-shuffling
  consistency rate (``oscr``), the share of each case, the accuracy under the shuffled order and the
  answer-letter balance (``top_letter_share`` of the most frequent predicted letter, its share among the
  gold answers, and the gap between the two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmrl.evaluate import register_check, score_text
from mmrl.plugins import Callback, register_plugin
from mmrl.service import Ask, RolloutService
from mmrl_common.errors import ConfigError
from rewards.accuracy import score_answer
from rewards.answers import extract_answer, normalize_gold_choice
from rewards.consistency import (
    MODES,
    case_shares,
    consistency_case,
    draw_permutation,
    first_answer,
    from_shuffled_letter,
    is_multiple_choice,
    letter_balance,
    oscr,
    resolve_values,
    rollout_rng,
    second_pass_prefix,
    shuffle_options,
)
from rewards.registry import normalize_completions, register_reward


def reask_shuffled(service: Any, samples: Sequence[Any], completions: Sequence[str],
                   perms: Sequence[Sequence[int] | None], *, reuse_trace: bool = True, greedy: bool = True,
                   max_new_tokens: int | None = None, think_tag: str = "think", answer_tag: str = "answer",
                   ) -> list[str | None]:
    """The second answers, in the **original** lettering: for each ``perms[i]`` that is not None, the policy
    (through ``service``: eval mode, no gradient) sees ``samples[i]`` with its options shuffled by
    ``perms[i]`` and continues ``completions[i]``'s reasoning trace; None where no pass was asked or the
    answer names no option. One generate call for the whole list."""
    todo = [i for i, p in enumerate(perms) if p is not None]
    out: list[str | None] = [None] * len(samples)
    if not todo:
        return out
    asks = [Ask(options=shuffle_options(samples[i].options, perms[i]),
                prefix=second_pass_prefix(completions[i], reuse_trace=reuse_trace, think_tag=think_tag,
                                          answer_tag=answer_tag)) for i in todo]
    answers = service.generate([samples[i] for i in todo], asks, greedy=greedy, max_new_tokens=max_new_tokens)
    for i, group in zip(todo, answers):
        out[i] = from_shuffled_letter(group[0].answer, perms[i])
    return out


# --------------------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------------------


def _setting(kwargs: Mapping[str, Any], key: str, default: Any, n: int) -> Any:
    """A reward setting; a per-sample list of that name is a dataset column, not the setting."""
    value = kwargs.get(key, default)
    if value is None or (isinstance(value, (list, tuple)) and len(value) == n):
        return default
    return value


@register_reward("acre", locate_errors=False)
def acre_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """ACRE's consistency reward (see the module docstring for the cases and settings)."""
    texts = normalize_completions(completions)
    n = len(texts)
    service, batch = columns.get("rollout_service"), columns.get("rollout_batch")
    if service is None or batch is None:
        raise ConfigError("the 'acre' reward re-asks the policy through the rollout service; it runs inside "
                          "`mmrl train` (the rollout_service and rollout_batch columns are missing)")
    values = resolve_values(_setting(columns, "values", None, n))
    mode = _setting(columns, "mode", "replace", n)
    if mode not in MODES:
        raise ConfigError(f"acre reward: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if _setting(columns, "train_second_pass", False, n):
        raise ConfigError("acre reward: train_second_pass=true (training the re-answer tokens too) is not "
                          "available yet: the engine has no extension point that adds the second pass's tokens to "
                          "the step's batch; leave it false (the second pass is scored, not trained)")
    exclude_identity = bool(_setting(columns, "exclude_identity", False, n))
    seed = int(_setting(columns, "shuffle_seed", 0, n))
    think_tag, answer_tag = _setting(columns, "think_tag", "think", n), _setting(columns, "answer_tag", "answer", n)
    state = columns.get("trainer_state")
    step = int(getattr(state, "global_step", 0) or 0)
    samples = list(batch.samples)
    if len(samples) != n:
        raise ConfigError(f"acre reward: {n} completions but the rollout batch holds {len(samples)} samples")

    firsts: list[str | None] = [None] * n
    golds: list[str | None] = [None] * n
    perms: list[list[int] | None] = [None] * n
    for i, (text, sample) in enumerate(zip(texts, samples)):
        if not is_multiple_choice(sample):
            continue
        golds[i] = normalize_gold_choice(sample.answer, sample.options)
        firsts[i] = first_answer(text, sample.options, answer_tag=answer_tag, think_tag=think_tag)
        if firsts[i] is not None:
            perms[i] = draw_permutation(len(sample.options), rollout_rng(seed, step, sample.id, i),
                                        exclude_identity=exclude_identity)
    seconds = reask_shuffled(service, samples, texts, perms, reuse_trace=bool(_setting(columns, "reuse_trace", True, n)),
                             greedy=bool(_setting(columns, "greedy", True, n)),
                             max_new_tokens=_setting(columns, "max_new_tokens", None, n), think_tag=think_tag,
                             answer_tag=answer_tag)

    out: list[float | None] = []
    cases: list[str] = []
    for i, (text, sample) in enumerate(zip(texts, samples)):
        if golds[i] is None:  # not multiple choice: the plain accuracy
            row = {"problem_type": sample.problem_type, "answer": sample.answer, "options": sample.options,
                   "meta": sample.meta, "id": sample.id}
            out.append(score_answer(extract_answer(text, tag=answer_tag, think_tag=think_tag), row))
            continue
        case = consistency_case(firsts[i], seconds[i], golds[i])
        cases.append(case)
        value = values[case]
        if mode == "add":
            value += float(firsts[i] == golds[i])
        out.append(value)

    log = columns.get("log_metric")
    if callable(log) and cases:
        rate = oscr(cases)
        if rate is not None:
            log("acre/oscr", rate)
        for case, share in case_shares(cases).items():
            log(f"acre/{case}", share)
        asked = [i for i in range(n) if perms[i] is not None]
        if asked:
            log("acre/shuffled_accuracy", sum(seconds[i] == golds[i] for i in asked) / len(asked))
            log("acre/identity_share", sum(perms[i] == sorted(perms[i]) for i in asked) / len(asked))
    return out


# --------------------------------------------------------------------------------------------------------
# The evaluation check and its plug-in
# --------------------------------------------------------------------------------------------------------


@register_check("consistency", summarize=lambda predictions: summarize_consistency(predictions),
                describe=lambda section: describe_consistency(section))
def consistency_check(service: RolloutService, samples: Sequence[Any], rows: list[dict[str, Any]], *,
                      max_new_tokens: int = 64, seed: int = 0, exclude_identity: bool = True,
                      reuse_trace: bool = True) -> None:
    """ACRE's option-shuffling check on the multiple-choice questions among ``samples`` (their prediction
    ``rows`` gain ``letter``, ``gold_letter``, ``permutation``, ``shuffled_letter`` and ``case``): each is
    asked again, greedy, with its options shuffled (one permutation per question, drawn from ``seed`` and the
    question id; never the unshuffled order unless ``exclude_identity=False``), continuing its first reasoning
    trace (``reuse_trace``); the second answer is mapped back to the original lettering."""
    perms: list[list[int] | None] = []
    for s, row in zip(samples, rows):
        if not is_multiple_choice(s):
            perms.append(None)
            continue
        row["gold_letter"] = normalize_gold_choice(s.answer, s.options)
        row["letter"] = first_answer(row["completion"], s.options)
        perm = draw_permutation(len(s.options), rollout_rng(seed, 0, s.id, 0), exclude_identity=exclude_identity)
        row["permutation"] = perm
        perms.append(perm if row["letter"] is not None else None)
    seconds = reask_shuffled(service, samples, [r["completion"] for r in rows], perms, reuse_trace=reuse_trace,
                             max_new_tokens=max_new_tokens)
    for row, second in zip(rows, seconds):
        if "gold_letter" in row:
            row["shuffled_letter"] = second
            row["case"] = consistency_case(row["letter"], second, row["gold_letter"])


def describe_consistency(c: dict[str, Any]) -> list[str]:
    """The check's lines of the ``mmrl eval`` table."""
    f = score_text
    rows = [(f"option-shuffling consistency (OSCR) {f(c['oscr'])} on {c['n']} multiple-choice questions; "
             f"accuracy with shuffled options {f(c['shuffled_accuracy'])}"),
            "  " + "  ".join(f"{k} {f(v)}" for k, v in c["cases"].items())]
    if c.get("top_letter"):
        rows.append(f"  most frequent answer letter {c['top_letter']}: {f(c['top_letter_share'])} of the answers "
                    f"(gold {f(c['top_letter_gold_share'])}, gap {f(c['top_letter_gap'])})")
    return rows


def summarize_consistency(predictions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The option-shuffling metrics over the predictions that went through :func:`consistency_check`."""
    rows = [p for p in predictions if "case" in p]
    cases = [p["case"] for p in rows]
    return {"n": len(rows), "oscr": oscr(cases), "cases": case_shares(cases),
            "shuffled_accuracy": sum(p["shuffled_letter"] == p["gold_letter"] for p in rows) / len(rows)
            if rows else None,
            **letter_balance([p["letter"] for p in rows], [p["gold_letter"] for p in rows])}


@register_plugin("eval_consistency")
class EvalConsistency(Callback):
    """``plugins: {eval_consistency: {}}``: every held-out evaluation of the run (before, during and after RL)
    also runs the option-shuffling check (:func:`consistency_check`, the ``consistency`` evaluation check; settings ``seed`` (0),
    ``exclude_identity`` (true), ``reuse_trace`` (true)); its numbers land in ``metrics["consistency"]``, so
    ``summary.json`` and ``mmrl compare`` read e.g. ``eval_after_rl.consistency.oscr``."""

    SETTINGS = ("seed", "exclude_identity", "reuse_trace")

    def __init__(self, ctx: Any, **settings: Any):
        super().__init__(ctx, **settings)
        ctx.service.evaluation.setdefault("checks", {})["consistency"] = dict(settings)
