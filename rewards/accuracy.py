"""Answer-matching rewards: ``accuracy`` (dispatching on ``problem_type``), ``token_f1``, ``rouge_l``,
``temporal_iou``.

``accuracy`` looks up a *scorer* per problem type in its own registry, so a new problem type is added with
``@register_scorer("my_type")`` and no change here. A scorer has the signature::

    scorer(prediction: str, row: dict, **settings) -> float | None

``prediction`` is the extracted answer text (:func:`rewards.answers.extract_answer`), ``row`` the sample's
column values (``answer``, ``options``, ``meta``, ``id``, ...), ``settings`` the reward's keyword arguments
from the config (scorers must accept unknown ones). ``None`` means "not applicable".

Built-in scorers and their settings:

* ``multiple_choice``: 1.0 when :func:`~rewards.answers.extract_choice` (restricted to the sample's options)
  equals the gold letter, else 0.0 (also when nothing or something ambiguous was given). ``choice_scoring="exact"``:
  1.0 only when the answer, stripped, is the gold letter itself, as Video-R1 scores it (tulerfeng/Video-R1
  src/r1-v/src/open_r1/grpo.py, ``accuracy_reward``: ``output_ans.strip() == gt_ans.strip()``): "B." , "b", "(B)"
  and "B. blue" score 0 there.
* ``yes_no``: 1.0 when :func:`~rewards.answers.extract_yes_no` equals the gold yes/no.
* ``numeric``: ``numeric_scoring="tolerance"`` (default): 1.0 when ``|pred − gold| <= max(rel_tol·|gold|,
  abs_tol)`` (defaults ``rel_tol=0``, ``abs_tol=1e-6``; so "3" matches "3.0"); ``"relative_error"``:
  ``1 − min(|pred − gold| / |gold|, 1)`` (exact match needed when gold is 0); ``"video-r1"``: Video-R1's
  numerical reward (tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py, ``accuracy_reward``): 0.0 when exactly one
  of the gold and the prediction (as written) contains ``.`` or ``,``, else 1.0 when both, read as
  :func:`~rewards.answers.plain_number` (``float`` without commas: "4 cars" does not parse), are equal rounded
  to two decimals (Python's ``round``), else 0.0. ``percent="value"|"fraction"`` as in
  :func:`~rewards.answers.parse_number`. Unparseable → 0.0.
* ``regression``: Video-R1's regression reward (tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py,
  ``accuracy_reward``): ``1 − clip((|pred − gold| + 1e-9) / (|gold| + 1e-9), 0, 1)``, 0.0 when the prediction
  has no number. The epsilons are the code's: a gold of 0 scores 0.0 whatever the prediction (the relative
  error of the exact answer is 1e-9/1e-9 = 1). Numbers are read as for ``numeric`` (``percent``); with
  ``numeric_scoring="video-r1"`` as the code reads them (:func:`~rewards.answers.plain_number`; a gold that does
  not read so scores 0.0 as there). The other ``numeric_scoring`` values do not change the formula.
* ``open``: max over the gold answer (a string or list of strings) and ``meta["synonyms"]`` of
  ``open_metric``: ``"token_f1"`` (default), ``"rouge_l"`` or ``"exact"`` (normalised equality).
* ``free_form``: the same with ``free_form_metric`` (default ``"rouge_mean"``: the mean of the ROUGE-1/2/L
  F-measures with stemming, Video-R1's free-form reward, :func:`rewards.video_r1_metrics.rouge_mean`).
* ``ocr``: max over the references of ``clip(1 - WER, 0, 1)`` (Video-R1's OCR reward; word error rate over
  whitespace-split words, :func:`rewards.video_r1_metrics.ocr_score`).
* ``temporal_grounding``: temporal IoU of the parsed span against the gold ``[start, end]``; 0.0 when the
  prediction does not parse or is inverted. With ``clip_to_duration=True`` (default) and
  ``meta["duration"]`` set, the prediction is clipped to ``[0, duration]`` first.

Common settings of all four rewards: ``tag="answer"``, ``think_tag="think"``, ``fallback="strip_think"``
(see :func:`~rewards.answers.extract_answer`), ``strict_tags=False``: when true, the answer is the content of the
first complete ``<tag>…</tag>`` block and a completion without one scores 0 (no fallback, no truncated block),
as Video-R1's ``accuracy_reward`` (tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py: ``re.search`` of
``<answer>\\s*(.*?)\\s*</answer>``, else ``""``) and Temporal-R1's ``tvg.py`` read it. ``answer_from="tags"``
(default) reads the answer as above; ``"boxed"``: the content of the last ``\\boxed{...}`` in the completion
(:func:`~rewards.answers.last_boxed`, braces balanced), ``""`` when there is none (so it scores 0), as ARES's
and EasyR1's math reward (examples/reward_function/math.py: ``extract_boxed_content(response)``) reads it for
the ``ares-math`` prompt. ``accuracy`` also takes ``on_unknown_type="raise"|"none"``.

``grader="problem_type"`` (default) scores with the problem type's scorer above; ``grader="mathruler"`` grades
as ARES's reward does (shawn0728/ARES examples/reward_function/aepo.py, ``accuracy_reward``; EasyR1's
examples/reward_function/math.py the same): the completion with the white space around ``<``, ``>`` and ``/``
removed (aepo.py's ``re.sub`` before it reads anything), its answer read by mathruler's
``extract_boxed_content`` (the last ``\\boxed{`` and its braces counted to the closing one; ``"None"`` when
there is no box or it never closes) and graded 1/0 by mathruler's ``grade_answer`` against the gold answer
-- for every problem type, as ARES grades every question, except ``temporal_grounding``, whose gold is a span
ARES never grades: its IoU stays (our choice). Where ARES has one answer string, mmrl may have more: any of the
accepted answers passes, and so does a multiple-choice question's gold option text
(:func:`mathruler_references` says why). It needs ``answer_from="boxed"`` (the reading above; ARES's only one)
and the ``mathruler`` package (a dependency of mmrl, imported on first use).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mmrl_common.errors import ConfigError, MmrlError
from mmrl_common.registry import Registry
from rewards import answers as A
from rewards.metrics import rouge_l, temporal_iou, token_f1
from rewards.registry import normalize_completions, per_sample_error, register_reward
from rewards.video_r1_metrics import ocr_score, rouge_mean

__all__ = [
    "ANSWER_FROM",
    "GRADERS",
    "NUMERIC_SCORING",
    "SCORED_AS",
    "SCORERS",
    "TEXT_METRICS",
    "answer_from_settings",
    "available_scorers",
    "get_scorer",
    "grader_setting",
    "mathruler_boxed_answer",
    "mathruler_grade",
    "mathruler_references",
    "reference_answers",
    "register_scorer",
    "sample_meta",
    "sample_rows",
    "score_answer",
]

Scorer = Callable[..., "float | None"]
SCORERS: Registry[Scorer] = Registry("accuracy scorer for problem type", register_error=ConfigError)
"""The accuracy scorer of every problem type, by problem type name."""


def register_scorer(problem_type: str, fn: Scorer | None = None, *, overwrite: bool = False):
    """Register the accuracy scorer for ``problem_type`` (decorator or direct call); see the module doc."""
    if not isinstance(problem_type, str) or not problem_type:
        raise ConfigError(f"a problem type must be a non-empty string, got {problem_type!r}")

    def decorate(f: Scorer) -> Scorer:
        return SCORERS.add(problem_type, f, overwrite=overwrite)

    return decorate(fn) if fn is not None else decorate


def get_scorer(problem_type: str) -> Scorer:
    """The scorer for ``problem_type``; :class:`ConfigError` naming the nearest and the valid types otherwise."""
    return SCORERS.get(problem_type)


def available_scorers() -> list[str]:
    return SCORERS.names()


def unregister_scorer(problem_type: str) -> None:
    """Remove the scorer for ``problem_type``; a type without one is ignored."""
    if problem_type in SCORERS:
        SCORERS.unregister(problem_type)


# --------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------


def sample_rows(n: int, columns: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Split keyword arguments into per-sample rows (lists of length n) and settings (everything else)."""
    per_sample = {k: v for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == n}
    settings = {k: v for k, v in columns.items() if k not in per_sample}
    rows = [{k: v[i] for k, v in per_sample.items()} for i in range(n)]
    return rows, settings


def sample_meta(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """The sample's ``meta`` mapping (empty when it has none or it is not a mapping)."""
    meta = row.get("meta")
    return meta if isinstance(meta, Mapping) else {}


def reference_answers(row: Mapping[str, Any]) -> list[str]:
    """The sample's accepted answers as strings: its gold ``answer`` (a string or a list) and
    ``meta.synonyms``; ``ValueError`` when there is none."""
    gold = row.get("answer")
    refs: list[str] = []
    if isinstance(gold, (list, tuple)):
        refs.extend(str(g) for g in gold if g is not None)
    elif gold is not None:
        refs.append(str(gold))
    syn = sample_meta(row).get("synonyms")
    if isinstance(syn, str):
        refs.append(syn)
    elif isinstance(syn, Sequence):
        refs.extend(str(s) for s in syn if s is not None)
    if not refs:
        raise ValueError("the sample has no gold answer")
    return refs


SCORED_AS: dict[str, str] = {
    "multiple_choice": "the option letter read equals the gold one (1/0)",
    "yes_no": "yes/no equals the gold (1/0)",
    "numeric": "the number equals the gold (1/0)",
    "regression": "1 - relative error of the number, clipped to [0, 1] (Video-R1)",
    "open": "token F1 against the reference (SQuAD-style, partial credit; not exact match)",
    "free_form": "mean of ROUGE-1/2/L F-measures against the reference (Video-R1)",
    "ocr": "1 - word error rate against the reference (Video-R1)",
    "temporal_grounding": "temporal IoU of the predicted span with the gold one",
}
"""What each built-in scorer's number means, with its default settings (evaluation reports say it beside each
problem type's score; a registered scorer of another type is "the accuracy reward's score")."""

TEXT_METRICS: Registry[Callable[[Any, Any], float]] = Registry("text metric", register_error=ConfigError)
"""The metrics of the ``open``, ``free_form`` and ``ocr`` scorers (settings ``open_metric``, ``free_form_metric``,
``ocr_metric``); ``wer`` is ``clip(1 - WER, 0, 1)``."""
TEXT_METRICS.add("token_f1", token_f1)
TEXT_METRICS.add("rouge_l", rouge_l)
TEXT_METRICS.add("rouge_mean", rouge_mean)
TEXT_METRICS.add("wer", ocr_score)
TEXT_METRICS.add("exact", lambda p, r: float(A.normalize_text(p) == A.normalize_text(r)))


def _text_score(prediction: str, row: Mapping[str, Any], metric: str) -> float:
    fn = TEXT_METRICS.get(metric)
    return max(fn(prediction, ref) for ref in reference_answers(row))


ANSWER_FROM = ("tags", "boxed")
"""The values of the rewards' ``answer_from`` setting (module doc)."""


def answer_from_settings(text: str, settings: Mapping[str, Any]) -> str:
    """The answer in a completion, read by :func:`rewards.answers.extract_answer` with the reward's
    ``tag``, ``think_tag`` and ``fallback`` settings (defaults ``answer``, ``think``, ``strip_think``); with
    ``strict_tags`` true, the first complete ``<tag>…</tag>`` block's content or ``""``; with
    ``answer_from="boxed"`` the last ``\\boxed{...}``'s content or ``""``, and with ``grader="mathruler"`` too
    as ARES reads it (:func:`mathruler_boxed_answer`) (module doc)."""
    strict = settings.get("strict_tags", False)
    if not isinstance(strict, bool):
        raise ConfigError(f"rewards[].kwargs.strict_tags must be true or false, got {strict!r}")
    source = settings.get("answer_from", "tags")
    if source not in ANSWER_FROM:
        raise ConfigError(f"rewards[].kwargs.answer_from must be one of {', '.join(ANSWER_FROM)}, got {source!r}")
    if grader_setting(settings) == "mathruler":
        if source != "boxed":
            raise ConfigError("rewards[].kwargs.grader: mathruler grades the answer in \\boxed{} as ARES's reward "
                              f"reads it; set answer_from: boxed (it is {source!r})")
        return mathruler_boxed_answer(text)
    if source == "boxed":
        return A.last_boxed(text)
    if strict:
        return A.first_tag_block(text, tag=settings.get("tag", "answer"))
    return A.extract_answer(
        text,
        tag=settings.get("tag", "answer"),
        think_tag=settings.get("think_tag", "think"),
        fallback=settings.get("fallback", "strip_think"),
    )


GRADERS = ("problem_type", "mathruler")
"""The values of the ``accuracy`` reward's ``grader`` setting (module doc)."""
MATHRULER_KEEPS = ("temporal_grounding",)
"""The problem types ``grader="mathruler"`` leaves to their own scorer: a span, which ARES never grades."""
# aepo.py (and EasyR1's math.py) remove the white space around these before reading the answer
_ARES_SPACES = re.compile(r"\s*([<>/])\s*")


def grader_setting(settings: Mapping[str, Any]) -> str:
    """The reward's ``grader`` setting, checked (default ``problem_type``)."""
    grader = settings.get("grader", "problem_type")
    if grader not in GRADERS:
        raise ConfigError(f"rewards[].kwargs.grader must be one of {', '.join(GRADERS)}, got {grader!r}")
    return grader


def _mathruler() -> Any:
    try:
        from mathruler import grader  # a dependency of mmrl (pyproject.toml); it imports sympy and pylatexenc
    except ImportError as exc:
        raise MmrlError(f"rewards[].kwargs.grader: mathruler needs the mathruler package, which does not import "
                        f"({exc}): pip install -c constraints.txt mathruler pylatexenc") from None
    # pylatexenc logs a warning for every malformed LaTeX macro it reads ("\\frac" without its arguments): one a
    # completion, on stderr; the grade is the same without them
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)
    return grader


def mathruler_boxed_answer(text: Any) -> str:
    """The answer ARES's reward grades (shawn0728/ARES examples/reward_function/aepo.py): white space around
    ``<``, ``>`` and ``/`` removed from the completion, then mathruler's ``extract_boxed_content`` -- the last
    ``\\boxed{``'s content up to its closing brace, stripped; ``"None"`` when there is none or it never closes."""
    return _mathruler().extract_boxed_content(_ARES_SPACES.sub(r"\1", "" if text is None else str(text)))


def mathruler_references(row: Mapping[str, Any]) -> list[str]:
    """What ``grader="mathruler"`` grades an answer against: the sample's accepted answers
    (:func:`reference_answers`; ARES has one, its ground truth) and, for a multiple-choice question with options,
    the gold option's text, as written and as its words (:func:`rewards.answers.option_text`). ARES's questions
    carry their options in the text and a letter as the answer; mmrl's list them apart, and the toy world's base
    model answers with the option's words, never reliably with its letter (configs/acre.yaml, sft.mc_answer)."""
    refs = reference_answers(row)
    options = row.get("options")
    if row.get("problem_type") != "multiple_choice" or not options:
        return refs
    try:
        letter = A.normalize_gold_choice(row.get("answer"), options)
    except (TypeError, ValueError):
        return refs
    if isinstance(options, Mapping):
        raw = {str(k).strip().upper(): v for k, v in options.items()}[letter]
    else:
        raw = list(options)[A.choice_letters(options).index(letter)]
    return list(dict.fromkeys([*refs, str(raw), A.option_text(letter, raw)]))


def mathruler_grade(prediction: str, row: Mapping[str, Any]) -> float:
    """1.0 when mathruler's ``grade_answer(prediction, reference)`` holds for one of
    :func:`mathruler_references`, else 0.0 (ARES's ``accuracy_reward``)."""
    grade = _mathruler().grade_answer
    return float(any(grade(prediction, ref) for ref in mathruler_references(row)))


# --------------------------------------------------------------------------------------------------------
# built-in scorers
# --------------------------------------------------------------------------------------------------------


CHOICE_SCORING = ("letter", "exact")


@register_scorer("multiple_choice")
def score_multiple_choice(prediction: str, row: Mapping[str, Any], *, choice_scoring: str = "letter",
                          **settings: Any) -> float:
    options = row.get("options")
    gold = A.normalize_gold_choice(row.get("answer"), options)
    if choice_scoring == "exact":
        return float(gold is not None and prediction.strip() == gold)
    if choice_scoring != "letter":
        raise ConfigError(f"accuracy: choice_scoring={choice_scoring!r}; choose one of {', '.join(CHOICE_SCORING)}")
    return float(A.extract_choice(prediction, options) == gold)


@register_scorer("yes_no")
def score_yes_no(prediction: str, row: Mapping[str, Any], **settings: Any) -> float:
    gold = A.normalize_gold_yes_no(row.get("answer"))
    return float(A.extract_yes_no(prediction) == gold)


NUMERIC_SCORING = ("tolerance", "relative_error", "video-r1")
"""The values of the ``numeric`` and ``regression`` scorers' ``numeric_scoring`` setting (module doc)."""
VIDEO_R1_EPS = 1e-9
"""The epsilon Video-R1's regression reward adds to both sides of its relative error (grpo.py)."""


def _numeric_scoring(value: Any) -> str:
    if value not in NUMERIC_SCORING:
        raise ConfigError(f"rewards[].kwargs.numeric_scoring must be one of {', '.join(NUMERIC_SCORING)}, "
                          f"got {value!r}")
    return value


def _has_decimal_mark(text: str) -> bool:
    return "." in text or "," in text


def _video_r1_numerical(prediction: str, gold_text: str) -> float:
    """grpo.py's ``numerical`` branch: the decimal marks must agree, then the values to two decimals."""
    if _has_decimal_mark(gold_text) != _has_decimal_mark(prediction):
        return 0.0
    gold, pred = A.plain_number(gold_text), A.plain_number(prediction)
    if gold is None or pred is None:
        return 0.0
    return float(round(gold, 2) == round(pred, 2))


@register_scorer("numeric")
def score_numeric(
    prediction: str,
    row: Mapping[str, Any],
    *,
    rel_tol: float = 0.0,
    abs_tol: float = 1e-6,
    numeric_scoring: str = "tolerance",
    percent: str = "value",
    **settings: Any,
) -> float:
    if _numeric_scoring(numeric_scoring) == "video-r1":
        return _video_r1_numerical(prediction.strip(), str(row.get("answer")).strip())
    gold = A.normalize_gold_number(row.get("answer"), percent=percent)
    pred = A.parse_number(prediction, percent=percent)
    if pred is None:
        return 0.0
    if numeric_scoring == "tolerance":
        return float(abs(pred - gold) <= max(rel_tol * abs(gold), abs_tol))
    if gold == 0:
        return float(abs(pred) <= abs_tol)
    return 1.0 - min(abs(pred - gold) / abs(gold), 1.0)


@register_scorer("regression")
def score_regression(
    prediction: str,
    row: Mapping[str, Any],
    *,
    numeric_scoring: str = "tolerance",
    percent: str = "value",
    **settings: Any,
) -> float:
    if _numeric_scoring(numeric_scoring) == "video-r1":
        gold, pred = A.plain_number(row.get("answer")), A.plain_number(prediction)
    else:
        gold = A.normalize_gold_number(row.get("answer"), percent=percent)
        pred = A.parse_number(prediction, percent=percent)
    if gold is None or pred is None:
        return 0.0
    relative = (abs(pred - gold) + VIDEO_R1_EPS) / (abs(gold) + VIDEO_R1_EPS)
    return 1.0 - min(max(relative, 0.0), 1.0)


@register_scorer("open")
def score_open(
    prediction: str, row: Mapping[str, Any], *, open_metric: str = "token_f1", **settings: Any
) -> float:
    return _text_score(prediction, row, open_metric)


@register_scorer("free_form")
def score_free_form(
    prediction: str, row: Mapping[str, Any], *, free_form_metric: str = "rouge_mean", **settings: Any
) -> float:
    return _text_score(prediction, row, free_form_metric)


@register_scorer("ocr")
def score_ocr(prediction: str, row: Mapping[str, Any], *, ocr_metric: str = "wer", **settings: Any) -> float:
    return _text_score(prediction, row, ocr_metric)


def _predicted_span(
    prediction: str, row: Mapping[str, Any], clip_to_duration: bool
) -> tuple[float, float] | None:
    span = A.parse_span(prediction)
    if span is None:
        return None
    duration = sample_meta(row).get("duration")
    usable = isinstance(duration, (int, float)) and not isinstance(duration, bool) and math.isfinite(duration)
    if clip_to_duration and usable and duration > 0:
        span = (min(max(span[0], 0.0), duration), min(max(span[1], 0.0), duration))
    return span


@register_scorer("temporal_grounding")
def score_temporal_grounding(
    prediction: str, row: Mapping[str, Any], *, clip_to_duration: bool = True, **settings: Any
) -> float:
    gold = A.normalize_gold_span(row.get("answer"))
    span = _predicted_span(prediction, row, clip_to_duration)
    return 0.0 if span is None else temporal_iou(span, gold)


def score_answer(prediction: str, row: Mapping[str, Any], **settings: Any) -> float | None:
    """Score one extracted answer against one sample with the scorer of its ``problem_type``."""
    return get_scorer(row.get("problem_type"))(prediction, row, **settings)


# --------------------------------------------------------------------------------------------------------
# rewards
# --------------------------------------------------------------------------------------------------------


def _map(
    completions: list[Any], columns: Mapping[str, Any], one: Callable[..., float | None]
) -> list[float | None]:
    texts = normalize_completions(completions)
    rows, settings = sample_rows(len(texts), columns)
    out: list[float | None] = []
    for i, (text, row) in enumerate(zip(texts, rows)):
        try:
            out.append(one(answer_from_settings(text, settings), row, settings))
        except Exception as exc:
            per_sample_error(i, exc)
            raise
    return out


@register_reward("accuracy")
def accuracy(completions: list[Any], **columns: Any) -> list[float | None]:
    """Task accuracy per ``problem_type`` (see the module docstring)."""
    n = len(completions)
    if not isinstance(columns.get("problem_type"), (list, tuple)) or len(columns["problem_type"]) != n:
        raise ConfigError("the 'accuracy' reward needs a per-sample 'problem_type' column")
    if "answer" not in columns:
        raise ConfigError("the 'accuracy' reward needs an 'answer' column")
    on_unknown = columns.get("on_unknown_type", "raise")
    if on_unknown not in ("raise", "none"):
        raise ConfigError(f"on_unknown_type must be 'raise' or 'none', got {on_unknown!r}")

    def one(prediction: str, row: dict[str, Any], settings: dict[str, Any]) -> float | None:
        ptype = row.get("problem_type")
        if grader_setting(settings) == "mathruler" and ptype not in MATHRULER_KEEPS:
            return mathruler_grade(prediction, row)
        scorer = SCORERS.find(ptype)
        if scorer is None:
            if on_unknown == "none":
                return None
            raise SCORERS.unknown(ptype)  # names the nearest problem type and the valid ones
        return scorer(prediction, row, **settings)

    return _map(completions, columns, one)


def _text_reward(metric: Callable[[Any, Any], float]):
    def one(prediction: str, row: dict[str, Any], settings: dict[str, Any]) -> float | None:
        if row.get("answer") is None and not sample_meta(row).get("synonyms"):
            return None
        return max(metric(prediction, ref) for ref in reference_answers(row))

    return one


@register_reward("token_f1")
def token_f1_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """Max token F1 of the extracted answer against the gold answer and ``meta["synonyms"]``."""
    return _map(completions, columns, _text_reward(token_f1))


@register_reward("rouge_l")
def rouge_l_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """Max ROUGE-L F1 of the extracted answer against the gold answer and ``meta["synonyms"]``."""
    return _map(completions, columns, _text_reward(rouge_l))


@register_reward("temporal_iou")
def temporal_iou_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """Temporal IoU of the predicted span (in the answer block, or in ``tag``'s block, e.g. ``tag="glue"``).

    The gold span is the ``answer`` by default; ``span_key="gold_span"`` reads ``meta["gold_span"]`` instead
    (grounded QA, where the answer is a letter). Not applicable (``None``) when the sample has no gold span:
    with the default source, samples whose ``problem_type`` is given and is not ``temporal_grounding``.
    Unparseable or inverted predictions score 0.0.
    """
    span_key = columns.get("span_key")
    clip = columns.get("clip_to_duration", True)

    def one(prediction: str, row: dict[str, Any], settings: dict[str, Any]) -> float | None:
        if span_key:
            gold_raw = sample_meta(row).get(span_key)
        else:
            ptype = row.get("problem_type")
            if ptype is not None and ptype != "temporal_grounding":
                return None
            gold_raw = row.get("answer")
        if gold_raw is None:
            return None
        gold = A.normalize_gold_span(gold_raw)
        span = _predicted_span(prediction, row, clip)
        return 0.0 if span is None else temporal_iou(span, gold)

    return _map(completions, columns, one)
