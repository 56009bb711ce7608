"""mmrl's ROUGE and BLEU scorers against ``rouge_score`` and ``nltk`` (issue 62: the metric pins).

Every ROUGE/BLEU scorer mmrl has, each against the library configured as the code it stands for, on a few hundred
random text pairs (fixed seed; a vocabulary with punctuation, case, numbers, articles and repeated words; empty and
one-word texts among them):

* ``rewards.metrics.bleu`` (BLEU-1..4, uniform weights, no smoothing) and ``bleu1`` -- nltk's ``sentence_bleu``
  with those weights (``bleu1``: ``weights=(1, 0, 0, 0)``, as microsoft/LLaVA-Med ``llava/eval/run_eval.py`` calls
  it), no smoothing function, on mmrl's tokens (:func:`rewards.answers.text_tokens`);
* ``rewards.metrics.rouge_n`` (n = 1, 2) and ``rouge_l`` -- ``rouge_score``'s ROUGE-1/2/L F-measure with mmrl's
  tokens as its tokenizer; mmrl scores two empty texts 1.0 by design (``rouge_score``: 0.0);
* ``rewards.medical.lexical_score`` -- (nltk BLEU-n + rouge_score ROUGE) / 2;
* ``rewards.video_r1_metrics.rouge_mean`` -- ``rouge_score`` as tulerfeng/Video-R1
  ``src/r1-v/src/open_r1/grpo.py`` (``compute_rouge_score``) configures it: ROUGE-1/2/L with Porter stemming and
  its own tokenizer, ``score(reference, hypothesis)``, the mean of the three F-measures;
* ``data_pipelines.diversity.sentence_bleu`` / ``self_bleu`` (VAS's trajectory diversity) -- nltk's
  ``sentence_bleu`` as LengSicong/MMR1 ``verl/curriculum/metrics.py`` (``calculate_self_bleu_123``) calls it:
  every other completion of the group a reference, weights (1/3, 1/3, 1/3), ``SmoothingFunction().method1``.
"""

from __future__ import annotations

import random
import warnings

import pytest
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_score import rouge_scorer

from data_pipelines.diversity import self_bleu
from data_pipelines.diversity import sentence_bleu as mmrl_sentence_bleu
from rewards.answers import text_tokens
from rewards.medical import lexical_score
from rewards.metrics import bleu, bleu1, rouge_l, rouge_n
from rewards.video_r1_metrics import rouge_mean

VOCAB = ["the", "The", "a", "An", "left", "Left", "lung", "lungs", "mass", "masses", "running", "runs", "ran", "CT",
         "ct", "x-ray", "3.5", "3,5", "10%", "2", "don't", "naïve", "(b)", "B.", ",", ".", "!", "?", "-", "is", "of",
         "and", "no", "yes", "Yes.", "fracture", "fractures", "normal", "abnormal", "heart", "Heart's", "size"]
PAIRS = 400


def random_text(rng: random.Random) -> str:
    """Empty, one word, or up to 14 words; sometimes from a small pool, so words and n-grams repeat."""
    kind = rng.random()
    if kind < 0.08:
        return rng.choice(["", " ", "  .  ", "the"])
    if kind < 0.2:
        return rng.choice(VOCAB)
    pool = rng.sample(VOCAB, 4) if rng.random() < 0.4 else VOCAB
    return " ".join(rng.choice(pool) for _ in range(rng.randint(2, 14)))


def edited(rng: random.Random, text: str) -> str:
    """``text`` with a few words dropped, swapped, changed or added: overlaps of every n-gram order."""
    words = text.split()
    for _ in range(rng.randint(0, 3)):
        op = rng.randrange(4)
        if op == 0 and words:
            words.pop(rng.randrange(len(words)))
        elif op == 1 and len(words) > 1:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        elif op == 2 and words:
            words[rng.randrange(len(words))] = rng.choice(VOCAB)
        else:
            words.insert(rng.randint(0, len(words)), rng.choice(VOCAB))
    return " ".join(words)


def random_pairs(seed: int, n: int = PAIRS) -> list[tuple[str, str]]:
    """(prediction, reference) pairs: half of the references an edit of the prediction, half independent."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pred = random_text(rng)
        ref = edited(rng, pred) if rng.random() < 0.5 else random_text(rng)
        out.append((pred, ref) if rng.random() < 0.5 else (ref, pred))
    return out


def nltk_bleu(pred_tokens: list, ref_tokens_list: list[list], weights: tuple, smoothing=None) -> float:
    with warnings.catch_warnings():  # nltk warns of every zero n-gram count without smoothing
        warnings.simplefilter("ignore")
        return float(sentence_bleu(ref_tokens_list, pred_tokens, weights=weights, smoothing_function=smoothing))


class MmrlTokens:
    """``rouge_score``'s tokenizer interface over mmrl's normaliser."""

    def tokenize(self, text: str) -> list[str]:
        return text_tokens(text)


def spread(values: list[float]) -> None:
    """The pairs exercise the scorer: zeros, ones and values in between all occur."""
    assert any(v == 0 for v in values) and any(0.05 < v < 0.95 for v in values), sorted(set(values))[:10]


@pytest.mark.parametrize("max_n", [1, 2, 3, 4])
def test_bleu_is_nltks_sentence_bleu_without_smoothing(max_n: int) -> None:
    got, want = [], []
    for pred, ref in random_pairs(seed=100 + max_n):
        got.append(bleu(pred, ref, max_n=max_n))
        want.append(nltk_bleu(text_tokens(pred), [text_tokens(ref)], (1 / max_n,) * max_n))
    # nltk gives an order without a match the precision sys.float_info.min (a score ~1e-77), mmrl 0
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    spread(got)


def test_bleu1_is_nltks_as_llava_med_calls_it() -> None:
    """LLaVA-Med run_eval.py: ``sentence_bleu([gt.split()], pred.split(), weights=(1, 0, 0, 0))`` after its VQA
    normaliser (eval_metrics/glossary.py ``normalize_word``); mmrl's tokens are its own normaliser's
    (rewards/metrics.py, bleu1, says where the two differ)."""
    pairs = random_pairs(seed=7)
    got = [bleu1(p, r) for p, r in pairs]
    want = [nltk_bleu(text_tokens(p), [text_tokens(r)], (1, 0, 0, 0)) for p, r in pairs]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    spread(got)
    # articles and punctuation go in both normalisers; number words stay words in mmrl's ("two" is "2" in
    # LLaVA-Med's, which would score this 1.0)
    assert bleu1("The left lung.", "left lung") == 1.0
    assert bleu1("two masses", "2 masses") == pytest.approx(0.5)


@pytest.mark.parametrize("variant", ["rouge1", "rouge2", "rougeL"])
def test_rouge_is_rouge_scores_on_the_same_tokens(variant: str) -> None:
    scorer = rouge_scorer.RougeScorer([variant], tokenizer=MmrlTokens())
    ours = rouge_l if variant == "rougeL" else (lambda p, r: rouge_n(p, r, n=int(variant[-1])))
    got, want, both_empty = [], [], 0
    for pred, ref in random_pairs(seed=200 + len(variant) + int(variant[-1] == "2")):
        if not text_tokens(pred) and not text_tokens(ref):
            both_empty += 1  # mmrl's choice, below
            continue
        got.append(ours(pred, ref))
        want.append(scorer.score(ref, pred)[variant].fmeasure)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    spread(got)
    assert both_empty > 0
    # two texts without a token: mmrl 1.0 (SQuAD's convention, as its token F1), rouge_score 0.0
    assert ours("the", ".") == 1.0 and scorer.score(".", "the")[variant].fmeasure == 0.0


@pytest.mark.parametrize(("bleu_n", "rouge"), [(1, "rouge1"), (2, "rouge2"), (4, "rougeL")])
def test_the_lexical_reward_is_the_mean_of_the_two_libraries(bleu_n: int, rouge: str) -> None:
    scorer = rouge_scorer.RougeScorer([rouge], tokenizer=MmrlTokens())
    for pred, ref in random_pairs(seed=300 + bleu_n):
        if not text_tokens(pred) and not text_tokens(ref):
            continue
        b = nltk_bleu(text_tokens(pred), [text_tokens(ref)], (1 / bleu_n,) * bleu_n)
        r = scorer.score(ref, pred)[rouge].fmeasure
        assert lexical_score(pred, ref, bleu_n=bleu_n, rouge=rouge) == pytest.approx((b + r) / 2, abs=1e-12)


@pytest.mark.parametrize("use_stemmer", [True, False])
def test_video_r1_rouge_mean_is_rouge_score_as_video_r1_configures_it(use_stemmer: bool) -> None:
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=use_stemmer)
    got, want = [], []
    for pred, ref in random_pairs(seed=400 + use_stemmer):
        s = scorer.score(ref, pred)  # grpo.py: compute_rouge_score(gt_ans, output_ans) -> score(reference, hyp)
        want.append((s["rouge1"].fmeasure + s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 3)
        got.append(rouge_mean(pred, ref, use_stemmer=use_stemmer))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    spread(got)
    # stemming is on by default, as grpo.py's
    assert rouge_mean("lungs are clear", "lung are clear") == 1.0
    assert rouge_mean("lungs are clear", "lung are clear", use_stemmer=False) < 1.0


def random_groups(seed: int, n: int = 120) -> list[list[list[int]]]:
    """Groups of 2-6 token-id completions (0-12 tokens, a small vocabulary: repeated n-grams, empty ones)."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        vocab = rng.randint(2, 9)
        base = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
        group = []
        for _ in range(rng.randint(2, 6)):
            seq = list(base) if rng.random() < 0.6 else [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
            for _ in range(rng.randint(0, 3)):
                if seq and rng.random() < 0.5:
                    seq.pop(rng.randrange(len(seq)))
                else:
                    seq.insert(rng.randint(0, len(seq)), rng.randrange(vocab))
            group.append(seq)
        groups.append(group)
    return groups


def test_vas_self_bleu_is_nltks_as_mmr1_calls_it() -> None:
    weights, smooth = (1 / 3, 1 / 3, 1 / 3), SmoothingFunction().method1
    got, want = [], []
    for group in random_groups(seed=500):
        for i, hyp in enumerate(group):
            refs = group[:i] + group[i + 1:]
            got.append(mmrl_sentence_bleu(hyp, refs, max_n=3))
            want.append(nltk_bleu(hyp, refs, weights, smooth))
        expected = sum(want[-len(group):]) / len(group)  # calculate_self_bleu_123: the mean over the group
        assert self_bleu(group) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)
    spread(got)
