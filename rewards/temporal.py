"""Temporal rewards: Video-R1's T-GRPO bonus and length bonus, and Temporal-R1's dual reward, as pure formulas
(the ``t_grpo`` plug-in that draws the shuffled rollouts is :mod:`mmrl.methods.tgrpo`; Temporal-R1's data
selection :mod:`mmrl.methods.temporal_r1`).

**T-GRPO** (Video-R1, arXiv 2503.21776; the plug-in ``t_grpo``). For every group whose prompt shows a video,
a second group of ``G/2`` rollouts is drawn through the rollout service from the **same frames in a random
order** (one permutation per prompt and step; only the frame tensor moves, as in the released code). These
rollouts are scored with the run's accuracy reward and never trained on. With ``p`` the mean accuracy of
the ordered group and ``p~`` that of the shuffled one, when ``p >= mu * p~`` every ordered rollout whose
accuracy is above ``correct_threshold`` gets ``alpha`` added to its total reward (component
``temporal_bonus``). Settings (the released code's values): ``alpha`` 0.3, ``mu`` 0.8, ``correct_threshold``
0.1, ``shuffled_size`` (default ``G // 2``), ``accuracy`` (the reward label read as accuracy, default
``accuracy``), ``exclude_identity`` (default false: ``randperm`` may return the order itself), ``seed`` (0).
Logged per step: ``tgrpo/ordered_accuracy``, ``tgrpo/shuffled_accuracy``, ``tgrpo/bonus_groups`` (the share
of video groups that got the bonus), ``tgrpo/video_groups``. Image prompts get nothing.

Note: with the group-normalised advantage ``(r - mean) / std`` a bonus given to every correct rollout of a
group changes the advantages only through the other reward components (format, length): for a binary
accuracy alone it rescales the group's rewards and cancels out. That is the released method; it is kept as is.

**Length bonus** (reward ``length_bonus``, the released code's ``len_control``): in a group where at least
``min_correct`` (2) rollouts have accuracy above ``correct_threshold`` (0.1), each of those whose completion
has ``min_tokens``..``max_tokens`` tokens (320..512, inclusive) gets ``bonus`` (0.2); everything else 0.

**Temporal-R1's dual reward** (reward ``temporal_r1``, arXiv 2506.01908 and its code): ``format_weight *
format + answer_weight * accuracy + iou_weight * tIoU``. The accuracy term (discrete) scores the answer of
questions that are not pure grounding (multiple choice, yes/no, numbers, ...); the tIoU term (continuous) scores
the predicted span against the gold span: the answer of ``temporal_grounding`` questions, or ``meta[span_key]``
(default ``gold_span``) for grounded QA. ``span_tag`` reads the span from another block (e.g. ``glue``).

How the span is read (``span_form``):

* ``any`` (default, mmrl's lenient reading): :func:`rewards.answers.parse_span` takes ``[12.5, 18]``, ``12.5 to
  18 s`` and the JSON ``{"start_time": "12.5", "end_time": "18"}``; an inverted or unreadable span scores 0, a
  zero-length one 0 unless the gold span is the same point (:func:`rewards.metrics.temporal_iou`).
* ``json`` (the released code's, appletea233/Temporal-R1 ``verl/utils/reward_score/tvg.py``,
  ``tvg_accuracy_reward``): only the JSON object in the first ``<answer>`` block counts
  (:func:`rewards.answers.json_span`: ``[12.5, 18]``, "12.5 to 18", unquoted keys score 0), and its IoU is
  tvg.py's ``temporal_iou`` as written (:func:`released_tiou`): the same formula, where an inverted span gets
  0 from the formula itself, a zero-length union (a division by zero in the code) or a value that is not finite
  gives 0, and negative times are scored as given. The code divides both spans by the video's length first,
  which leaves the ratio unchanged; mmrl scores seconds.

tIoU is the paper's and the code's formula, ``max(0, min(e, e') - max(s, s')) / (max(e, e') - min(s, s'))``, on
the predicted span as given, so a span that runs past the clip is penalised by its whole length.
``clip_to_shown: true`` (not the paper's; off by default) first clips the prediction to the clip the model was
shown (the media's ``start``/``end`` sampling window, else ``[0, duration]`` from ``meta.duration`` or
``meta.video.duration``). Weights default to 1 each (the unweighted sum of VideoChat-R1 and Video-R1);
Temporal-R1's grounding code uses ``format_weight: 0.5, iou_weight: 0.5`` (configs/temporal-grounding.yaml, with
``span_form: json`` and ``format_mode: tvg_json``, the code's format regex: :mod:`rewards.format`).
``format_mode`` is the format reward's ``mode`` (default ``think_answer``). ``strict_tags: true`` (off by
default) reads the answer (and, with ``span_form: any``, the ``span_tag`` block) only from the first complete
block and scores a completion without one 0, as ``tvg.py`` does. Logged: ``temporal_r1/format``,
``temporal_r1/answer``, ``temporal_r1/tiou`` (means over the samples each applies to).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from mmrl_common.errors import ConfigError
from rewards.accuracy import score_answer
from rewards.answers import extract_answer, first_tag_block, json_span, normalize_gold_span, parse_span
from rewards.format import check_format
from rewards.metrics import temporal_iou
from rewards.registry import normalize_completions, register_reward

__all__ = ["clip_window", "length_bonus", "released_tiou", "shown_window", "temporal_bonus",
           "temporal_r1_reward"]


# --------------------------------------------------------------------------------------------------------
# T-GRPO
# --------------------------------------------------------------------------------------------------------


def temporal_bonus(ordered: Sequence[float], shuffled: Sequence[float], *, alpha: float = 0.3, mu: float = 0.8,
                   correct_threshold: float = 0.1) -> list[float]:
    """The bonus of each ordered rollout: ``alpha`` for those with accuracy above ``correct_threshold`` when
    the ordered group's mean accuracy is at least ``mu`` times the shuffled group's, else 0."""
    if not ordered:
        return []
    p = sum(ordered) / len(ordered)
    p_shuffled = sum(shuffled) / len(shuffled) if shuffled else 0.0
    if p < mu * p_shuffled:
        return [0.0] * len(ordered)
    return [alpha if a > correct_threshold else 0.0 for a in ordered]


def has_video(sample: Any) -> bool:
    return any(getattr(m, "type", None) == "video" for m in getattr(sample, "media", None) or [])


# --------------------------------------------------------------------------------------------------------
# The length bonus
# --------------------------------------------------------------------------------------------------------


def _groups(n: int, columns: Mapping[str, Any]) -> list[list[int]]:
    """Rows of each prompt group: the rollout batch's groups, else rows sharing an ``id``."""
    batch = columns.get("rollout_batch")
    if batch is not None and len(batch) == n:
        return [list(rows) for rows in batch.groups()]
    ids = columns.get("id")
    if not isinstance(ids, (list, tuple)) or len(ids) != n:
        raise ConfigError("the length_bonus reward groups completions by prompt: it needs the rollout batch "
                          "(inside mmrl train) or an 'id' column")
    by_id: dict[Any, list[int]] = defaultdict(list)
    for i, sid in enumerate(ids):
        by_id[sid].append(i)
    return list(by_id.values())


def _number(columns: Mapping[str, Any], key: str, default: float, n: int) -> float:
    value = columns.get(key, default)
    if value is None or (isinstance(value, (list, tuple)) and len(value) == n):
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"reward setting {key} must be a number, got {value!r}")
    return float(value)


@register_reward("length_bonus", locate_errors=False)
def length_bonus(completions: list[Any], **columns: Any) -> list[float]:
    """Video-R1's length control (see the module docstring): ``bonus`` for correct completions of
    ``min_tokens``..``max_tokens`` tokens in groups with at least ``min_correct`` correct ones."""
    from rewards.accuracy import accuracy

    n = len(completions)
    lo, hi = _number(columns, "min_tokens", 320, n), _number(columns, "max_tokens", 512, n)
    bonus, threshold = _number(columns, "bonus", 0.2, n), _number(columns, "correct_threshold", 0.1, n)
    min_correct = _number(columns, "min_correct", 2, n)
    ids = columns.get("completion_ids")
    if not isinstance(ids, (list, tuple)) or len(ids) != n:
        raise ConfigError("the length_bonus reward counts completion tokens: it needs the completion_ids column")
    acc_columns = {k: v for k, v in columns.items()
                   if k not in ("min_tokens", "max_tokens", "bonus", "correct_threshold", "min_correct")}
    acc = [a or 0.0 for a in accuracy(completions, **acc_columns)]
    out = [0.0] * n
    for rows in _groups(n, columns):
        correct = [i for i in rows if acc[i] > threshold]
        if len(correct) < min_correct:
            continue
        for i in correct:
            if lo <= len(ids[i]) <= hi:
                out[i] = bonus
    return out


# --------------------------------------------------------------------------------------------------------
# Temporal-R1's dual reward
# --------------------------------------------------------------------------------------------------------


def shown_window(meta: Mapping[str, Any] | None, media: Sequence[Any] = ()) -> tuple[float, float] | None:
    """``(start, end)`` seconds of the clip the model was shown: the first video's ``start``/``end`` sampling
    window where given, else ``(0, duration)`` with ``meta.duration`` or ``meta.video.duration``; None when
    unknown."""
    meta = meta if isinstance(meta, Mapping) else {}
    duration = meta.get("duration")
    if duration is None and isinstance(meta.get("video"), Mapping):
        duration = meta["video"].get("duration")
    ok = isinstance(duration, (int, float)) and not isinstance(duration, bool) and math.isfinite(duration)
    start, end = 0.0, float(duration) if ok and duration > 0 else None
    for item in media:
        if getattr(item, "type", None) == "video":
            sampling = getattr(item, "sampling", None) or {}
            if sampling.get("start") is not None:
                start = float(sampling["start"])
            if sampling.get("end") is not None:
                end = float(sampling["end"])
            break
    return None if end is None or end <= start else (start, end)


def clip_window(span: tuple[float, float], window: tuple[float, float] | None) -> tuple[float, float]:
    """``span`` clipped to ``window`` (unchanged when the window is unknown)."""
    if window is None:
        return span
    lo, hi = window
    return (min(max(span[0], lo), hi), min(max(span[1], lo), hi))


def released_tiou(pred: Sequence[float], gold: Sequence[float]) -> float:
    """tIoU as Temporal-R1's released ``temporal_iou`` computes it (appletea233/Temporal-R1,
    ``verl/utils/reward_score/tvg.py``): ``max(0, max(min(e, e') - max(s, s'), 0) / (max(e, e') - min(s, s')))``
    on the spans as given. Unlike :func:`rewards.metrics.temporal_iou` nothing is refused: an inverted span
    scores 0 by the formula, a zero union (the code's ZeroDivisionError, caught by its caller) 0, and a NaN the
    code's ``max``/``min`` order passes on to a final ``max(0, nan)``: 0. The arguments of each ``max``/``min``
    are in the code's order (prediction first), which decides what a NaN does."""
    lo_max, lo_min = max(pred[0], gold[0]), min(pred[0], gold[0])
    hi_max, hi_min = max(pred[1], gold[1]), min(pred[1], gold[1])
    union = hi_max - lo_min
    if union == 0:
        return 0.0
    value = max(hi_min - lo_max, 0) / union
    return float(max(0, value))


_SPAN_FORMS = ("any", "json")


def span_iou(prediction_text: str, gold: Any, window: tuple[float, float] | None = None, *,
             span_form: str = "any", tag: str = "answer") -> float:
    """tIoU of the span in ``prediction_text`` against the gold span (the paper's formula; clipped to
    ``window`` first when one is given); 0 for an unreadable prediction. ``span_form="json"``: the whole
    completion, its first ``<tag>`` block read and scored as Temporal-R1's released code does (module
    docstring)."""
    if span_form == "json":
        span = json_span(prediction_text, tag=tag)
        if span is None:
            return 0.0
        return released_tiou(clip_window(span, window), normalize_gold_span(gold))
    span = parse_span(prediction_text)
    if span is None:
        return 0.0
    return temporal_iou(clip_window(span, window), normalize_gold_span(gold))


@register_reward("temporal_r1", locate_errors=False)
def temporal_r1_reward(completions: list[Any], **columns: Any) -> list[float]:
    """Temporal-R1's dual reward (see the module docstring)."""
    texts = normalize_completions(completions)
    n = len(texts)
    w_fmt = _number(columns, "format_weight", 1.0, n)
    w_ans = _number(columns, "answer_weight", 1.0, n)
    w_iou = _number(columns, "iou_weight", 1.0, n)
    span_key = columns.get("span_key", "gold_span")
    span_key = "gold_span" if isinstance(span_key, (list, tuple)) else span_key
    span_tag = columns.get("span_tag")
    format_mode = columns.get("format_mode", "think_answer")
    format_mode = "think_answer" if isinstance(format_mode, (list, tuple)) else format_mode
    clip = columns.get("clip_to_shown", False)
    clip = False if isinstance(clip, (list, tuple)) else bool(clip)
    strict = columns.get("strict_tags", False)
    if not isinstance(strict, bool):
        raise ConfigError(f"rewards[].kwargs.strict_tags must be true or false, got {strict!r}")
    span_form = columns.get("span_form", "any")
    if span_form not in _SPAN_FORMS:
        raise ConfigError(f"rewards[].kwargs.span_form must be one of {', '.join(_SPAN_FORMS)} (any: mmrl's lenient "
                          f"reading; json: Temporal-R1's tvg.py), got {span_form!r}")
    batch = columns.get("rollout_batch")
    samples = list(batch.samples) if batch is not None and len(batch) == n else [None] * n

    def read(text: str, tag: str = "answer") -> str:  # strict: tvg.py's first <answer> block, else nothing
        return first_tag_block(text, tag=tag) if strict else extract_answer(text, tag=tag)

    def col(key: str, i: int) -> Any:
        v = columns.get(key)
        return v[i] if isinstance(v, (list, tuple)) and len(v) == n else None

    terms: dict[str, list[float]] = {"format": [], "answer": [], "tiou": []}
    out: list[float] = []
    for i, text in enumerate(texts):
        ptype, meta = col("problem_type", i), col("meta", i) or {}
        answer_text = read(text)
        fmt = float(check_format(text, mode=format_mode))
        total = w_fmt * fmt
        terms["format"].append(fmt)
        if ptype != "temporal_grounding":
            row = {"problem_type": ptype, "answer": col("answer", i), "options": col("options", i), "meta": meta,
                   "id": col("id", i)}
            acc = float(score_answer(answer_text, row) or 0.0)
            total += w_ans * acc
            terms["answer"].append(acc)
        gold = col("answer", i) if ptype == "temporal_grounding" else meta.get(span_key)
        if gold is not None:
            media = getattr(samples[i], "media", None) or []
            window = shown_window(meta, media) if clip else None
            if span_form == "json":  # tvg.py reads the raw completion's first block itself
                iou = span_iou(text, gold, window, span_form="json", tag=span_tag or "answer")
            else:
                iou = span_iou(read(text, span_tag) if span_tag else answer_text, gold, window)
            total += w_iou * iou
            terms["tiou"].append(iou)
        out.append(total)
    log = columns.get("log_metric")
    if callable(log):
        for key, values in terms.items():
            if values:
                log(f"temporal_r1/{key}", sum(values) / len(values))
    return out
