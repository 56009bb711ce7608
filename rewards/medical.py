"""Rewards for medical VQA: closed questions (MedCCO stage 1), open questions (MedCCO stage 2) and ARMed's
adaptive remap of a continuous reward. Import this module (``imports: [rewards.medical]``) to register them.

Which questions a reward scores: each sample is *closed* or *open* -- ``meta.answer_type`` when the data says
so (the medical readers record it), else by problem type (``yes_no``/``multiple_choice``/``numeric`` are
closed; ``open``/``free_form`` are open). The closed reward returns ``None`` ("not applicable") on open
questions and the open rewards ``None`` on closed ones (setting ``answer_types: all`` scores both), so one
reward list serves a mixed pool, and a curriculum stage may replay earlier questions.

References are the gold ``answer`` (a string or a list) and ``meta.synonyms``; an open reward takes the best
reference. Answers are read from the ``<answer>`` block (settings ``tag``, ``think_tag``, ``fallback`` as in
:func:`rewards.answers.extract_answer`). Text is normalised by :func:`rewards.answers.text_tokens`.

Registered rewards (settings with their defaults; the sources: docs/methods/medcco.md):

* ``medical_closed`` -- multiple choice: 1.0 when the answer is the gold letter (``B``, ``(B)``, ``B.``), the
  gold option's text, or ``B. text`` (MedVLThinker); ``partial_credit=0.0``: the score when the answer is
  not one of those but still names the gold letter (``B) because ...``; MedVLM-R1 gives 0.5). Yes/no: 1.0
  when exactly one of *yes*/*no* occurs among the answer's words and it is the gold one (MedEvalKit's XOR
  rule). Other closed answers (SLAKE's "left", "CT"): normalised exact match. ``gate_format=False``: when
  true, a completion that fails :func:`rewards.format.check_format` (``format_mode="answer"``) scores 0.
* ``lexical`` -- (BLEU + ROUGE) / 2 with ``bleu_n=1`` (BLEU-1; BLEU-4 collapses on short answers) and
  ``rouge="rouge1"`` (or ``rouge2``, ``rougeL``); MedCCO names neither variant, ARMed reports BLEU-1/ROUGE-1.
* ``semantic`` -- similarity from a local embedding model (:mod:`rewards.semantic`): ``scorer="minilm"`` (or
  a model folder), ``metric="cosine"`` (or ``bertscore``), ``device="cpu"``, ``batch_size=64``; clipped to
  [0, 1]; an empty answer scores 0. BERTScore's settings: ``layer`` (the encoder layer whose token embeddings
  are matched; default the last), ``part="f1"`` (or ``precision``, ``recall``), ``idf_corpus`` (a text file,
  one reference a line: idf weights from it; default none, uniform weights), ``baseline`` (rescale
  ``(x − b)/(1 − b)``; :func:`rewards.semantic.estimate_baseline` computes one; default none).
* ``medcco_open`` -- MedCCO's open-ended reward λ/2·(BLEU + ROUGE) + (1 − λ)·semantic with ``lam=0.5`` (the
  paper gives no λ) and the settings of ``lexical`` and ``semantic``. To remap only the semantic part, use
  ``lexical`` and ``semantic`` as two entries with weights λ and 1 − λ instead.
* ``med_token_f1`` (SQuAD token F1), ``med_recall`` (LLaVA-Med's open recall), ``med_exact`` (exact match
  after normalisation) -- open questions only, unlike the general ``token_f1`` reward.
* ``armed`` -- ARMed's adaptive remap around any continuous reward, built with ``init`` (see
  :class:`AdaptiveRemap`)::

      - {name: armed, label: semantic, weight: 0.5, init: {reward: semantic, quantile: 0.5, slope: 10}}
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mmrl_common.errors import ConfigError
from rewards import answers as A
from rewards.accuracy import answer_from_settings, reference_answers, sample_meta, sample_rows
from rewards.format import check_format
from rewards.metrics import bleu, exact_match, llava_med_overlap, rouge_l, rouge_n, token_f1
from rewards.registry import (
    call_reward,
    normalize_completions,
    per_sample_error,
    register_reward,
    resolve_reward,
)

__all__ = ["AdaptiveRemap", "answer_type", "lexical_score", "quantile", "remap"]

CLOSED_TYPES = ("yes_no", "multiple_choice", "numeric")
OPEN_TYPES = ("open", "free_form")
ANSWER_TYPES = ("open", "closed", "all")
ROUGES = ("rouge1", "rouge2", "rougeL")


def answer_type(problem_type: Any, meta: Mapping[str, Any] | None = None) -> str:
    """``"closed"`` or ``"open"``: ``meta.answer_type`` when it says so, else by problem type."""
    given = str((meta or {}).get("answer_type", "")).lower()
    if given in ("open", "closed"):
        return given
    return "closed" if problem_type in CLOSED_TYPES else "open"


def _applies(row: Mapping[str, Any], wanted: str) -> bool:
    if wanted not in ANSWER_TYPES:
        raise ConfigError(f"answer_types must be one of {', '.join(ANSWER_TYPES)}, got {wanted!r}")
    return wanted == "all" or answer_type(row.get("problem_type"), sample_meta(row)) == wanted


def _each(completions: Sequence[Any], columns: Mapping[str, Any], wanted: str,
          one: Callable[[str, str, dict[str, Any], dict[str, Any]], float | None]) -> list[float | None]:
    """``one(answer, completion, row, settings)`` on every sample this reward applies to, None elsewhere."""
    texts = normalize_completions(completions)
    rows, settings = sample_rows(len(texts), columns)
    out: list[float | None] = []
    for i, (text, row) in enumerate(zip(texts, rows)):
        try:
            applies = _applies(row, wanted)
            out.append(one(answer_from_settings(text, settings), text, row, settings) if applies else None)
        except Exception as exc:
            per_sample_error(i, exc)
            raise
    return out


# --------------------------------------------------------------------------------------------------------
# closed questions
# --------------------------------------------------------------------------------------------------------

_LETTER_ONLY = re.compile(r"^\s*[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[\.:]?\s*$")


def score_mcq(answer: str, options: Any, gold: Any, *, partial_credit: float = 0.0) -> float:
    """1.0 for the gold letter, the gold option's text or ``letter. text``; ``partial_credit`` when the
    answer still names the gold letter (:func:`rewards.answers.extract_choice`); else 0.0."""
    letter = A.normalize_gold_choice(gold, options)
    opts = list(options.values()) if isinstance(options, Mapping) else list(options or [])
    text = A.option_text(letter, opts["ABCDEFGHIJKLMNOPQRSTUVWXYZ".index(letter)])
    m = _LETTER_ONLY.match(answer)
    if m:
        return float(m.group(1).upper() == letter)
    said = A.normalize_text(answer)
    if said and said in (text, A.normalize_text(f"{letter} {text}")):
        return 1.0
    if partial_credit and A.extract_choice(answer, options) == letter:
        return float(partial_credit)
    return 0.0


def score_yes_no_xor(answer: str, gold: Any) -> float:
    """MedEvalKit's rule: exactly one of yes/no among the answer's words, and it is the gold one."""
    words = set(A.text_tokens(answer))
    said = [w for w in ("yes", "no") if w in words]
    return float(len(said) == 1 and said[0] == A.normalize_gold_yes_no(gold))


def _closed_one(answer: str, text: str, row: dict[str, Any], s: dict[str, Any]) -> float:
    if s.get("gate_format") and not check_format(text, mode=s.get("format_mode", "answer")):
        return 0.0
    pt = row.get("problem_type")
    if pt == "multiple_choice":
        return score_mcq(answer, row.get("options"), row.get("answer"),
                         partial_credit=float(s.get("partial_credit", 0.0)))
    if pt == "yes_no" or A.normalize_text(row.get("answer")) in ("yes", "no"):
        return score_yes_no_xor(answer, row.get("answer"))
    if pt == "numeric":
        from rewards.accuracy import score_numeric

        return score_numeric(answer, row, **s)
    return max(exact_match(answer, ref) for ref in reference_answers(row))


@register_reward("medical_closed")
def medical_closed(completions: list[Any], **columns: Any) -> list[float | None]:
    """Closed-question accuracy (see the module docstring); None on open questions."""
    return _each(completions, columns, columns.get("answer_types", "closed"), _closed_one)


# --------------------------------------------------------------------------------------------------------
# open questions
# --------------------------------------------------------------------------------------------------------


def lexical_score(answer: str, reference: str, *, bleu_n: int = 1, rouge: str = "rouge1") -> float:
    """(BLEU-``bleu_n`` + ROUGE) / 2 of one answer against one reference."""
    if rouge not in ROUGES:
        raise ConfigError(f"rouge must be one of {', '.join(ROUGES)}, got {rouge!r}")
    r = rouge_l(answer, reference) if rouge == "rougeL" else rouge_n(answer, reference, n=int(rouge[-1]))
    return (bleu(answer, reference, max_n=int(bleu_n)) + r) / 2


def _open_metric(metric: Callable[[str, str], float]):
    def one(answer: str, text: str, row: dict[str, Any], s: dict[str, Any]) -> float:
        return max(metric(answer, ref) for ref in reference_answers(row))
    return one


@register_reward("lexical")
def lexical(completions: list[Any], **columns: Any) -> list[float | None]:
    """(BLEU + ROUGE) / 2, best reference; open questions."""
    b, r = int(columns.get("bleu_n", 1)), columns.get("rouge", "rouge1")
    return _each(completions, columns, columns.get("answer_types", "open"),
                 _open_metric(lambda a, ref: lexical_score(a, ref, bleu_n=b, rouge=r)))


@register_reward("med_token_f1")
def med_token_f1(completions: list[Any], **columns: Any) -> list[float | None]:
    """SQuAD token F1, best reference; open questions."""
    return _each(completions, columns, columns.get("answer_types", "open"), _open_metric(token_f1))


@register_reward("med_recall")
def med_recall(completions: list[Any], **columns: Any) -> list[float | None]:
    """LLaVA-Med's open-question recall, best reference; open questions."""
    return _each(completions, columns, columns.get("answer_types", "open"),
                 _open_metric(lambda a, ref: llava_med_overlap(a, ref)[1]))


@register_reward("med_exact")
def med_exact(completions: list[Any], **columns: Any) -> list[float | None]:
    """Exact match after normalisation, any reference; open questions."""
    return _each(completions, columns, columns.get("answer_types", "open"), _open_metric(exact_match))


def _semantic_scores(completions: list[Any], columns: Mapping[str, Any], wanted: str
                     ) -> tuple[list[float | None], list[str], list[list[str]]]:
    """Best-reference semantic similarity per sample (clipped to [0, 1]), the answers and references."""
    from rewards.semantic import get_semantic_scorer

    texts = normalize_completions(completions)
    rows, s = sample_rows(len(texts), columns)
    metric = s.get("metric", "cosine")
    scorer = get_semantic_scorer(s.get("scorer", "minilm"), metric=metric, device=s.get("device", "cpu"),
                                 batch_size=int(s.get("batch_size", 64)), layer=s.get("layer"))
    options = _bertscore_options(scorer, s) if metric == "bertscore" else {}
    answers, refs, pairs = [], [], []
    for i, (text, row) in enumerate(zip(texts, rows)):
        answers.append(answer_from_settings(text, s))
        refs.append(reference_answers(row) if _applies(row, wanted) else [])
        pairs.extend((answers[-1], r) for r in refs[-1])
    sims = scorer.similarity([p for p, _ in pairs], [r for _, r in pairs], **options) if pairs else []
    out: list[float | None] = []
    k = 0
    for rs in refs:
        if not rs:
            out.append(None)
            continue
        out.append(min(1.0, max(0.0, max(sims[k:k + len(rs)]))))
        k += len(rs)
    return out, answers, refs


_IDF: dict[tuple[int, str], dict[int, float]] = {}


def _bertscore_options(scorer: Any, s: Mapping[str, Any]) -> dict[str, Any]:
    """The BERTScore settings of a reward entry: ``part``, ``baseline``, idf weights from ``idf_corpus``."""
    out: dict[str, Any] = {"part": s.get("part", "f1")}
    if s.get("baseline") is not None:
        out["baseline"] = float(s["baseline"])
    corpus = s.get("idf_corpus")
    if corpus:
        key = (id(scorer), str(corpus))
        if key not in _IDF:
            from pathlib import Path

            path = Path(str(corpus)).expanduser()
            if not path.is_file():
                raise ConfigError(f"semantic: idf_corpus {str(corpus)!r} is not a file (one reference text a line)")
            _IDF[key] = scorer.idf_weights(path.read_text(encoding="utf-8").splitlines())
        out["idf"] = _IDF[key]
    return out


@register_reward("semantic", locate_errors=False)
def semantic(completions: list[Any], **columns: Any) -> list[float | None]:
    """Embedding similarity to the best reference, in [0, 1]; open questions."""
    return _semantic_scores(completions, columns, columns.get("answer_types", "open"))[0]


@register_reward("medcco_open", locate_errors=False)
def medcco_open(completions: list[Any], **columns: Any) -> list[float | None]:
    """λ/2·(BLEU + ROUGE) + (1 − λ)·semantic (MedCCO stage 2), best reference; open questions."""
    lam = float(columns.get("lam", 0.5))
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"medcco_open: lam must be in [0, 1], got {lam}")
    sem, answers, refs = _semantic_scores(completions, columns, columns.get("answer_types", "open"))
    b, r = int(columns.get("bleu_n", 1)), columns.get("rouge", "rouge1")
    out: list[float | None] = []
    for s, a, rs in zip(sem, answers, refs):
        if s is None:
            out.append(None)
            continue
        lex = max(lexical_score(a, ref, bleu_n=b, rouge=r) for ref in rs)
        out.append(lam * lex + (1 - lam) * s)  # λ/2·(BLEU + ROUGE) = λ·lexical
    return out


# --------------------------------------------------------------------------------------------------------
# ARMed's adaptive remap
# --------------------------------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default): position
    ``q·(n − 1)`` in the sorted values."""
    if not values:
        raise ValueError("quantile of no values")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def remap(value: float, threshold: float, slope: float) -> float:
    """``sigmoid(slope · (value − threshold))``."""
    z = slope * (value - threshold)
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class AdaptiveRemap:
    """ARMed's adaptive semantic reward around any continuous reward (arXiv 2508.12957;
    docs/methods/medcco.md, ARMed; the paper's parameters are not public, so these are mmrl's choices).

    Each call scores the batch with the wrapped ``reward``, appends the applicable raw scores to a history
    buffer of the last ``buffer_size`` scores (default 1024, about 30 steps of open questions in the medcco
    recipe), takes the ``quantile`` (default 0.5, the median) of the buffer -- current batch included -- as the
    threshold τ, and returns ``sigmoid(slope · (raw − τ))`` (``slope`` default 10: raw scores 0.1 apart around
    τ end up about 0.25 apart). Not-applicable samples stay None. Until ``min_history`` scores (default 0)
    have been seen the raw scores pass through unchanged. The buffer is saved with checkpoints by the
    curriculum plug-in (:meth:`state_dict`). The threshold and the raw and remapped means are logged as
    ``reward_metric/<reward>_armed_{threshold,raw,remapped}``, and the mean within-group spread (population std)
    of the same rollouts' raw and remapped scores as ``reward_metric/<reward>_armed_{raw,remapped}_spread``
    (a paired measure of what the remap does to the spread GRPO's group normalisation sees).

    Configure it with ``init``; the entry's ``kwargs`` go to the wrapped reward::

        - {name: armed, label: semantic, init: {reward: semantic, quantile: 0.5, slope: 10}, kwargs: {scorer: minilm}}
    """

    def __init__(self, *args: Any, reward: str = "semantic", quantile: float = 0.5, slope: float = 10.0,
                 buffer_size: int = 1024, min_history: int = 0, **unknown: Any):
        if args or "completions" in unknown:
            raise ConfigError("the 'armed' reward wraps another reward: configure it with init, e.g. "
                              "{name: armed, init: {reward: semantic, quantile: 0.5, slope: 10}}")
        if unknown:
            raise ConfigError(f"armed: unknown init setting(s) {sorted(unknown)}; valid: reward, quantile, slope, "
                              "buffer_size, min_history (the wrapped reward's settings go in the entry's kwargs)")
        if not 0.0 <= float(quantile) <= 1.0:
            raise ConfigError(f"armed: quantile must be in [0, 1], got {quantile}")
        if float(slope) <= 0:
            raise ConfigError(f"armed: slope must be > 0, got {slope}")
        if int(buffer_size) < 1:
            raise ConfigError(f"armed: buffer_size must be >= 1, got {buffer_size}")
        self.reward = str(reward)
        self.fn, _ = resolve_reward(self.reward, where="armed: reward")
        self.q, self.slope, self.min_history = float(quantile), float(slope), int(min_history)
        self.buffer: deque[float] = deque(maxlen=int(buffer_size))
        self.seen = 0
        self.threshold: float | None = None
        self.__name__ = f"armed({self.reward})"

    def __call__(self, completions: list[Any], **columns: Any) -> list[float | None]:
        raw = list(call_reward(self.fn, completions, columns))
        vals = [float(v) for v in raw if v is not None]
        self.buffer.extend(vals)
        self.seen += len(vals)
        if not vals or self.seen < self.min_history:
            return raw
        self.threshold = quantile(list(self.buffer), self.q)
        out = [None if v is None else remap(float(v), self.threshold, self.slope) for v in raw]
        log = columns.get("log_metric")
        if callable(log):
            log(f"{self.reward}_armed_threshold", self.threshold)
            log(f"{self.reward}_armed_raw", sum(vals) / len(vals))
            log(f"{self.reward}_armed_remapped", sum(v for v in out if v is not None) / len(vals))
            batch = columns.get("rollout_batch")
            if batch is not None and len(batch) == len(raw):   # paired: the same rollouts before and after
                for name, values in (("raw_spread", raw), ("remapped_spread", out)):
                    spread = batch.group_spread(values)
                    if spread is not None:
                        log(f"{self.reward}_armed_{name}", spread)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self.buffer), "seen": self.seen, "threshold": self.threshold}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer.clear()
        self.buffer.extend(float(v) for v in state.get("buffer", []))
        self.seen = int(state.get("seen", len(self.buffer)))
        self.threshold = state.get("threshold")


register_reward("armed", AdaptiveRemap, locate_errors=False)
