"""Held-out evaluation: greedy answers on a split, scored with the same answer matching as the rewards.

Accuracy is reported overall, per problem type, and per task (``meta.task``, for data that has tasks).
``min_options`` (``eval.min_options``, default 0: every question counts) restricts the headline ``accuracy``
to multiple-choice questions with at least that many options; the rest still count in the breakdowns.
Every question left out of the headline, and every one skipped for unreadable media, is named with its
reason in ``metrics["excluded"]`` (and on the console: :func:`describe_exclusions`).

**Checks** (:func:`register_check`): extra passes a method runs over the same questions, each adding fields
to the prediction rows and a section ``metrics[name]`` (ACRE's ``consistency``: :mod:`mmrl.methods.acre`;
T-GRPO's ``shuffled_frames``: :mod:`mmrl.methods.tgrpo`). ``mmrl eval --check NAME`` runs one; a method's
plug-in turns one on for every evaluation of a training run (``service.evaluation["checks"]``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm
from transformers import TrainerState

from mmrl.engine.service import RolloutService
from mmrl_common.errors import MediaError
from mmrl_common.registry import Registry
from rewards.accuracy import SCORED_AS


@dataclass(frozen=True)
class EvalCheck:
    """``run(service, samples, rows, *, max_new_tokens, **settings)`` adds its fields to the prediction
    ``rows`` of a batch of ``samples``; ``summarize(predictions)`` is its section of the metrics;
    ``describe(section)`` its lines of the console table (``mmrl eval``).

    ``benchmark(samples, rows, ask, **settings)`` (optional) is the same check on a public benchmark's
    questions (``mmrl eval --benchmark NAME --check NAME``), asked under the benchmark's own protocol:
    ``rows`` are the prediction records (``completion``, ``pred``: the benchmark's reading); ``ask(requests)``,
    with ``requests`` a list of ``(i, sample, prefix)`` (``samples[i]``'s media with ``sample``'s text, the
    answer forced to start with ``prefix``), answers each greedily and returns ``{"completion", "pred",
    "prompt"}`` per request: the answer (``prefix`` included), the benchmark's reading of it, and the prompt."""

    run: Callable[..., None]
    summarize: Callable[[Sequence[dict[str, Any]]], dict[str, Any]]
    describe: Callable[[dict[str, Any]], list[str]] | None = None
    benchmark: Callable[..., None] | None = None


CHECKS: Registry[EvalCheck] = Registry("evaluation check", "--check")


def score_text(v: Any) -> str:
    """A score as the console tables print it: three decimals, ``–`` for none."""
    return f"{v:.3f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def register_check(name: str, *, summarize: Callable[[Sequence[dict[str, Any]]], dict[str, Any]],
                   describe: Callable[[dict[str, Any]], list[str]] | None = None,
                   benchmark: Callable[..., None] | None = None,
                   ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator: register ``run`` (see :class:`EvalCheck`) as the evaluation check ``name``."""
    def deco(run: Callable[..., None]) -> Callable[..., None]:
        CHECKS.add(name, EvalCheck(run, summarize, describe, benchmark))
        return run
    return deco


@dataclass
class EvalProgress:
    """What an evaluation had done when a signal stopped it (:class:`EvalStopped`), or what a stopped one had
    done before (``evaluate(earlier=...)``): the prediction rows and the questions skipped as unreadable
    (``{"id", "reason"}``), each in the order of the questions."""

    predictions: list[dict[str, Any]]
    unreadable: list[dict[str, Any]]

    def ids(self) -> set[str]:
        return {str(r["id"]) for r in self.predictions} | {str(r["id"]) for r in self.unreadable}


class EvalStopped(Exception):
    """:func:`evaluate` stopped at a batch boundary when ``stop_requested`` said so: ``signum`` the signal,
    ``progress`` the questions answered before it (every rank's, in the order of the questions, on every rank)."""

    def __init__(self, signum: int, progress: EvalProgress):
        super().__init__(f"evaluation stopped by signal {signum}")
        self.signum, self.progress = signum, progress


def evaluate(
    service: RolloutService, samples: Sequence[Any], *, max_new_tokens: int = 64, batch_size: int = 16,
    min_options: int = 0, desc: str = "eval", skip_bad: bool | None = None, show_progress: bool = True,
    checks: Mapping[str, Mapping[str, Any]] | None = None, stop_requested: Callable[[], int] | None = None,
    earlier: EvalProgress | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy evaluation through the rollout service (the run's prompt, media and stop settings, so
    evaluation reads the same answer the rewards read); returns ``(metrics, predictions)``.

    Under torchrun each rank answers its contiguous share of ``samples`` and the predictions are gathered,
    in the order of ``samples``, so every rank returns the same metrics and predictions (every question
    answered exactly once); every rank must call it with the same samples.

    ``checks``: ``{name: settings}`` of registered checks to run too (None: ``service.evaluation["checks"]``,
    what the run's plug-ins turned on). ``skip_bad``: a question whose media cannot be decoded is left out (and
    counted in ``metrics["skipped"]``, named in ``metrics["excluded"]``) instead of stopping the evaluation with
    the file named; None: ``service.evaluation["skip_bad"]`` (``data.on_bad_sample=skip`` of the run's config,
    so ``mmrl eval`` and a training run's evaluations agree), else True.

    ``stop_requested`` (``mmrl eval``: a signal's number, 0 while none came) is read before each batch, every
    rank agreeing (the largest over ranks, the same number of times on each); when set, :class:`EvalStopped`
    carries the questions done so far. ``earlier``: what a stopped evaluation with these settings did; a batch
    whose questions it all holds is taken from it instead of answered again, so the batches answered are those
    of an evaluation never stopped and the result is the same."""
    from mmrl.engine.distributed import world
    from mmrl.engine.rollout import rollout_session
    from rewards import get_reward

    if checks is None:
        checks = service.evaluation.get("checks", {})
    if skip_bad is None:
        skip_bad = bool(service.evaluation.get("skip_bad", True))
    runs = {name: (CHECKS.get(name), dict(settings or {})) for name, settings in checks.items()}
    w = world()
    accuracy = get_reward("accuracy")
    predictions: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    tp = int(getattr(service.backend, "tensor_parallel_size", 1))  # a block of ranks shares one engine
    share = w.shard(samples, tp)
    rounds = None
    if stop_requested is not None:  # every rank polls as often as the largest share has batches
        import math

        _, count, _ = w.block(tp)
        rounds = math.ceil(math.ceil(len(samples) / count) / max(1, batch_size))
    bar = tqdm(total=len(share), desc=desc, unit="q", disable=not show_progress, leave=False)
    with rollout_session(service.backend):  # ZeRO-3: the weights gathered once; vLLM: the engine awake
        stopped = _answer(service, share, accuracy, predictions, unreadable, bar, max_new_tokens=max_new_tokens,
                          batch_size=batch_size, skip_bad=skip_bad, runs=runs, earlier=earlier,
                          stop_requested=(lambda: w.max_int(stop_requested())) if stop_requested else None,
                          rounds=rounds)
    bar.close()
    if w.active:  # every block's share, in the order of ``samples``
        parts = w.unshard([(predictions, unreadable)], tp)
        predictions = [p for part, _ in parts for p in part]
        unreadable = [u for _, part in parts for u in part]
    if stopped:
        raise EvalStopped(stopped, EvalProgress(predictions, unreadable))
    metrics = summarize(predictions, min_options=min_options, unreadable=unreadable)
    for name, (check, _) in runs.items():
        metrics[name] = check.summarize(predictions)
    return metrics, predictions


def _answer(service: RolloutService, samples: Sequence[Any], accuracy: Any, predictions: list[dict[str, Any]],
            unreadable: list[dict[str, Any]], bar: Any, *, max_new_tokens: int, batch_size: int, skip_bad: bool,
            runs: Mapping[str, tuple[EvalCheck, dict[str, Any]]], earlier: EvalProgress | None = None,
            stop_requested: Callable[[], int] | None = None, rounds: int | None = None) -> int:
    """Answer ``samples`` in batches, appending their prediction rows (and the unreadable ones); a batch whose
    questions ``earlier`` all holds is taken from it. With ``stop_requested``: read before each of ``rounds``
    batches (a rank whose share has fewer still reads it), and the signal's number returned when it asks to
    stop (0: every batch answered)."""
    done_rows = {str(r["id"]): r for r in earlier.predictions} if earlier else {}
    done_bad = {str(r["id"]): r for r in earlier.unreadable} if earlier else {}
    starts = range(0, len(samples), batch_size)
    for i in range(max(len(starts), rounds or 0)):
        if stop_requested is not None and (signum := stop_requested()):
            return signum
        if i >= len(starts):
            continue
        start = starts[i]
        chunk = list(samples[start:start + batch_size])
        if chunk and all(str(s.id) in done_rows or str(s.id) in done_bad for s in chunk):  # answered before
            for s in chunk:
                (predictions if str(s.id) in done_rows else unreadable).append(
                    done_rows.get(str(s.id)) or done_bad[str(s.id)])
            bar.update(len(chunk))
            continue
        kept = []
        for s in chunk:  # decode first, so one unreadable sample does not sink the batch
            try:
                service.preparer.prepare(s)
                kept.append(s)
            except MediaError as exc:
                if not skip_bad:
                    raise MediaError(exc.path, f"{exc.reason} (question {s.id}); data.on_bad_sample=skip leaves "
                                               "such questions out of the evaluation, counted as skipped") from None
                unreadable.append({"id": s.id, "reason": f"unreadable media: {exc}"})
        if kept:
            texts = [a[0].text for a in service.generate(kept, max_new_tokens=max_new_tokens)]
            scores = accuracy(texts, **reward_columns(kept))
            rows = [{"id": s.id, "task": s.meta.get("task"), "problem_type": s.problem_type,
                     "n_options": len(s.options or []), "answer": s.answer, "completion": text,
                     "score": float(score or 0.0)} for s, text, score in zip(kept, texts, scores)]
            for check, settings in runs.values():
                check.run(service, kept, rows, max_new_tokens=max_new_tokens, **settings)
            predictions.extend(rows)
        bar.update(len(chunk))
    return 0


def require_questions(samples: Sequence[Any], info: Mapping[str, Any]) -> None:
    """An evaluation file (``info``: :func:`mmrl.run.load_split`'s account of it) that leaves no question to
    evaluate is an error naming the file and why (no records, every record skipped, or filtered out by a
    setting), before anything is trained or loaded; a split without a file (none given) is not checked."""
    from mmrl_common.errors import DataError

    if samples or not info.get("path"):
        return
    where = f"data.{info.get('split', 'test')}: {info['path']}"
    left_out = {k: n for k, n in (info.get("left_out") or {}).items() if n}
    if left_out:
        why = "; ".join(f"{key} leaves out all {n}" for key, n in left_out.items())
        raise DataError(f"{where}: no question to evaluate: {why}; change {', '.join(left_out)} or give other "
                        "questions (--eval-data FILE)")
    if info.get("skipped"):
        raise DataError(f"{where}: no question to evaluate: all {info['skipped']} record(s) were bad and skipped "
                        "(data.on_bad_sample=skip; they are listed above); fix them or give other questions")
    raise DataError(f"{where}: no question to evaluate: the file holds no records; give a file of questions "
                    "(--eval-data FILE; mmrl data validate FILE checks one)")


def reward_columns(samples: Sequence[Any]) -> dict[str, list[Any]]:
    """The reward columns of a list of samples (TRL style: one list per field); built here only. ``media``: each
    sample's images and videos as ``{"type", "path"}`` (what a service reward sends, and keys its cache on)."""
    return {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
            "question": [s.question for s in samples], "options": [s.options for s in samples],
            "answer": [s.answer for s in samples], "meta": [s.meta for s in samples],
            "media": [[{"type": m.type, "path": str(m.path)} for m in s.media] for s in samples]}


def dataset_columns(samples: Sequence[Any]) -> dict[str, list[Any]]:
    """Each key of the samples' ``meta`` (where a record's extra columns are kept, e.g. TRL's ``solution``) as a
    column of its own, None where a sample lacks it: TRL passes every dataset column by its name."""
    keys = dict.fromkeys(k for s in samples for k in s.meta)
    return {k: [s.meta.get(k) for s in samples] for k in keys}


def prompt_messages(sample: Any, prompt: Any) -> list[dict[str, Any]]:
    """The chat messages of ``sample``'s prompt as TRL passes ``prompts`` for vision-language data: the
    run's template, with each image or video part naming its file (``{"type": "video", "video": path}``)."""
    from mmrl.engine.prompts import build_messages

    messages = build_messages(sample, prompt, [m.type for m in sample.media])
    parts = [p for m in messages if m["role"] == "user" for p in m["content"] if p["type"] in ("image", "video")]
    for part, item in zip(parts, sample.media):
        part[item.type] = item.path
    return messages


class RewardState(TrainerState):
    """``trainer_state`` for rewards: TRL passes transformers' ``TrainerState`` (``global_step``, ``max_steps``,
    ...); ``stage`` is the curriculum stage, and ``state["step"]`` / ``state["stage"]`` still read as keys."""

    def __init__(self, step: int, max_steps: int, stage: str):
        super().__init__(global_step=step, max_steps=max_steps, epoch=step / max(1, max_steps))
        self.stage = stage

    def __getitem__(self, key: str) -> Any:
        return {"step": self.global_step, "stage": self.stage}[key]


def rollout_reward_columns(batch: Any, prompt: Any, *, step: int, max_steps: int, stage: str
                           ) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """``(columns, dataset columns, conversational completions)`` for the rewards of a rollout batch: what
    TRL's ``GRPOTrainer`` passes (``prompts``, ``completion_ids``: the tokens the policy produced,
    ``trainer_state``, ``log_extra``/``log_metric``, every dataset column) plus mmrl's own (``transcript``,
    ``env_info``, ``entropies``, ``rollout_batch``; the trainer adds ``rollout_service``). ``log_extra``
    values land in ``batch.extra["reward_extra"]``, ``log_metric`` values in ``batch.extra["reward_metrics"]``
    (logged as ``reward_metric/<name>``)."""
    n = len(batch)
    messages_of: dict[int, list[dict[str, Any]]] = {}
    columns: dict[str, Any] = reward_columns(batch.samples)
    columns["prompts"] = [messages_of.setdefault(id(s), prompt_messages(s, prompt)) for s in batch.samples]
    columns["completion_ids"] = [[t for t, m in zip(seq.ids, batch.loss_mask[i].tolist()) if m > 0]
                                 for i, seq in enumerate(batch.seqs)]
    columns["transcript"] = ["\n".join(t) for t in batch.turns]
    columns["env_info"] = batch.env_info
    columns["entropies"] = None if batch.entropies is None else [
        batch.entropies[i][batch.loss_mask[i] > 0].tolist() for i in range(n)]
    columns["trainer_state"] = RewardState(step, max_steps, stage)
    columns["rollout_batch"] = batch
    columns["log_extra"] = lambda column, values: batch.extra.setdefault("reward_extra", {}).__setitem__(
        column, list(values))
    columns["log_metric"] = lambda name, value: batch.extra.setdefault("reward_metrics", {}).__setitem__(
        name, float(value))
    conversations = [[{"role": "assistant", "content": t} for t in turns] or [{"role": "assistant", "content": ""}]
                     for turns in batch.turns]
    return columns, dataset_columns(batch.samples), conversations


def headline_exclusion(p: dict[str, Any], min_options: int) -> str | None:
    """Why prediction ``p`` is left out of the headline accuracy (None: it counts)."""
    if min_options <= 0:
        return None
    if p["problem_type"] != "multiple_choice":
        return f"not multiple choice ({p['problem_type']}); eval.min_options={min_options} counts multiple choice only"
    if p["n_options"] < min_options:
        return f"{p['n_options']} options, fewer than eval.min_options={min_options}"
    return None


def summarize(predictions: list[dict[str, Any]], *, min_options: int = 0,
              unreadable: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Accuracy over the predictions; ``excluded`` names every question left out of it (``unreadable``:
    the questions skipped before generation, ``{"id", "reason"}``)."""
    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    headline: list[float] = []
    excluded: list[dict[str, Any]] = []
    for p in predictions:
        why = headline_exclusion(p, min_options)
        if why is None:
            headline.append(p["score"])
        else:
            excluded.append({"id": p["id"], "reason": why})
    by_type: dict[str, list[float]] = defaultdict(list)
    by_task: dict[str, list[float]] = defaultdict(list)
    for p in predictions:
        by_type[p["problem_type"]].append(p["score"])
        if p["task"] is not None:
            by_task[str(p["task"])].append(p["score"])
    return {
        "accuracy": mean(headline),
        "n": len(headline),
        "n_total": len(predictions),
        "skipped": len(unreadable),
        "min_options": min_options,
        "excluded": [*excluded, *unreadable],
        "by_problem_type": {k: mean(v) for k, v in sorted(by_type.items())},
        "scored_as": {k: SCORED_AS.get(k, "the accuracy reward's score") for k in sorted(by_type)},
        "by_task": {k: mean(v) for k, v in sorted(by_task.items())},
    }


def describe_exclusions(metrics: dict[str, Any], shown: int = 10) -> list[str]:
    """Console lines naming the questions left out of the accuracy, one line per reason."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for e in metrics.get("excluded") or []:
        by_reason[e["reason"]].append(str(e["id"]))
    lines = []
    for reason, ids in by_reason.items():
        more = f" and {len(ids) - shown} more (metrics.json lists them)" if len(ids) > shown else ""
        hint = " (eval.min_options=0 counts them)" if "eval.min_options" in reason else ""
        lines.append(f"  not counted: {len(ids)} question(s), {reason}{hint}: {', '.join(ids[:shown])}{more}")
    return lines
