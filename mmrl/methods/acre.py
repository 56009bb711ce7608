"""ACRE (arXiv 2510.10104): the ``acre`` reward, the ``consistency`` evaluation check and the
``eval_consistency`` plug-in; ``imports: [mmrl.methods.acre]``.

The reward and the check ask the policy again, through the rollout service, with the options of each
multiple-choice question shuffled, the policy continuing its own first reasoning trace; the cases, their
values, the permutations and the consistency rate are pure formulas in :mod:`rewards.consistency` (read
there for the method and its settings).

* the ``acre`` reward -- the case value of each rollout (settings: :mod:`rewards.consistency`);
* the ``acre_reanswer`` environment -- the second pass as the episode's second turn, so that the re-answer's
  tokens are trained too (``rollout.environment: acre_reanswer``, ``rollout.max_turns: 2``; the paper does not
  say whether its second pass is trained: the default, a greedy re-ask through the service with no gradient,
  and this switch are our choices); the reward then reads both answers from the episode;
* the ``consistency`` evaluation check (``mmrl eval --check consistency``; the ``eval_consistency`` plug-in
  runs it in every evaluation of a training run): ``metrics["consistency"]`` holds the option-shuffling
  consistency rate (``oscr``), the share of each case, the accuracy under the shuffled order and the
  answer-letter balance (``top_letter_share`` of the most frequent predicted letter, its share among the
  gold answers, and the gap between the two).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from mmrl.engine.environments import Environment, Observation, register_environment
from mmrl.engine.evaluate import register_check, score_text
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.engine.prompts import format_options
from mmrl.engine.service import Ask, RolloutService
from mmrl_common.errors import ConfigError
from rewards.accuracy import score_answer
from rewards.answers import extract_answer, extract_choice, normalize_gold_choice
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
    reasoning_trace,
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
    # episodes of the acre_reanswer environment carry their second pass (trained): read it there
    infos = [(info or {}).get("acre") for info in (columns.get("env_info") or [None] * n)]
    trained = {i: info for i, info in enumerate(infos) if info is not None and golds[i] is not None}
    if _setting(columns, "train_second_pass", False, n) and not trained and any(g is not None for g in golds):
        raise ConfigError("acre reward: train_second_pass=true trains the re-answer as the episode's second turn: "
                          "set rollout.environment=acre_reanswer and rollout.max_turns=2 (the episodes carry no "
                          "second pass now)")
    for i, info in trained.items():
        firsts[i], perms[i] = info["first"], None
    seconds = reask_shuffled(service, samples, texts, perms, reuse_trace=bool(_setting(columns, "reuse_trace", True, n)),
                             greedy=bool(_setting(columns, "greedy", True, n)),
                             max_new_tokens=_setting(columns, "max_new_tokens", None, n), think_tag=think_tag,
                             answer_tag=answer_tag)
    for i, info in trained.items():
        turns = batch.turns[i] if hasattr(batch, "turns") else []
        seconds[i] = reanswer_letter(turns[1] if len(turns) > 1 else None, samples[i].options, info["perm"],
                                     think_tag=think_tag, answer_tag=answer_tag)
        perms[i] = info["perm"]

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


def reanswer_letter(turn: str | None, options: Sequence[Any], perm: Sequence[int] | None, *,
                    think_tag: str = "think", answer_tag: str = "answer") -> str | None:
    """The option a re-answer turn names, in the original lettering (None: no turn, no permutation, or no
    readable letter)."""
    if turn is None or perm is None:
        return None
    letter = extract_choice(extract_answer(turn, tag=answer_tag, think_tag=think_tag),
                            shuffle_options(list(options), perm))
    return from_shuffled_letter(letter, perm)


@register_environment("acre_reanswer")
class ReanswerEnvironment(Environment):
    """ACRE's second pass as a second turn: after the first answer the policy sees the same options in another
    order and answers again, with its first turn (its reasoning) in context; that turn is the policy's own, so
    it is trained with the episode's advantage. ``info["acre"]`` keeps the first answer and the permutation for
    the ``acre`` reward. Settings (``rollout.environment_kwargs``): ``seed``, ``exclude_identity``,
    ``think_tag``, ``answer_tag``. Each episode of a question draws its own permutation (the question's
    episode count in this process, with ``seed``)."""

    _episodes: ClassVar[dict[str, int]] = {}

    def __init__(self, sample: Any, media: list[Any], *, seed: int = 0, exclude_identity: bool = False,
                 think_tag: str = "think", answer_tag: str = "answer", **kwargs: Any):
        super().__init__(sample, media)
        self.seed, self.exclude_identity = int(seed), bool(exclude_identity)
        self.think_tag, self.answer_tag = think_tag, answer_tag
        key = str(sample.id)
        self.index = ReanswerEnvironment._episodes.get(key, 0)
        ReanswerEnvironment._episodes[key] = self.index + 1

    def step(self, action: str) -> Observation | None:
        if "acre" in self.info or not is_multiple_choice(self.sample):
            return None
        options = list(self.sample.options)
        first = first_answer(action, options, answer_tag=self.answer_tag, think_tag=self.think_tag)
        self.info["acre"] = {"first": first, "perm": None}
        if first is None:  # nothing to re-answer: the episode ends (the case is "unanswered")
            return None
        perm = draw_permutation(len(options), random.Random(f"acre-env:{self.seed}:{self.sample.id}:{self.index}"),
                                exclude_identity=self.exclude_identity)
        self.info["acre"]["perm"] = perm
        return Observation(text=("The same question with its options in another order:\n"
                                 f"{format_options(shuffle_options(options, perm))}\n"
                                 f"Answer again from your reasoning: the letter in <{self.answer_tag}>"
                                 f"</{self.answer_tag}>."))


# --------------------------------------------------------------------------------------------------------
# The evaluation check and its plug-in
# --------------------------------------------------------------------------------------------------------


@register_check("consistency", summarize=lambda predictions: summarize_consistency(predictions),
                describe=lambda section: describe_consistency(section),
                benchmark=lambda *a, **kw: consistency_on_benchmark(*a, **kw))
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


def consistency_on_benchmark(samples: Sequence[Any], rows: list[dict[str, Any]], ask: Callable[..., Any], *,
                             seed: int = 0, exclude_identity: bool = True, reuse_trace: bool = True) -> None:
    """The option-shuffling check on a benchmark's multiple-choice questions, under its own protocol
    (``mmrl eval --benchmark NAME --consistency``): each question the benchmark read a letter from is asked
    again with its options in another order (re-lettered as the benchmark letters them; the permutation drawn
    as in :func:`consistency_check`), greedy; when the first answer held a reasoning trace (a ``<think>``
    template) and ``reuse_trace``, the second answer continues it, else the question is simply asked again.
    The rows gain ``letter``, ``gold_letter``, ``permutation``, ``shuffled_letter`` (original lettering),
    ``shuffled_completion`` (the continued trace included), ``shuffled_prompt`` and ``case``."""
    from mmrl.benchmarks.protocols import shuffled_options

    requests = []
    for i, (s, row) in enumerate(zip(samples, rows)):
        if not is_multiple_choice(s):
            continue
        row["gold_letter"] = normalize_gold_choice(s.answer, s.options)
        row["letter"] = row.get("pred")
        perm = draw_permutation(len(s.options), rollout_rng(seed, 0, s.id, 0), exclude_identity=exclude_identity)
        row["permutation"] = perm
        if row["letter"] is None:
            continue
        trace = reuse_trace and reasoning_trace(row["completion"] or "") is not None
        prefix = second_pass_prefix(row["completion"]) if trace else ""
        requests.append((i, dataclasses.replace(s, options=shuffled_options(list(s.options), perm)), prefix))
    for (i, _, _), answer in zip(requests, ask(requests)):
        rows[i].update(shuffled_letter=from_shuffled_letter(answer["pred"], rows[i]["permutation"]),
                       shuffled_completion=answer["completion"], shuffled_prompt=answer["prompt"])
    for row in rows:
        if "gold_letter" in row:
            row.setdefault("shuffled_letter", None)
            row["case"] = consistency_case(row["letter"], row["shuffled_letter"], row["gold_letter"])


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
