"""ARES (rewards/ares.py, mmrl/methods/ares.py) against hand-computed values: difficulty buckets, each bucket's shaping value in the
released code's Huber/sigmoid form and in the paper's closed form, the per-bucket KL controller, the plug-in on
a hand-made rollout batch (HWE counts, buckets, shaping in the rewards, per-sequence and per-token KL weights
reaching the KL term of the loss), setting errors, and a tiny training run (weights in the logged loss, the
plug-in's state in the checkpoint)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from mmrl.config import RunConfig
from mmrl.engine.batch import RolloutBatch, update_plan
from mmrl.engine.rollout import Episode
from mmrl.grpo import GRPOConfig, compute_policy_loss
from mmrl.methods.ares import AresPlugin
from mmrl.model import TokenSeq
from mmrl_common.errors import ConfigError
from rewards.ares import (
    BucketKLController,
    bucket_of,
    code_shaping,
    huber,
    paper_lambda,
    paper_shaping,
    paper_target,
)


def sig(x, temp):
    return 1 / (1 + math.exp(-x / temp))


# ------------------------------------------------------------------------------------------ buckets
def test_buckets_from_group_accuracy():
    assert [bucket_of(a) for a in (1.0, 6 / 8, 2 / 3, 5 / 8, 3 / 8, 1 / 3, 2 / 8, 0.0)] == \
        ["easy", "easy", "easy", "medium", "medium", "medium", "hard", "hard"]


# ------------------------------------------------------------------------------------------ code form
def test_huber():
    assert huber(1.0, 2.0) == 0.25 and huber(3.0, 2.0) == 2.0 and huber(0.0, 4.0) == 0.0


def test_code_shaping_each_bucket_by_hand():
    a = 0.5
    # easy: target 4 -> margin max(1, 0.15*4) = 1, kappa 2, T 2, cap 0.5
    assert code_shaping("easy", True, 8, 4, a) == pytest.approx(-0.5 * (3 - 1) / 3)  # x = 3 > kappa: 3 - 1
    assert code_shaping("easy", True, 6, 4, a) == pytest.approx(-0.5 * (1 / 4) / 3)  # x = 1: 1/(2*2)
    assert code_shaping("easy", True, 4, 4, a) == 0.0
    assert code_shaping("easy", True, 0, 4, a) == 0.0  # below the target: no penalty on easy
    assert code_shaping("easy", False, 8, 4, a) == pytest.approx(sig(3, 2) * 0.5 * 0.6)
    assert code_shaping("easy", False, 2, 4, a) == pytest.approx(0.15)  # sigmoid(0) = 0.5
    # medium: target 10 -> margin 2.5, kappa 3, T 2.5, cap 0.5; symmetric penalty for correct answers
    assert code_shaping("medium", True, 4, 10, a) == pytest.approx(-0.5 * (3.5 - 1.5) / 5.5)
    assert code_shaping("medium", True, 16, 10, a) == pytest.approx(-0.5 * (3.5 - 1.5) / 5.5)
    assert code_shaping("medium", True, 11, 10, a) == 0.0  # inside the margin
    assert code_shaping("medium", False, 16, 10, a) == pytest.approx(sig(3.5, 2.5) * 0.5 * 0.8)
    # hard: target 10 -> margin 3.5, kappa 4, T 3, cap 0.5 * 1.2 = 0.6
    assert code_shaping("hard", True, 12, 10, a) == pytest.approx(sig(5.5, 3) * 0.6)
    assert code_shaping("hard", True, 2, 10, a) == pytest.approx(-0.5 * 0.6 * (4.5 - 2) / 7.5)  # far below
    assert code_shaping("hard", False, 15, 10, a) == pytest.approx(sig(1.5, 3) * 0.6)
    assert code_shaping("hard", False, 0, 10, a) == pytest.approx(0.3)
    # the cap: a huge excess on easy costs at most alpha * s
    assert code_shaping("easy", True, 1000, 4, a) == pytest.approx(-0.5)


# ------------------------------------------------------------------------------------------ paper form
def test_paper_shaping_each_bucket_by_hand():
    counts = [2, 4, 6, 8]  # mean 5, population variance 5
    # easy: target 2 + 0.35 * 6 = 4.1, lambda = (5 - 4.1) / 5 = 0.18; penalty on incorrect answers above it
    assert paper_target(counts, "easy") == pytest.approx(4.1)
    lam = paper_lambda(counts, 4.1, "easy")
    assert lam == pytest.approx(0.18, rel=1e-5)
    assert paper_shaping("easy", False, 8, 4.1, lam) == pytest.approx(-0.18 * 3.9, rel=1e-5)
    assert paper_shaping("easy", False, 2, 4.1, lam) == 0.0
    assert paper_shaping("easy", True, 8, 4.1, lam) == 0.0  # correct answers are never shaped
    # hard: target 2 + 0.65 * 6 = 5.9 above the mean: lambda = (5.9 - 5) / 5; penalty on incorrect answers below
    assert paper_target(counts, "hard") == pytest.approx(5.9)
    lam = paper_lambda(counts, 5.9, "hard")
    assert lam == pytest.approx(0.18, rel=1e-5)
    assert paper_shaping("hard", False, 2, 5.9, lam) == pytest.approx(-0.18 * 3.9, rel=1e-5)
    assert paper_shaping("hard", False, 8, 5.9, lam) == 0.0
    # medium [2, 2, 8]: target 2 + 0.5 * 6 = 5, mean 4, variance 8 -> lambda 1/8; |Delta| both ways
    lam = paper_lambda([2, 2, 8], paper_target([2, 2, 8], "medium"), "medium")
    assert lam == pytest.approx(0.125, rel=1e-5)
    assert paper_shaping("medium", False, 8, 5, lam) == pytest.approx(-0.375, rel=1e-5)
    assert paper_shaping("medium", False, 2, 5, lam) == pytest.approx(-0.375, rel=1e-5)
    # a bucket on the side the shaping wants (easy mean below its target): lambda 0; the cap
    assert paper_lambda([2, 4, 6, 8], 6.0, "easy") == 0.0
    assert paper_shaping("easy", False, 8, 4.1, 1.0, cap=1.0) == -1.0


# ------------------------------------------------------------------------------------------ KL controller
def test_kl_controller_update_by_hand():
    """The released code's cadence: KL EMA every call, beta only every `every`-th call, nothing in the dead zone."""
    c = BucketKLController({"easy": 0.01, "medium": 0.01, "hard": 0.01}, ema=0.5, err_ema=0.5, deadzone=0.02,
                           step=0.05, err_clip=0.2, every=2)
    c.update({"easy": 0.02})  # call 1: KL_ema 0.02, e = 1, but not an update call
    assert c.kl_ema["easy"] == pytest.approx(0.02) and c.beta["easy"] == 1.0 and c.err_ema["easy"] == 0.0
    c.update({"easy": 0.02})  # call 2: e_ema = 0.5 * 0 + 0.5 * 1 = 0.5 -> clipped 0.2: log beta += 0.01
    assert c.err_ema["easy"] == pytest.approx(0.5) and c.beta["easy"] == pytest.approx(math.exp(0.01))
    c.update({"easy": 0.0})  # call 3: KL_ema 0.01 (e = 0, dead zone) and not an update call anyway
    c.update({"easy": 0.0})  # call 4: KL_ema 0.005, e = -0.5; e_ema = 0.25 - 0.25 = 0: unchanged
    assert c.err_ema["easy"] == pytest.approx(0.0) and c.beta["easy"] == pytest.approx(math.exp(0.01))
    assert c.beta["medium"] == 1.0 and c.beta["hard"] == 1.0  # buckets with no sequences do not move
    assert c.calls == 4
    # the dead zone: |e| < 0.02 makes no update at all (the error EMA keeps its value), even on an update call
    d = BucketKLController({"easy": 0.01, "medium": 0.01, "hard": 0.01}, ema=0.0, err_ema=0.5, every=1)
    d.update({"hard": 0.03})  # e = 2: e_ema 1 -> clipped 0.2
    assert d.err_ema["hard"] == pytest.approx(1.0) and d.beta["hard"] == pytest.approx(math.exp(0.01))
    d.update({"hard": 0.0101})  # e = 0.01, inside: e_ema stays 1 (not pulled toward 0), beta unchanged
    assert d.err_ema["hard"] == pytest.approx(1.0) and d.beta["hard"] == pytest.approx(math.exp(0.01))
    # the code's defaults: EMA 0.97 for both, beta moves on call 100 only
    e = BucketKLController({"easy": 0.01, "medium": 0.01, "hard": 0.01})
    for _ in range(99):
        e.update({"easy": 1.0})
    assert e.beta["easy"] == 1.0 and e.err_ema["easy"] == 0.0
    e.update({"easy": 1.0})  # e = 99, e_ema = 0.03 * 99 = 2.97 -> 0.2
    assert e.err_ema["easy"] == pytest.approx(0.03 * 99) and e.beta["easy"] == pytest.approx(math.exp(0.01))
    # bounds
    f = BucketKLController({"easy": 1.0, "medium": 1.0, "hard": 1.0}, step=10.0, err_clip=1.0, err_ema=0.0,
                           every=1, beta_max=2.0)
    f.update({"easy": 5.0})
    assert f.beta["easy"] == 2.0
    again = BucketKLController({"easy": 1.0, "medium": 1.0, "hard": 1.0})
    again.load_state_dict(f.state_dict())
    assert again.state_dict() == f.state_dict()


def test_plugin_feeds_the_controller_once_per_kl_call_rows():
    batch = make_batch()
    mask = batch.loss_mask
    for size, calls in ((2, 3), (6, 1), (4, 2)):
        plug = make_plugin(window=2, quantile=1.0, kl_update_every=3, kl_call_rows=size)
        b = make_batch()
        plug.after_rewards(b)
        plug.after_advantages(b)
        b.rollout_logprobs = torch.zeros_like(mask)
        b.ref_logprobs = -torch.ones_like(mask) * mask
        plug.after_update(b, {})
        assert plug.controller.calls == calls
        # only a third call moves beta, and only for the buckets in that call's rows (rows 4-5: hard)
        assert (plug.controller.beta["hard"] != 1.0) == (calls == 3) and plug.controller.beta["easy"] == 1.0
    plug = make_plugin(kl_update_every=1)
    plug.ctx.cfg.train.micro_batch_size = 2
    plug.ctx.cfg.grpo.ppo_mini_batch_size = 3
    plug.ctx.cfg.grpo.ppo_epochs = 2
    # per optimizer step (2 epochs x mini-batches of 3 rows), its micro-batches of 2 rows
    assert plug.ctx.update_plan(make_batch()) == [[[0, 1], [2]], [[3, 4], [5]]] * 2
    # train.micro_batch_tokens too (the rule ARES used to re-derive ignored it): a budget of one group's tokens
    b = make_batch()
    plug.ctx.cfg.train.micro_batch_tokens = max(sum(len(b.seqs[i]) for i in rows) for rows in ([0, 1, 2], [3, 4, 5]))
    assert plug.ctx.update_plan(b) == [[[0, 1, 2]], [[3, 4, 5]]] * 2


# ------------------------------------------------------------------------------------------ the plug-in
def make_batch() -> RolloutBatch:
    """Two groups of three: token entropies per completion (prompt of 2 tokens), accuracy per rollout."""
    ents = [[1, 1, 1, 1], [3, 3, 3, 3], [1, 3, 1],  # group 0: accuracy 1, 1, 0 -> easy
            [2, 2], [0, 0, 0, 0, 0, 0], [4, 4, 0, 0]]  # group 1: 0, 0, 0 -> hard
    prompt = TokenSeq(ids=[1, 2], mm_types=[0, 0])
    eps = []
    for e in ents:
        seq = prompt.extend([5] * len(e), trained=True)
        eps.append(Episode(sample=SimpleNamespace(id="s"), prompt=prompt, seq=seq, turns=["x"],
                           logprobs=[0.0] * len(e), entropies=[float(v) for v in e], finished=True))
    batch = RolloutBatch.from_episodes(eps, [0, 1], 3)
    acc = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    batch.reward_components = {"accuracy": acc}
    batch.rewards = acc.clone()
    return batch


def make_plugin(**settings) -> AresPlugin:
    cfg = RunConfig()
    cfg.rollout.record_entropies = True
    cfg.rollout.record_logprobs = True
    cfg.grpo = GRPOConfig(kl_coef=0.01)
    # the StepContext's part a plug-in reads: the config and the trainer's own update plan
    return AresPlugin(SimpleNamespace(cfg=cfg, policy=None, update_plan=lambda batch: update_plan(batch, cfg)),
                      **settings)


def test_plugin_counts_buckets_and_shapes_the_rewards():
    plug = make_plugin(window=2, quantile=1.0, shaping="code")
    batch = make_batch()
    plug.after_rewards(batch)
    # per-rollout max window entropy: 1, 3, 2, 2, 0, 4 -> tau = 2; windows above 2: rollout 1 all three
    # (covering its 4 tokens), rollout 5 its first (tokens 0-1)
    assert batch.extra["ares_hwe"].tolist() == [0, 3, 0, 0, 0, 1]
    assert batch.extra["ares_bucket"] == ["easy"] * 3 + ["hard"] * 3
    assert batch.extra["ares_hwe_cols"] == [[], [2, 3, 4, 5], [], [], [], [2, 3]]
    # easy: target round(1) = 1, margin 1; hard: target round(1/3) = 0, margin 1, cap 0.6
    want = [0.0, -0.5 * 0.25 / 3, 0.5 * 0.5 * 0.6, 0.3, 0.3, 0.3]
    torch.testing.assert_close(batch.reward_components["ares_shaping"], torch.tensor(want))
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 1.0, 0.0, 0, 0, 0]) + torch.tensor(want))
    assert plug.alpha["easy"] == pytest.approx(0.5)  # mean 1 - target 1
    assert plug.alpha["hard"] == pytest.approx(0.5 + 0.05 * (0 - 1 / 3))
    stats = {}
    plug.on_step_end(1, stats)
    assert stats["ares/tau"] == 2.0
    assert stats["ares/length/easy"] == pytest.approx(11 / 3) and stats["ares/length/hard"] == 4.0
    assert stats["ares/entropy/easy"] == pytest.approx((1 + 3 + 5 / 3) / 3)
    assert stats["ares/hwe/hard"] == pytest.approx(1 / 3)
    assert stats["ares/share/easy"] == 0.5 and stats["ares/share/medium"] == 0.0
    assert stats["ares/length_recent/easy"] == pytest.approx(11 / 3) and "ares/length_recent/medium" not in stats
    plug.after_rewards(make_batch())
    stats = {}
    plug.on_step_end(2, stats)
    assert stats["ares/length_recent/hard"] == pytest.approx(4.0)
    again = make_plugin()  # what --resume restores: alpha, the controller, tau's EMA, the recent lengths
    again.load_state_dict(plug.state_dict())
    assert again.state_dict() == plug.state_dict() and again.alpha["hard"] != 0.5
    # measuring only: nothing added to the rewards
    quiet = make_plugin(window=2, quantile=1.0, shaping="none", dynamic_kl=False, hwe_kl_rho=1.0)
    batch = make_batch()
    quiet.after_rewards(batch)
    assert "ares_shaping" not in batch.reward_components
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 1.0, 0.0, 0, 0, 0]))


def test_plugin_shaping_form_per_bucket():
    """{easy: code, hard: paper}: the easy group gets the code form's values, the hard group the paper form's."""
    plug = make_plugin(window=2, quantile=1.0, shaping={"easy": "code", "medium": "code", "hard": "paper"})
    batch = make_batch()
    plug.after_rewards(batch)
    # hard counts 0, 0, 1: target 0 + 0.65 * (1 - 0) = 0.65; lambda = (0.65 - 1/3) / var, var = 2/9;
    # every hard answer is incorrect: g = max(0, 0.65 - N) -> 0.65, 0.65, 0
    lam = (0.65 - 1 / 3) / (2 / 9 + 1e-6)
    want = [0.0, -0.5 * 0.25 / 3, 0.5 * 0.5 * 0.6, -0.65 * lam, -0.65 * lam, 0.0]
    torch.testing.assert_close(batch.reward_components["ares_shaping"], torch.tensor(want))
    assert plug.alpha["hard"] == 0.5  # the paper form has no cap to adapt
    stats = {}
    plug.on_step_end(1, stats)
    assert "ares/alpha/easy" in stats and "ares/alpha/hard" not in stats
    assert stats["ares/shaping/hard"] == pytest.approx(-2 * 0.65 * lam / 3)
    # a mapping must name every bucket with a known form
    with pytest.raises(ConfigError, match="plugins.ares.shaping.*every bucket"):
        make_plugin(shaping={"easy": "code", "hard": "paper"})
    with pytest.raises(ConfigError, match="plugins.ares.shaping.*every bucket"):
        make_plugin(shaping={"easy": "code", "medium": "code", "hard": "huber"})


def test_plugin_kl_weights_reach_the_kl_term_and_the_controller_moves():
    plug = make_plugin(window=2, quantile=1.0, hwe_kl_rho=0.5, kl_ema=0.5, kl_update_every=1)
    plug.controller.beta.update({"easy": 2.0, "hard": 0.5})
    batch = make_batch()
    plug.after_rewards(batch)
    plug.after_advantages(batch)
    torch.testing.assert_close(batch.seq_kl_weights, torch.tensor([2.0, 2, 2, 0.5, 0.5, 0.5]))
    w = batch.kl_weights()
    assert w[1, 2:6].tolist() == [1.0] * 4  # beta 2 x rho 0.5 inside the high-entropy windows
    assert w[5, 2:6].tolist() == [0.25, 0.25, 0.5, 0.5]
    assert w[0, 2:6].tolist() == [2.0] * 4
    # the loss: k3 with logp - ref = 1 on every token is e^-1 - ... = exp(-1); token mean of w * k3
    mask = batch.loss_mask
    logp = torch.zeros_like(mask)
    ref = logp - 1.0
    _, st = compute_policy_loss(logp, None, torch.zeros(6), mask, GRPOConfig(kl_coef=0.01), ref_logp=ref,
                                kl_weights=w)
    total_w = 8 + 4 + 6 + 1 + 3 + 1.5  # per row: sum of its weights over its tokens
    assert float(st["kl_loss"]) == pytest.approx(math.exp(-1) * total_w / 23)
    assert float(st["kl_weight_mean"]) == pytest.approx(total_w / 23)
    # after the update: every row's KL is exp(-1) -> far above the 0.01 target: log beta += 0.05 * 0.2
    batch.rollout_logprobs = logp * mask
    batch.ref_logprobs = ref * mask
    plug.after_update(batch, {})
    assert plug.controller.kl_ema["easy"] == pytest.approx(math.exp(-1), rel=1e-5)
    assert plug.controller.beta["easy"] == pytest.approx(2.0 * math.exp(0.01))
    assert plug.controller.beta["hard"] == pytest.approx(0.5 * math.exp(0.01))
    assert plug.controller.beta["medium"] == 1.0


def test_plugin_setting_errors():
    with pytest.raises(ConfigError, match=r"plugins\.ares\.windw: unknown setting; .*'window'"):
        make_plugin(windw=4)
    with pytest.raises(ConfigError, match="plugins.ares.shaping"):
        make_plugin(shaping="huber")
    with pytest.raises(ConfigError, match="hwe_kl_rho"):
        make_plugin(hwe_kl_rho=0.0)
    with pytest.raises(ConfigError, match="kl_target"):
        make_plugin(kl_target={"easy": 0.0})
    with pytest.raises(ConfigError, match="code_constants"):
        make_plugin(code_constants={"easy": {"margin": 1}})
    cfg = RunConfig()
    with pytest.raises(ConfigError, match="record_entropies"):
        AresPlugin(SimpleNamespace(cfg=cfg, policy=None))
    cfg.rollout.record_entropies = True
    with pytest.raises(ConfigError, match="kl_coef"):
        AresPlugin(SimpleNamespace(cfg=cfg, policy=None))
    AresPlugin(SimpleNamespace(cfg=cfg, policy=None), dynamic_kl=False, hwe_kl_rho=1.0)  # measuring: fine


# ------------------------------------------------------------------------------------------ a tiny run
@pytest.mark.slow
def test_tiny_run_logs_buckets_and_trains_with_the_weights(tmp_path, module_cache):  # noqa: F811
    from mmrl.engine.checkpoint import latest_checkpoint, load_trainer_state

    # the paper's recipe (ares-paper): both KL parts and branching on (2 roots + 2 branches a group here), 3 rows a
    # controller call
    rows = run_rl(tmp_path, "rollout.max_new_tokens=6", "plugins.ares.branch_roots=2", "plugins.ares.kl_update_every=2",
                  "plugins.ares.kl_call_rows=3", "grpo.dynamic_sampling=false", task="ares-paper")
    for r in rows:
        # the loss's mean per-token KL weight is the one the plug-in set (seq beta x token rho)
        assert r["kl_weight_mean"] == pytest.approx(r["ares/kl_weight_token_mean"], rel=1e-5)
        assert any(k.startswith("ares/length/") for k in r) and any(k.startswith("ares/entropy/") for k in r)
        assert "ares/kl_weight/easy" in r and "reward/ares_shaping" in r
    state = load_trainer_state(latest_checkpoint(tmp_path / "run"))["plugins"]["ares"]
    assert state["controller"]["calls"] == 2 * 3 and set(state["alpha"]) == {"easy", "medium", "hard"}  # 8 rows / 3
    assert all("ares/branches" in r and r["ares/branches"] + r["ares/branch_fill"] == 2 for r in rows)
    assert state["tau_prev"] is not None
