"""Medical rewards against hand-computed values: BLEU-n, ROUGE-n, exact match, the MedCCO blend, LLaVA-Med
recall, closed questions (letter / option text / yes-no XOR / format gate), the real semantic scorer
(all-MiniLM-L6-v2 from its PyPI package, offline: paraphrases beat unrelated answers; sentence-transformers and
plain-transformers loading agree; BERTScore; the cache) and ARMed's quantile + sigmoid remap with its state."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

import rewards.medical as M
from mmrl.engine.batch import RolloutBatch, TokenSeq
from mmrl_common.errors import ConfigError
from rewards.metrics import bleu, bleu1, exact_match, rouge_n
from rewards.registry import CombinedReward, RewardError, register_reward
from rewards.semantic import default_model_dir, get_semantic_scorer


def sig(z: float) -> float:
    return 1 / (1 + math.exp(-z))


# ------------------------------------------------------------------------------------------ text metrics
def test_bleu_n_rouge_n_exact_by_hand() -> None:
    pred, ref = "left lower lobe mass", "mass in the left lower lobe"  # "the" is dropped: 4 vs 5 tokens
    # unigrams 4/4 clipped; bigrams (left lower)(lower lobe) of 3 -> 2/3; BP = exp(1 - 5/4)
    assert bleu(pred, ref, max_n=2) == pytest.approx(math.exp(-0.25) * math.sqrt(2 / 3))
    assert bleu(pred, ref, max_n=1) == pytest.approx(math.exp(-0.25)) == pytest.approx(bleu1(pred, ref))
    assert bleu("mass", "mass", max_n=2) == 0.0  # no bigram: BLEU-2 collapses on one-word answers
    assert rouge_n(pred, ref, n=1) == pytest.approx(2 * 1.0 * 0.8 / 1.8)  # P 4/4, R 4/5
    assert rouge_n(pred, ref, n=2) == pytest.approx(4 / 7)  # P 2/3, R 2/4
    assert rouge_n("", "") == 1.0 and rouge_n("x", "") == 0.0
    assert exact_match("The Left lung.", "left lung") == 1.0 and exact_match("left lung", "right lung") == 0.0


def cols(rows: list[dict]) -> dict:
    keys = ("id", "problem_type", "options", "answer", "meta")
    return {k: [r.get(k, {} if k == "meta" else None) for r in rows] for k in keys}


OPEN = {"id": "o", "problem_type": "open", "answer": "mass in the left lower lobe", "meta": {}}
MC = {"id": "m", "problem_type": "multiple_choice", "options": ["CT", "MRI", "X-ray", "Ultrasound"], "answer": "B"}
YN = {"id": "y", "problem_type": "yes_no", "answer": "yes"}
CLOSED_OTHER = {"id": "c", "problem_type": "open", "answer": "left", "meta": {"answer_type": "closed"}}


def test_open_metric_rewards_by_hand_and_none_on_closed() -> None:
    c = cols([OPEN, OPEN, MC])
    comps = ["<answer>left lower lobe mass</answer>", "<answer>left left</answer>", "<answer>B</answer>"]
    lex = M.lexical(comps, **c)
    assert lex[0] == pytest.approx((math.exp(-0.25) + 8 / 9) / 2)  # (BLEU-1 + ROUGE-1) / 2
    assert lex[2] is None
    assert M.lexical(comps[:1], **cols([OPEN]), bleu_n=2, rouge="rouge2")[0] == pytest.approx(
        (math.exp(-0.25) * math.sqrt(2 / 3) + 4 / 7) / 2)
    # LLaVA-Med recall: row 1 tp 4, fn 1 (in) -> 0.8; row 2 C = {left: 2}: tp = 2, fn = 4 -> 2/6
    assert M.med_recall(comps, **c) == [pytest.approx(0.8), pytest.approx(2 / 6), None]
    assert M.med_token_f1(comps[:1], **cols([OPEN]))[0] == pytest.approx(2 * 1.0 * 0.8 / 1.8)
    assert M.med_exact(["<answer>Mass in left lower lobe.</answer>"], **cols([OPEN])) == [1.0]
    syn = dict(OPEN, answer="upper left", meta={"synonyms": ["top left"]})
    assert M.med_exact(["<answer>top left</answer>"], **cols([syn])) == [1.0]  # any reference counts
    with pytest.raises(ConfigError, match="rouge must be one of"):
        M.lexical(comps[:1], **cols([OPEN]), rouge="rouge9")


def test_closed_rewards_letter_text_xor_and_format_gate() -> None:
    answers = ["B", "(B)", "MRI", "B. MRI", "b) MRI since it shows soft tissue", "A", "MRI or CT"]
    got = M.medical_closed([f"<answer>{a}</answer>" for a in answers], **cols([MC] * len(answers)))
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    partial = M.medical_closed(["<answer>b) MRI since it shows soft tissue</answer>"], **cols([MC]),
                               partial_credit=0.5)
    assert partial == [0.5]  # MedVLM-R1: the right letter with extra text
    yn = ["yes", "Yes, there is.", "yes and no", "no", "there is no lesion, yes"]
    assert M.medical_closed([f"<answer>{a}</answer>" for a in yn], **cols([YN] * len(yn))) == [1, 1, 0, 0, 0]
    assert M.medical_closed(["<answer>Left.</answer>", "<answer>right</answer>"], **cols([CLOSED_OTHER] * 2)) == [1, 0]
    assert M.medical_closed(["<answer>x</answer>"], **cols([OPEN])) == [None]
    gated = M.medical_closed(["B", "<answer>B</answer>"], **cols([MC, MC]), gate_format=True, fallback="whole")
    assert gated == [0.0, 1.0]


def test_answer_type_rule() -> None:
    assert M.answer_type("yes_no") == "closed" and M.answer_type("multiple_choice") == "closed"
    assert M.answer_type("open") == "open" and M.answer_type("open", {"answer_type": "closed"}) == "closed"


# ------------------------------------------------------------------------------------------ semantic scorer
PARAPHRASES = [  # (reference, paraphrase, unrelated answer), written for this test
    ("there is a fracture of the left femur", "the left thigh bone is broken", "the lungs are clear"),
    ("the lesion is brighter than the surrounding tissue", "the lesion appears bright",
     "the patient is a young man"),
    ("no abnormality is seen", "the scan looks normal", "a large mass in the liver"),
    ("pneumonia in the right lung", "infection of the right lung", "an MRI of the knee joint"),
    ("the heart is enlarged", "enlarged heart", "the kidneys have stones"),
    ("upper left", "top left", "bright"),
]


@pytest.fixture(scope="module")
def minilm():
    return get_semantic_scorer("minilm")


def test_paraphrases_score_higher_than_unrelated_answers(minilm) -> None:
    refs = [r for r, _, _ in PARAPHRASES]
    para = minilm.similarity([p for _, p, _ in PARAPHRASES], refs)
    other = minilm.similarity([u for _, _, u in PARAPHRASES], refs)
    assert all(p > u for p, u in zip(para, other)), list(zip(para, other))
    assert minilm.similarity(["upper left", ""], ["upper left", "upper left"]) == [pytest.approx(1.0, abs=1e-5), 0.0]


def test_scorer_is_cached_and_loaded_once(minilm) -> None:
    assert get_semantic_scorer("minilm") is minilm
    minilm.similarity(["a new answer x1", "a new answer x2"], ["ref r1", "ref r1"])
    before = minilm.encoded
    minilm.similarity(["a new answer x2", "a new answer x1"], ["ref r1", "ref r1"])
    assert minilm.encoded == before  # every text came from the cache


def test_local_folders_plain_bert_mean_pooling_and_bertscore(minilm, tmp_path: Path) -> None:
    src = default_model_dir()
    plain = tmp_path / "bert"  # the same weights as a plain transformers folder (no modules.json)
    shutil.copytree(src, plain, ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "*sentence*"))
    texts = [p for _, p, _ in PARAPHRASES]
    refs = [r for r, _, _ in PARAPHRASES]
    st = minilm.similarity(texts, refs)
    hf = get_semantic_scorer(plain).similarity(texts, refs)
    assert hf == pytest.approx(st, abs=1e-4)  # all-MiniLM-L6-v2 is mean pooling + normalisation
    bs = get_semantic_scorer(plain, metric="bertscore")
    assert bs.similarity(["top left"], ["top left"]) == [pytest.approx(1.0, abs=1e-5)]
    para = bs.similarity(texts, refs)
    other = bs.similarity([u for _, _, u in PARAPHRASES], refs)
    assert sum(p > u for p, u in zip(para, other)) >= len(PARAPHRASES) - 1
    with pytest.raises(ConfigError, match="config.json"):
        get_semantic_scorer(tmp_path / "missing")
    with pytest.raises(ConfigError, match="semantic metric"):
        get_semantic_scorer("minilm", metric="cosine-ish")


def test_semantic_reward_and_medcco_blend(minilm) -> None:
    syn = dict(OPEN, answer="upper left", meta={"synonyms": ["top left", "left upper"]})
    comps = ["<answer>top left corner</answer>", "<answer>bright</answer>", "<answer></answer>", "<answer>B</answer>"]
    c = cols([syn, syn, syn, MC])
    sem = M.semantic(comps, **c)
    best = max(minilm.similarity(["top left corner"] * 3, ["upper left", "top left", "left upper"]))
    assert sem[0] == pytest.approx(best) and sem[1] < sem[0] and sem[2] == 0.0 and sem[3] is None
    blend = M.medcco_open(comps, **c, lam=0.4)
    lex0 = max(M.lexical_score("top left corner", r) for r in ["upper left", "top left", "left upper"])
    assert blend[0] == pytest.approx(0.4 * lex0 + 0.6 * sem[0])  # λ/2·(BLEU + ROUGE) + (1 − λ)·semantic
    assert blend[3] is None
    assert M.medcco_open(["<answer>upper left</answer>"], **cols([syn])) == [pytest.approx(1.0, abs=1e-5)]


# ------------------------------------------------------------------------------------------ ARMed remap
@register_reward("t_raw_score")
def raw_score(completions, meta, **_):
    return [m.get("raw") for m in meta]


def batch(values):
    rows = [{"id": str(i), "problem_type": "open", "answer": "x", "meta": {"raw": v}} for i, v in enumerate(values)]
    return ["c"] * len(values), cols(rows)


def test_quantile_and_sigmoid_by_hand() -> None:
    assert M.quantile([0.4, 0.1, 0.3, 0.2], 0.5) == pytest.approx(0.25)
    assert M.quantile([0.4, 0.1, 0.3, 0.2], 0.25) == pytest.approx(0.175)  # position 0.75 between 0.1 and 0.2
    assert M.quantile([0.7], 0.9) == 0.7
    assert M.remap(0.4, 0.25, 10) == pytest.approx(sig(1.5)) and M.remap(0.25, 0.25, 3) == 0.5
    assert M.remap(-100, 0, 50) == pytest.approx(0.0) and M.remap(100, 0, 50) == pytest.approx(1.0)


def test_adaptive_remap_buffer_threshold_and_state() -> None:
    armed = M.AdaptiveRemap(reward="t_raw_score", quantile=0.5, slope=10, buffer_size=4)
    logged = {}
    c, k = batch([0.1, 0.4, None])
    out = armed(c, **k, log_metric=logged.__setitem__)
    assert out == [pytest.approx(sig(-1.5)), pytest.approx(sig(1.5)), None]  # τ = median(0.1, 0.4) = 0.25
    assert logged["t_raw_score_armed_threshold"] == pytest.approx(0.25)
    c, k = batch([0.5, 0.6])
    out = armed(c, **k)  # buffer 0.1 0.4 0.5 0.6: τ = 0.45
    assert out == [pytest.approx(sig(0.5)), pytest.approx(sig(1.5))]
    state = armed.state_dict()
    again = M.AdaptiveRemap(reward="t_raw_score", quantile=0.5, slope=10, buffer_size=4)
    again.load_state_dict(state)
    nxt = batch([0.9, 0.2])  # buffer keeps 4: 0.5 0.6 0.9 0.2 -> τ = 0.55
    assert armed(nxt[0], **nxt[1]) == again(nxt[0], **nxt[1]) == [pytest.approx(sig(3.5)), pytest.approx(sig(-3.5))]
    # spread: the remap widens a narrow band of raw scores
    narrow = M.AdaptiveRemap(reward="t_raw_score", slope=20)
    raw = [0.82, 0.84, 0.86, 0.88, 0.90]
    mapped = narrow(batch(raw)[0], **batch(raw)[1])
    assert max(mapped) - min(mapped) > 4 * (max(raw) - min(raw))  # 0.38 vs 0.08


def groups_of(values: list, size: int) -> RolloutBatch:
    n = len(values)
    return RolloutBatch(samples=[None] * n, prompt_index=[i // size for i in range(n)],
                        group_index=torch.arange(n) // size,
                        seqs=[TokenSeq(ids=[1, 2], mm_types=[0, 0], loss_mask=[0, 1]) for _ in range(n)],
                        completions=[""] * n, turns=[[""]] * n, env_info=[{}] * n,
                        finished=torch.ones(n, dtype=torch.bool), loss_mask=torch.ones(n, 2))


def test_group_spread_by_hand() -> None:
    b = groups_of([0.2, 0.4, None, 0.0, 0.0, 0.0, 0.5, 0.5, 0.9], 3)
    # group 0: std(0.2, 0.4) = 0.1 (None left out); group 1 all 0: left out; group 2: std(0.5, 0.5, 0.9)
    g2 = math.sqrt(((0.5 - 19 / 30) ** 2 * 2 + (0.9 - 19 / 30) ** 2) / 3)
    assert b.group_spread([0.2, 0.4, None, 0.0, 0.0, 0.0, 0.5, 0.5, 0.9]) == pytest.approx((0.1 + g2) / 2)
    assert b.group_spread([0.0] * 6 + [None] * 3) is None


def test_remap_logs_the_paired_raw_and_remapped_spread() -> None:
    raw = [0.80, 0.84, 0.86, 0.90, 0.82, 0.88]   # two groups of three in a narrow band around the median 0.85
    armed = M.AdaptiveRemap(reward="t_raw_score", slope=10)
    logged: dict[str, float] = {}
    c, k = batch(raw)
    out = armed(c, **k, log_metric=logged.__setitem__, rollout_batch=groups_of(raw, 3))
    spread = lambda xs: (sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / len(xs)) ** 0.5
    assert logged["t_raw_score_armed_raw_spread"] == pytest.approx((spread(raw[:3]) + spread(raw[3:])) / 2)
    assert logged["t_raw_score_armed_remapped_spread"] == pytest.approx((spread(out[:3]) + spread(out[3:])) / 2)
    # the sigmoid's slope at the threshold is 10/4 = 2.5: near it the spread grows about that much
    assert 2.0 < logged["t_raw_score_armed_remapped_spread"] / logged["t_raw_score_armed_raw_spread"] < 2.5
    # far from the threshold the remap squeezes the spread instead (the measure does not assume a direction)
    far = M.AdaptiveRemap(reward="t_raw_score", slope=10, buffer_size=64)
    c, k = batch([0.1] * 60)
    far(c, **k)                                                   # history: τ = 0.1
    logged.clear()
    c, k = batch([0.7, 0.8, 0.9])
    far(c, **k, log_metric=logged.__setitem__, rollout_batch=groups_of([0.7, 0.8, 0.9], 3))
    assert logged["t_raw_score_armed_remapped_spread"] < logged["t_raw_score_armed_raw_spread"]


def test_remap_through_the_combiner_keeps_state_by_label() -> None:
    spec = [{"name": "armed", "label": "sem", "init": {"reward": "t_raw_score", "slope": 10}}]
    first = CombinedReward(spec)
    first.compute(*batch([0.1, 0.4]))
    second = CombinedReward(spec)
    assert second.load_state_dict(first.state_dict()) == ["sem"]
    assert second.compute(*batch([0.3])).components["sem"] == [pytest.approx(sig(10 * (0.3 - 0.3)))]
    with pytest.raises(RewardError, match="configure it with init"):
        CombinedReward(["armed"]).compute(*batch([0.1]))
    with pytest.raises(ConfigError, match="unknown init setting"):
        CombinedReward([{"name": "armed", "init": {"reward": "t_raw_score", "slop": 3}}])
