"""LLaVA-Med open-question overlap and NLTK-style BLEU-1, against hand-computed values."""

import math

import pytest

from rewards.metrics import bleu1, llava_med_overlap


def test_overlap_precision_recall_f1() -> None:
    # pred tokens (articles dropped): left side of lung; ref: left lung -> tp 2, fp 2, fn 0
    p, r, f = llava_med_overlap("the left side of lung", "left lung")
    assert (p, r) == (0.5, 1.0)
    assert f == pytest.approx(2 / 3)


def test_overlap_counts_prediction_multiplicity() -> None:
    # C = {left: 2}, R = {left: 1, right: 1}: tp = 2 (prediction count), fp = 0, fn = 1
    p, r, f = llava_med_overlap("left left", "left right")
    assert (p, r) == (1.0, pytest.approx(2 / 3))
    assert f == pytest.approx(0.8)


@pytest.mark.parametrize("pred, ref", [("", "left"), ("left", ""), ("right", "left"), (None, "x")])
def test_overlap_zero_cases(pred, ref) -> None:
    assert llava_med_overlap(pred, ref) == (0.0, 0.0, 0.0)


def test_bleu1_brevity_penalty_and_clipping() -> None:
    assert bleu1("left lung", "the left lung") == 1.0  # article removed by the shared normaliser
    assert bleu1("left", "left lung") == pytest.approx(math.exp(1 - 2 / 1))  # c < r: BP = exp(1 - r/c)
    assert bleu1("left lung mass here", "left lung") == 0.5  # c > r: BP = 1, p1 = 2/4
    assert bleu1("left left left", "left lung") == pytest.approx(1 / 3)  # clipped to the reference count
    assert bleu1("", "left") == 0.0 and bleu1("right", "left") == 0.0
