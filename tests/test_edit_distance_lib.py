"""Edit distances through rapidfuzz (issue 50): Video-R1's word-level WER (``ocr`` scoring,
:func:`rewards.video_r1_metrics.word_edit_distance`) and the token Levenshtein of the VAS trajectory diversity
(:func:`data_pipelines.diversity.levenshtein`) equal the O(n*m) dynamic programme they replace -- kept here as
the reference oracle -- on many random cases, on empty sides and through the paths that use them (the
``accuracy`` reward on an ``ocr`` answer, the VAS sampler's ``edit`` diversity); rapidfuzz is a declared and
pinned dependency of mmrl."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from data_pipelines.diversity import edit_diversity, levenshtein, normalized_edit_distance
from mmrl.methods.vas import VarianceAwareSampler
from perf.libraries import dp_levenshtein
from rewards.video_r1_metrics import ocr_score, word_edit_distance, word_error_rate

ROOT = Path(__file__).resolve().parents[1]


oracle = dp_levenshtein  # the textbook DP (insert, delete, substitute: 1 each) mmrl used before rapidfuzz


def random_pairs(seed: int, n: int, alphabet: list, max_len: int):
    rng = random.Random(seed)
    for _ in range(n):
        a = [rng.choice(alphabet) for _ in range(rng.randint(0, max_len))]
        if rng.random() < 0.5:  # a near copy: the common case of an answer against its reference
            b = list(a)
            for _ in range(rng.randint(0, 4)):
                op, k = rng.choice("isd"), rng.randint(0, len(b))
                if op == "i":
                    b.insert(k, rng.choice(alphabet))
                elif b and k < len(b):
                    b[k] = rng.choice(alphabet) if op == "s" else b[k]
                    if op == "d":
                        del b[k]
        else:
            b = [rng.choice(alphabet) for _ in range(rng.randint(0, max_len))]
        yield a, b


WORDS = ["the", "The", "cat", "cat.", "sat", "on", "mat", "a", "STOP", "42", "x" * 30, "é"]


def test_word_edit_distance_equals_the_dp_on_random_word_lists() -> None:
    for a, b in random_pairs(0, 600, WORDS, 25):
        assert word_edit_distance(a, b) == oracle(a, b), (a, b)
        assert word_edit_distance(b, a) == oracle(a, b)


def test_token_levenshtein_equals_the_dp_on_random_token_ids() -> None:
    for alphabet in ([0, 1], list(range(50)), [151643, 151645, 7, 8, 2**40]):  # padded ids, large ids
        for a, b in random_pairs(len(alphabet), 300, alphabet, 60):
            assert levenshtein(a, b) == oracle(a, b), (a, b)
            longest = max(len(a), len(b))
            assert normalized_edit_distance(a, b) == pytest.approx(oracle(a, b) / longest if longest else 0.0)
    # sequences longer than one 64-bit machine word (rapidfuzz's bit-parallel blocks)
    for a, b in random_pairs(7, 20, list(range(30)), 300):
        assert levenshtein(a, b) == oracle(a, b)


def test_empty_sides_and_tuples() -> None:
    assert word_edit_distance([], []) == levenshtein([], []) == 0
    assert word_edit_distance([], ["a", "b"]) == 2 and word_edit_distance(["a", "b", "c"], []) == 3
    assert levenshtein((), (1, 2, 3)) == 3 and levenshtein([4, 5], ()) == 2
    assert levenshtein((1, 2, 3), [1, 2, 3]) == 0  # a tuple and a list of the same tokens
    assert word_error_rate("", "") == 0.0 and word_error_rate("", "two words") == 2.0
    assert word_error_rate("a b c d", "") == 1.0 and normalized_edit_distance([], []) == 0.0


def test_ocr_score_and_accuracy_reward_as_the_user_scores_a_transcription() -> None:
    """Through the ``accuracy`` reward on an ``ocr`` problem (what a Video-R1 run computes)."""
    from rewards import get_reward

    rng = random.Random(3)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(40)]
    preds = [" ".join(w for w in r.split() if rng.random() > 0.2) + " extra" for r in refs]
    reward = get_reward("accuracy")
    n = len(refs)
    got = reward([f"<answer>{p}</answer>" for p in preds], id=[f"s{i}" for i in range(n)], problem_type=["ocr"] * n,
                 options=[None] * n, answer=refs, meta=[{}] * n)
    expected = [max(0.0, min(1.0, 1 - oracle(r.split(), p.split()) / len(r.split()))) for p, r in zip(preds, refs)]
    assert [ocr_score(p, r) for p, r in zip(preds, refs)] == pytest.approx(expected)
    assert got == pytest.approx(expected)


def test_vas_edit_diversity_through_the_sampler() -> None:
    """The sampler's ``edit`` TDS (normalised) and the released code's raw mean edit distance."""
    rng = random.Random(5)
    group = [[rng.randrange(20) for _ in range(rng.randint(0, 90))] for _ in range(8)]
    pairs = [(group[i], group[j]) for i in range(8) for j in range(i + 1, 8)]
    normalised = sum(oracle(a, b) / max(len(a), len(b), 1) for a, b in pairs) / len(pairs)
    sampler = VarianceAwareSampler(list(range(4)), diversity="edit")
    assert sampler.score_group([1, 0, 0, 0, 1, 1, 0, 1], group) == (0.5, pytest.approx(normalised))
    assert edit_diversity(group) == pytest.approx(normalised)
    released = VarianceAwareSampler(list(range(4)), diversity="edit", released_code=True)
    width = 100
    padded = [g + [0] * (width - len(g)) for g in group]
    raw = sum(oracle(padded[i], padded[j]) for i in range(8) for j in range(i + 1, 8)) / len(pairs)
    assert released.score_group([1] * 8, group, pad_id=0, pad_to=width) == (1.0, pytest.approx(raw))


def test_rapidfuzz_is_a_declared_pinned_dependency() -> None:
    """``pip install -c constraints.txt -e .`` brings rapidfuzz, at the version these tests ran with."""
    from importlib.metadata import version

    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.DOTALL | re.MULTILINE).group(1)
    assert re.search(r'"rapidfuzz[>=<~ 0-9.,]*"', deps)
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split() if "==" in line)
    assert pins.get("rapidfuzz") == version("rapidfuzz")
