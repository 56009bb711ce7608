"""Small text and time metrics used by the rewards (pure functions, no dependencies).

The BLEU and ROUGE scorers here equal ``nltk``'s ``sentence_bleu`` and ``rouge_score``'s F-measures on the same
tokens, pinned on random text pairs by tests/test_metric_pins.py; each docstring says where mmrl's differ by design.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rewards.answers import text_tokens

__all__ = ["bleu", "bleu1", "exact_match", "lcs_length", "llava_med_overlap", "rouge_l", "rouge_n", "temporal_iou",
           "token_f1"]


def _tokens(x: Any) -> list[str]:
    if isinstance(x, (list, tuple)):
        return [str(t) for t in x]
    return text_tokens(x)


def token_f1(prediction: Any, reference: Any) -> float:
    """SQuAD-style token F1 over normalised tokens (:func:`rewards.answers.text_tokens`; lists of tokens
    are used as given). Multiset overlap; both empty → 1.0; exactly one empty → 0.0."""
    p, r = _tokens(prediction), _tokens(reference)
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def llava_med_overlap(prediction: Any, reference: Any) -> tuple[float, float, float]:
    """``(precision, recall, f1)`` of word overlap as LLaVA-Med scores open questions.

    With multiset counts C (prediction) and R (reference): tp = Σ_{w ∈ C∩R} C[w] (the *prediction's*
    count of each shared word), fp = Σ_{w ∈ C∖R} C[w], fn = Σ_{w ∈ R∖C} R[w]; recall = tp/(tp+fn),
    precision = tp/(tp+fp). Everything is 0 when tp = 0 or either side is empty. Tokens are the shared
    normaliser's (:func:`rewards.answers.text_tokens`); LLaVA-Med's "open recall" is the recall here.
    """
    c, r = Counter(_tokens(prediction)), Counter(_tokens(reference))
    if not c or not r:
        return 0.0, 0.0, 0.0
    tp = sum(n for w, n in c.items() if w in r)
    if tp == 0:
        return 0.0, 0.0, 0.0
    fp = sum(n for w, n in c.items() if w not in r)
    fn = sum(n for w, n in r.items() if w not in c)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return precision, recall, 2 * precision * recall / (precision + recall)


def bleu1(prediction: Any, reference: Any) -> float:
    """Sentence BLEU-1 as NLTK computes it with weights (1, 0, 0, 0) and no smoothing (microsoft/LLaVA-Med
    llava/eval/run_eval.py's call): BP · p₁, where p₁ is the clipped unigram precision and BP = 1 if c > r else
    exp(1 − r/c) (c, r: prediction and reference lengths). An empty prediction or reference scores 0.

    The tokens are mmrl's normaliser's (:func:`rewards.answers.text_tokens`). LLaVA-Med splits the output of its
    VQA normaliser (eval_metrics/glossary.py ``normalize_word``) on white space: both drop articles and
    punctuation, but there number words become digits ("two" is "2") and contractions keep their apostrophe, so
    "two masses" against "2 masses" scores 0.5 here and 1.0 there."""
    p, r = _tokens(prediction), _tokens(reference)
    if not p or not r:
        return 0.0
    clipped = sum((Counter(p) & Counter(r)).values())
    if clipped == 0:
        return 0.0
    c, ref_len = len(p), len(r)
    bp = 1.0 if c > ref_len else math.exp(1 - ref_len / c)
    return bp * clipped / c


def bleu(prediction: Any, reference: Any, *, max_n: int = 1) -> float:
    """Sentence BLEU with uniform weights 1/``max_n`` over 1..``max_n``-grams and no smoothing, as NLTK's
    ``sentence_bleu`` computes it: BP · exp(Σ_k log p_k / max_n), p_k the clipped k-gram precision,
    BP = 1 if c > r else exp(1 − r/c). Any p_k = 0 (e.g. a prediction shorter than ``max_n`` tokens) gives
    0, which is why BLEU-4 collapses on one- or two-word answers (NLTK gives such an order the precision
    ``sys.float_info.min``: a score of about 1e-77 where this gives 0). ``max_n=1`` is :func:`bleu1`."""
    if max_n < 1:
        raise ValueError(f"BLEU max_n must be >= 1, got {max_n}")
    p, r = _tokens(prediction), _tokens(reference)
    if not p or not r:
        return 0.0
    log_sum = 0.0
    for k in range(1, max_n + 1):
        cand = Counter(tuple(p[i:i + k]) for i in range(len(p) - k + 1))
        ref = Counter(tuple(r[i:i + k]) for i in range(len(r) - k + 1))
        clipped = sum((cand & ref).values())
        total = sum(cand.values())
        if clipped == 0 or total == 0:
            return 0.0
        log_sum += math.log(clipped / total)
    c, ref_len = len(p), len(r)
    bp = 1.0 if c > ref_len else math.exp(1 - ref_len / c)
    return bp * math.exp(log_sum / max_n)


def rouge_n(prediction: Any, reference: Any, *, n: int = 1) -> float:
    """ROUGE-N F1 over normalised tokens: overlap = clipped count of shared n-grams, P = overlap/#pred n-grams,
    R = overlap/#ref n-grams, F = 2PR/(P+R) -- ``rouge_score``'s ROUGE-N F-measure given these tokens. No n-gram on
    one side → 0.0. Differences by design: the tokens are mmrl's normaliser's (:func:`rewards.answers.text_tokens`:
    articles dropped, numbers whole, no stemming; ``rouge_score``'s own tokenizer keeps articles, splits "3.5"
    and can stem), and two texts without a token score 1.0 (SQuAD's convention, as :func:`token_f1`;
    ``rouge_score``: 0.0)."""
    p, r = _tokens(prediction), _tokens(reference)
    if not p and not r:
        return 1.0
    cand = Counter(tuple(p[i:i + n]) for i in range(len(p) - n + 1))
    ref = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
    overlap = sum((cand & ref).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / sum(cand.values()), overlap / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: Any, reference: Any) -> float:
    """1.0 when the normalised token sequences are equal (:func:`rewards.answers.text_tokens`: lower-case,
    punctuation and articles removed), else 0.0."""
    return float(_tokens(prediction) == _tokens(reference))


def lcs_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common subsequence (O(len(a)·len(b)) time, O(len(b)) memory)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: Any, reference: Any, *, beta: float = 1.0) -> float:
    """ROUGE-L F-measure over normalised tokens: P = LCS/|pred|, R = LCS/|ref|,
    F = (1+β²)·P·R / (R + β²·P). ``beta=1`` (default) is the harmonic mean, ``rouge_score``'s ROUGE-L F-measure
    given these tokens; the tokens and the two empty texts (1.0) differ from it as :func:`rouge_n` says."""
    p, r = _tokens(prediction), _tokens(reference)
    if not p or not r:
        return float(p == r)
    lcs = lcs_length(p, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    b2 = beta * beta
    return (1 + b2) * precision * recall / (recall + b2 * precision)


def temporal_iou(pred: Sequence[float], gold: Sequence[float]) -> float:
    """Temporal IoU of two ``(start, end)`` spans: overlap / (max end − min start), floored at 0.

    Degenerate union (both spans the same single point) → 1.0 when identical, else 0.0.
    """
    s1, e1 = float(pred[0]), float(pred[1])
    s2, e2 = float(gold[0]), float(gold[1])
    if s1 > e1 or s2 > e2:
        raise ValueError(f"invalid span(s) {pred!r}, {gold!r}: start after end")
    inter = max(0.0, min(e1, e2) - max(s1, s2))
    union = max(e1, e2) - min(s1, s2)
    if union <= 0:
        return 1.0 if (s1, e1) == (s2, e2) else 0.0
    return inter / union
