"""Video-R1's answer scores for transcription (OCR) and free-form answers, as its released reward defines them
(tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``, ``accuracy_reward``). Pure functions; the ``accuracy``
reward uses them for the ``ocr`` and ``free_form`` problem types (:mod:`rewards.accuracy`).

* :func:`word_error_rate`: the word-level edit distance (substitutions, insertions and deletions, each 1;
  rapidfuzz's Levenshtein on the word lists)
  between the reference and the hypothesis, split on whitespace as given (case and punctuation count), over
  ``max(1, number of reference words)``.
* :func:`ocr_score`: ``clip(1 - WER, 0, 1)``.
* :func:`rouge_mean`: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures with Porter stemming (the
  ``rouge-score`` package, as Video-R1 calls it), clipped to [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from rapidfuzz.distance import Levenshtein  # a dependency of mmrl (pyproject.toml)

__all__ = ["ocr_score", "rouge_mean", "word_edit_distance", "word_error_rate"]


def word_edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance between two word sequences (rapidfuzz's bit-parallel Levenshtein on the word lists:
    substitutions, insertions and deletions cost 1 each)."""
    return Levenshtein.distance(reference, hypothesis)


def word_error_rate(reference: Any, hypothesis: Any) -> float:
    """Word edit distance / max(1, reference words), words split on whitespace (Video-R1's ``wer``)."""
    ref, hyp = str(reference).split(), str(hypothesis).split()
    return word_edit_distance(ref, hyp) / max(1, len(ref))


def ocr_score(prediction: Any, reference: Any) -> float:
    """Video-R1's OCR accuracy: ``clip(1 - WER(reference, prediction), 0, 1)``."""
    return max(0.0, min(1.0, 1.0 - word_error_rate(reference, prediction)))


@lru_cache(maxsize=2)
def _scorer(use_stemmer: bool) -> Any:
    from rouge_score import rouge_scorer  # a dependency of mmrl (pyproject.toml)

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=use_stemmer)


def rouge_mean(prediction: Any, reference: Any, *, use_stemmer: bool = True) -> float:
    """Video-R1's free-form accuracy: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures of the
    prediction against the reference (``rouge-score``'s tokenizer: lower-case, alphanumeric words; Porter
    stemming), clipped to [0, 1]: ``RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(reference,
    prediction)`` as grpo.py's ``compute_rouge_score`` calls it (pinned in tests/test_metric_pins.py)."""
    scores = _scorer(bool(use_stemmer)).score(str(reference), str(prediction))
    mean = (scores["rouge1"].fmeasure + scores["rouge2"].fmeasure + scores["rougeL"].fmeasure) / 3
    return max(0.0, min(1.0, mean))
