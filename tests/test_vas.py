"""Variance-aware sampling (data_pipelines/vas.py, data_pipelines/diversity.py).

* every score by hand on small groups: pass rate, OVS, the three diversity measures (all-correct,
  all-wrong and identical completions), VPS, the weights (proportional to VPS by default, min-max with floor, the released code's variant);
* the mix: exactly floor(lambda B) VPS-weighted draws per batch over many batches, weighted draws
  proportional to the VPS (empirically, over many seeded draws);
* state round-trip as plain data, and a real tiny run stopped in the middle of a refresh period and
  resumed: the same prompts drawn at every step as the uninterrupted run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tiny_runs import STOP_AT, TINY_RUN, StopRun, module_cache  # noqa: F401  (module_cache is a fixture)

from data_pipelines.diversity import (
    distinct_n,
    edit_diversity,
    inverse_self_bleu,
    levenshtein,
    self_bleu,
    sentence_bleu,
)
from data_pipelines.samplers import make_sampler
from mmrl.engine.batch import RolloutBatch
from mmrl.methods.vas import VarianceAwareSampler
from mmrl.model import TokenSeq
from mmrl_common.errors import ConfigError

# ----------------------------------------------------------------------------------------------- diversity


def test_sentence_bleu_by_hand() -> None:
    # p1 = 3/4, p2 = 2/3, p3 = 1/2, equal lengths (BP 1): (3/4 * 2/3 * 1/2)^(1/3) = 0.25^(1/3)
    assert sentence_bleu([1, 2, 3, 4], [[1, 2, 3, 5]]) == pytest.approx(0.25 ** (1 / 3))
    # no bigram/trigram match: each order counts 0.1 matches ("method 1"): (1 * 0.1 * 0.1)^(1/3)
    assert sentence_bleu([1, 2], [[2, 1]]) == pytest.approx(0.01 ** (1 / 3))
    # shorter than the closest reference: BP = exp(1 - 2/1); p1 = 1, p2 = p3 = 0.1/1
    assert sentence_bleu([7], [[7, 8]]) == pytest.approx(math.exp(-1) * 0.01 ** (1 / 3))
    # clipped against the most generous reference: hyp 5 5 vs refs (5) and (5 5): p1 = 2/2
    assert sentence_bleu([5, 5], [[5], [5, 5]]) == pytest.approx(0.1 ** (1 / 3))  # p2 = 1/1, p3 = 0.1/1
    assert sentence_bleu([1, 2, 3], [[4, 5, 6]]) == 0.0  # no unigram match at all


def test_diversity_measures_by_hand() -> None:
    identical = [[1, 2, 3, 4]] * 3
    assert self_bleu(identical) == pytest.approx(1.0)
    assert inverse_self_bleu(identical) == pytest.approx(0.0)
    assert edit_diversity(identical) == 0.0
    assert distinct_n(identical) == pytest.approx(1 / 3)  # 2 unique trigrams of 6
    pair = [[1, 2, 3, 4], [1, 2, 3, 5]]  # each 0.25^(1/3) against the other
    assert inverse_self_bleu(pair) == pytest.approx(1 - 0.25 ** (1 / 3))
    assert distinct_n(pair) == pytest.approx(3 / 4)  # (1,2,3) twice, (2,3,4), (2,3,5)
    assert levenshtein([1, 2, 3], [1, 3]) == 1 and levenshtein([], [4, 4]) == 2
    # pairs: (123, 124) 1/3, (123, 123) 0, (124, 123) 1/3 -> 2/9
    assert edit_diversity([[1, 2, 3], [1, 2, 4], [1, 2, 3]]) == pytest.approx(2 / 9)
    assert edit_diversity([[], []]) == 0.0
    for f in (inverse_self_bleu, distinct_n, edit_diversity):  # one completion: nothing to compare
        assert f([[1, 2, 3]]) == 0.0


# ----------------------------------------------------------------------------------------------- scores


def group_batch(groups: list[tuple[int, list[float], list[list[int]]]]) -> RolloutBatch:
    """A scored batch: per group (prompt index, accuracy per rollout, completion tokens per rollout)."""
    seqs, acc, prompt_index, group_index = [], [], [], []
    for g, (index, marks, comps) in enumerate(groups):
        for mark, comp in zip(marks, comps):
            prompt = [100, 101]  # prompt tokens are not the completion's
            seqs.append(TokenSeq(ids=prompt + comp, mm_types=[0] * (2 + len(comp)),
                                 loss_mask=[0, 0] + [1] * len(comp)))
            acc.append(mark)
            prompt_index.append(index)
            group_index.append(g)
    n, width = len(seqs), max(len(s) for s in seqs)
    mask = torch.zeros(n, width)
    for i, s in enumerate(seqs):
        mask[i, :len(s)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    batch = RolloutBatch(samples=[None] * n, prompt_index=prompt_index, group_index=torch.tensor(group_index),
                         seqs=seqs, completions=[""] * n, turns=[[""]] * n, env_info=[{}] * n,
                         finished=torch.ones(n, dtype=torch.bool), loss_mask=mask)
    batch.reward_components = {"accuracy": torch.tensor(acc), "format": torch.ones(n)}
    batch.rewards = batch.reward_components["accuracy"]
    return batch


def test_scores_by_hand_on_small_groups() -> None:
    s = make_sampler("vas", list(range(4)), seed=0)
    assert (s.alpha, s.beta, s.mix) == (0.8, 0.2, 0.5)  # the paper's defaults
    same = [[1, 2, 3, 4]] * 4
    batch = group_batch([
        (0, [1, 1, 1, 1], same),                                          # all correct, identical
        (1, [0, 0, 0, 0], same),                                          # all wrong, identical
        (2, [1, 0, 1, 0], same),                                          # half right, identical
        (3, [1, 0, 0, 0], [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [1, 2, 3, 5]]),
    ])
    assert s.score_batch(batch, step=7) == 4
    assert s.pass_rate == [1.0, 0.0, 0.5, 0.25]
    assert s.tds[:3] == pytest.approx([0.0, 0.0, 0.0])
    # prompt 3: each completion against the other three: the identical one is among them, so every n-gram
    # matches in full: self-BLEU 1, TDS 0 -- diversity of a pair [a, b] alone is 1 - 0.25^(1/3)
    assert s.tds[3] == pytest.approx(0.0)
    assert s.scored_at == [7, 7, 7, 7]
    assert [s.vps(i) for i in range(4)] == pytest.approx([0.0, 0.0, 0.8 * 0.25, 0.8 * 0.25 * 0.75])
    s2 = make_sampler("vas", list(range(1)), seed=0)
    s2.score_batch(group_batch([(0, [1, 0], [[1, 2, 3, 4], [1, 2, 3, 5]])]), step=0)
    assert s2.vps(0) == pytest.approx(0.8 * 0.25 + 0.2 * (1 - 0.25 ** (1 / 3)))
    # a pass needs the full accuracy (pass_threshold 1.0)
    s3 = make_sampler("vas", list(range(1)), seed=0)
    s3.score_batch(group_batch([(0, [1.0, 0.9, 0.5, 0.0], same)]), step=0)
    assert s3.pass_rate == [0.25]


def test_released_code_scores_padded_similarity() -> None:
    """The released code: self-BLEU (a similarity) on completions padded with the pad id; ours: 1 - self-BLEU
    on the completions as produced."""
    ours = VarianceAwareSampler(list(range(1)))
    released = VarianceAwareSampler(list(range(1)), released_code=True)
    comps = [[7], [7, 8]]
    # unpadded: BLEU(7 | 7 8) = e^-1 0.01^(1/3), BLEU(7 8 | 7) = (1/2 0.1 0.1)^(1/3)
    sim = (math.exp(-1) * 0.01 ** (1 / 3) + 0.005 ** (1 / 3)) / 2
    assert ours.score_group([1, 0], comps) == pytest.approx((0.5, 1 - sim))
    # padded to 4 with 0: 7 0 0 0 vs 7 8 0 0 both ways p1 = 3/4, p2 = 1/3, p3 = 0.1/2
    assert released.score_group([1, 0], comps, pad_id=0, pad_to=4) == pytest.approx(
        (0.5, (0.75 / 3 * 0.05) ** (1 / 3)))
    # identical completions: most similar, so the released code favours them
    assert released.score_group([1, 1], [[5, 6, 7]] * 2, pad_id=0, pad_to=4)[1] == pytest.approx(1.0)


def test_weights_proportional_to_vps_by_default_min_max_floor_and_released() -> None:
    scores = [(0.0, 0.0), (0.5, 0.0), (0.5, 1.0), (1.0, 0.5)]
    # VPS = 0.8 P(1 - P) + 0.2 TDS = 0, 0.2, 0.4, 0.1 (sum 0.7)
    d = make_sampler("vas", list(range(4)), seed=0)
    for i, (p, tds) in enumerate(scores):
        d.set_scores(i, p, tds, step=0)
    assert d.weighting == "proportional"
    assert d.probabilities().tolist() == pytest.approx([0.0, 0.2 / 0.7, 0.4 / 0.7, 0.1 / 0.7])
    s = make_sampler("vas", list(range(4)), seed=0, floor=0.1, weighting="minmax")
    for i, (p, tds) in enumerate(scores):
        s.set_scores(i, p, tds, step=0)
    # min-max 0, 0.5, 1, 0.25 -> 0.1 + 0.9 w = 0.1, 0.55, 1, 0.325
    w = [0.1, 0.55, 1.0, 0.325]
    assert s.probabilities().tolist() == pytest.approx([x / sum(w) for x in w])
    r = make_sampler("vas", list(range(4)), seed=0, released_code=True)
    for i, (p, tds) in enumerate(scores):
        r.set_scores(i, p, tds, step=0)
    assert r.weighting == "minmax"
    assert r.probabilities().tolist() == pytest.approx([0, 0.5 / 1.75, 1 / 1.75, 0.25 / 1.75])
    e = make_sampler("vas", list(range(3)), seed=0)  # never scored: uniform
    assert e.probabilities().tolist() == pytest.approx([1 / 3] * 3)
    e.set_scores(0, 0.5, 0.0, step=0)  # the unscored count as the mean of the scored: all equal
    assert e.probabilities().tolist() == pytest.approx([1 / 3] * 3)
    z = make_sampler("vas", list(range(3)), seed=0)  # every VPS 0 (all pass, alike): uniform, not undefined
    for i in range(3):
        z.set_scores(i, 1.0, 0.0, step=0)
    assert z.probabilities().tolist() == pytest.approx([1 / 3] * 3)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="did you mean 'alpha'"):
        make_sampler("vas", [0], alpah=0.5)
    with pytest.raises(ConfigError, match="weighting='softmax'.*proportional, minmax"):
        make_sampler("vas", [0], weighting="softmax")
    with pytest.raises(ConfigError, match="mix=1.5"):
        make_sampler("vas", [0], mix=1.5)
    with pytest.raises(ConfigError, match="diversity='bleu'.*self_bleu, distinct, edit"):
        make_sampler("vas", [0], diversity="bleu")
    with pytest.raises(ConfigError, match="update_every=0"):
        make_sampler("vas", [0], update_every=0)
    s = make_sampler("vas", [0], reward="correct")
    with pytest.raises(ConfigError, match="reward='correct'.*accuracy, format"):
        s.score_batch(group_batch([(0, [1, 0], [[1], [2]])]), step=0)


# ----------------------------------------------------------------------------------------------- drawing


@pytest.mark.parametrize(("mix", "batch"), [(0.5, 8), (0.3, 10), (0.5, 7), (0.8, 5)])
def test_mix_of_weighted_and_uniform_draws(mix: float, batch: int) -> None:
    """Only prompt 0 has weight (the others have VPS 0): every weighted draw is 0, the uniform part (passes over the 10
    prompts) hits it once per pass. Over K batches: exactly K floor(mix B) + (uniform draws) / 10."""
    s = make_sampler("vas", list(range(10)), seed=3, mix=mix, floor=0.0)
    s.set_scores(0, 0.5, 0.0, step=0)
    for i in range(1, 10):
        s.set_scores(i, 0.0, 0.0, step=0)
    k, n_w = 1000, math.floor(mix * batch)
    draws = [s.draw(batch) for _ in range(k)]
    assert all(d[:n_w] == [0] * n_w for d in draws)
    uniform = [i for d in draws for i in d[n_w:]]
    assert len(uniform) == k * (batch - n_w) and len(uniform) % 10 == 0
    assert sum(i == 0 for d in draws for i in d) == k * n_w + len(uniform) // 10
    assert sorted(set(uniform)) == list(range(10))


def test_weighted_draws_are_proportional_to_vps() -> None:
    """The paper's Algorithm 1: with mix 1 every draw is VPS-weighted; over many draws (fixed seed) each
    prompt's share is its VPS / sum VPS. n = 20000 draws: a share's standard error is at most
    sqrt(0.25 / n) = 0.0035, so 0.015 (over 4 standard errors) fails a wrong rule, not a fair draw."""
    s = make_sampler("vas", list(range(4)), seed=1, mix=1.0)
    for i, p in enumerate([0.0, 0.5, 0.25, 0.1]):
        s.set_scores(i, p, 0.0, step=0)
    vps = [0.8 * p * (1 - p) for p in [0.0, 0.5, 0.25, 0.1]]  # 0, 0.2, 0.15, 0.072
    expected = [v / sum(vps) for v in vps]
    n = 20000
    counts = torch.bincount(torch.tensor([i for _ in range(n // 10) for i in s.draw(10)]), minlength=4)
    shares = (counts / counts.sum()).tolist()
    assert shares == pytest.approx(expected, abs=0.015)
    assert counts[0] == 0  # VPS 0: never a weighted draw
    m = make_sampler("vas", list(range(4)), seed=1, mix=1.0, floor=0.2, weighting="minmax")
    for i, p in enumerate([0.0, 0.5, 0.25, 0.1]):
        m.set_scores(i, p, 0.0, step=0)
    counts = torch.bincount(torch.tensor([i for _ in range(n // 10) for i in m.draw(10)]), minlength=4)
    assert (counts / counts.sum()).tolist() == pytest.approx(m.probabilities().tolist(), abs=0.015)
    assert (counts / counts.sum()).tolist() != pytest.approx(expected, abs=0.015)  # the switch changes the draw


def test_state_round_trip_is_plain_and_exact() -> None:
    a = make_sampler("vas", list(range(9)), seed=5)
    for i in range(9):
        a.set_scores(i, (i % 3) / 2, i / 9, step=i)
    a.last_refresh = 4
    [a.draw(4) for _ in range(5)]  # into the second uniform pass
    state = json.loads(json.dumps(a.state_dict()))  # plain data
    b = make_sampler("vas", list(range(9)), seed=5)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert [b.draw(4) for _ in range(6)] == [a.draw(4) for _ in range(6)]
    with pytest.raises(Exception, match="scores 9 prompts but the training pool has 3"):
        make_sampler("vas", list(range(3)), seed=5).load_state_dict(state)


def test_replacement_draws_while_rescoring_leave_the_draws_alone() -> None:
    """The trainer replaces an unreadable sample by ``sampler.draw(1)``; asked during re-scoring, that draw
    comes from a generator of its own, so the training draws are those of a run without it."""
    a, b = (make_sampler("vas", list(range(7)), seed=2) for _ in range(2))
    a.draw(4)
    b.draw(4)
    b._refreshing = True
    spare = [b.draw(1) for _ in range(3)]
    b._refreshing = False
    assert all(len(x) == 1 and 0 <= x[0] < 7 for x in spare) and b.spare_draws == 3
    assert [b.draw(4) for _ in range(5)] == [a.draw(4) for _ in range(5)]


# ----------------------------------------------------------------------------------------------- real runs


VAS_RUN = [*TINY_RUN, "data.toy_size={train: 6, val: 2, test: 2}", "train.steps=6", "train.save_every=1",
           "train.log_rollouts=100", "data.sampler=vas",
           "data.sampler_kwargs={update_every: 4, score_rollouts: 2, chunk_prompts: 4, online: true, stale_after: 2}",
           "plugins={test-stop-at: {}}"]


def drawn(run_dir: Path) -> list[tuple[int, str]]:
    rows = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return [(r["step"], r["id"]) for r in rows if r["stage"] == "rl"]


@pytest.fixture(scope="module")
def vas_runs(module_cache, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    """The same tiny VAS run twice: straight, and stopped after step 3 (checkpoint-2 on disk; the refreshes
    are at steps 0 and 4 of 0..5) and resumed."""
    from mmrl.config import load_run_config, resume_run_config
    from mmrl.run import train

    root = tmp_path_factory.mktemp("vas")
    cfg = load_run_config("video-qa", overrides=VAS_RUN)
    train(cfg, run_dir=root / "straight", show_progress=False)
    STOP_AT[:] = [3]
    try:
        with pytest.raises(StopRun):
            train(load_run_config("video-qa", overrides=VAS_RUN), run_dir=root / "stopped", show_progress=False)
    finally:
        STOP_AT[:] = []
    assert (root / "stopped" / "checkpoint-2").is_dir() and not (root / "stopped" / "checkpoint-3").exists()
    train(resume_run_config(root / "stopped" / "config.yaml"), run_dir=root / "stopped", resume=True,
          show_progress=False)
    return {"straight": root / "straight", "stopped": root / "stopped"}


@pytest.mark.slow
def test_resume_mid_refresh_period_draws_the_same_prompts(vas_runs: dict[str, Path]) -> None:
    from tiny_runs import rl_rows

    a, b = drawn(vas_runs["straight"]), drawn(vas_runs["stopped"])
    assert len(a) == 6 * 2 * 4 and a == b  # 6 steps, 2 prompts of 4 rollouts each
    rows_a, rows_b = rl_rows(vas_runs["straight"]), rl_rows(vas_runs["stopped"])
    # refreshes at steps 0 and 4 (logged as steps 1 and 5); the second re-scores only the stale prompts
    assert [r["vas/refresh_rollouts"] for r in rows_a] == [12, 0, 0, 0, rows_a[4]["vas/refresh_rollouts"], 0]
    assert 0 < rows_a[4]["vas/rescored_prompts"] < 6
    for key in ("vas/vps_drawn", "vas/vps_all", "vas/refresh_rollouts_total", "reward"):
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key
    sa = torch.load(vas_runs["straight"] / "checkpoint-6" / "trainer_state.pt", weights_only=True)["sampler"]
    sb = torch.load(vas_runs["stopped"] / "checkpoint-6" / "trainer_state.pt", weights_only=True)["sampler"]
    for state in (sa, sb):
        state.pop("refresh_s_total")  # wall-clock
    assert sa == sb and sa["last_refresh"] == 4 and sa["draws"] == 6
