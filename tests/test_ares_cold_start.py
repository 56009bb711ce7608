"""AdaCS: the cold start's trace length follows the question's pass rate."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from mmrl.engine.sft import reasoning_target
from mmrl.methods.ares.cold_start import adaptive_target, pick_by_length, record_pass_rate
from mmrl_common.errors import MmrlError
from rewards.ares import adacs_target_length


class WordTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def count_sample(pass_rate=None):
    meta = {"source": "toy", "task": "count", "count": 6}
    if pass_rate is not None:
        meta["pass_rate"] = pass_rate
    return SimpleNamespace(id="q", meta=meta, answer="6", problem_type="multiple_choice", answer_text=lambda: "6")


def test_target_length_interpolates_between_hard_and_easy():
    assert adacs_target_length(0.0, 40, 10) == 40
    assert adacs_target_length(1.0, 40, 10) == 10
    assert adacs_target_length(0.25, 40, 10) == pytest.approx(32.5)
    assert adacs_target_length(3.0, 40, 10) == 10  # clipped to [0, 1]


def test_pick_by_length_by_hand():
    cands, lengths = ["a", "bb", "ccc", "dddd"], [1, 2, 3, 4]
    assert pick_by_length(cands, lengths, 0.0) == "dddd"  # never solved: the longest trace
    assert pick_by_length(cands, lengths, 1.0) == "a"  # always solved: the shortest
    assert pick_by_length(cands, lengths, 0.5) == "bb"  # target 2.5: a tie of 2 and 3, the first drawn wins
    assert pick_by_length(cands, lengths, 0.3) == "ccc"  # target 3.1


def test_adaptive_traces_are_longer_for_harder_questions():
    tok = WordTokenizer()
    draws = [reasoning_target(count_sample(), random.Random(3), "option") for _ in range(1)]
    rng = random.Random(3)
    cands = [reasoning_target(count_sample(), rng, "option") for _ in range(16)]
    lengths = [len(c.split()) for c in cands]
    assert len(set(lengths)) > 2 and draws[0] == cands[0]  # the toy traces vary in length
    hard = adaptive_target(count_sample(), 0.0, random.Random(3), tok, 16, "option")
    easy = adaptive_target(count_sample(), 1.0, random.Random(3), tok, 16, "option")
    mid = adaptive_target(count_sample(), 0.5, random.Random(3), tok, 16, "option")
    assert len(hard.split()) == max(lengths) and len(easy.split()) == min(lengths)
    assert min(lengths) <= len(mid.split()) <= max(lengths)
    assert abs(len(mid.split()) - (max(lengths) + min(lengths)) / 2) <= min(
        abs(n - (max(lengths) + min(lengths)) / 2) for n in lengths)
    assert hard.endswith("<answer>6</answer>") and easy.endswith("<answer>6</answer>")


def test_pass_rate_from_the_record():
    assert record_pass_rate(count_sample(0.25)) == 0.25
    assert record_pass_rate(count_sample()) is None
    with pytest.raises(MmrlError, match="meta.pass_rate"):
        record_pass_rate(count_sample(1.5))


@pytest.mark.slow
def test_cold_start_estimates_missing_pass_rates_once(tmp_path, monkeypatch):
    from tiny_runs import run_rl

    import mmrl.methods.ares.cold_start as cs

    seen: list[tuple[str, float]] = []
    real = cs.estimate_pass_rate

    def spy(cfg, policy, sample, prompt, n):
        p = real(cfg, policy, sample, prompt, n)
        seen.append((sample.id, p))
        assert n == 8  # AdaCS's 8 samples per question
        return p

    monkeypatch.setattr(cs, "estimate_pass_rate", spy)
    run_rl(tmp_path, "sft.steps=3", "sft.batch_size=4", "sft.target=adaptive_reasoning",
           "plugins.ares.adacs_candidates=4", "plugins.ares.branching=false", "grpo.dynamic_sampling=false",
           task="ares")
    ids = [i for i, _ in seen]
    assert len(ids) == len(set(ids)) == 4  # the 4 training questions, each estimated once over 3 x 4 draws
    assert all(0.0 <= p <= 1.0 for _, p in seen)
