"""Policy losses, aggregation, token shaping and compute_policy_loss against hand-computed values."""

import math

import pytest
import torch

from mmrl.grpo import (
    GRPOConfig,
    aggregate,
    build_shaper,
    compute_policy_loss,
    get_aggregation,
    get_policy_loss,
    get_shaper,
    global_counts,
    gspo_loss,
    ppo_clip_loss,
    register_policy_loss,
)
from mmrl.grpo.losses import POLICY_LOSSES, PolicyLossOutput
from mmrl.grpo.shaping import ShapingInput
from mmrl_common.errors import ConfigError

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a.to(D), t(b), atol=tol, rtol=0)


def leaf_logp(old, log_ratios):
    """logp = old + log(ratio) as a leaf that requires grad."""
    return (old + t(log_ratios)).detach().requires_grad_(True)


# ---------------------------------------------------------------- PPO clip-higher

def test_ppo_clip_higher_values_and_gradients():
    # old_logp = -1 everywhere; ratios r and per-token advantages A (clip_low 0.2, clip_high 0.28):
    #  r=1.5 A=+1: -min(1.5, 1.28)   = -1.28  clipped high -> grad 0
    #  r=0.5 A=+1: -min(0.5, 0.8)    = -0.5   inside      -> grad -A*r = -0.5
    #  r=0.5 A=-1: -min(-0.5, -0.8)  =  0.8   clipped low -> grad 0
    #  r=1.5 A=-1: -min(-1.5, -1.28) =  1.5   inside      -> grad -A*r = 1.5
    #  r=1.1 A=+2: -min(2.2, 2.2)    = -2.2   inside      -> grad -2.2
    #  r=100 A=+1: masked out -> loss 0, grad 0, not in the stats
    ratios = [1.5, 0.5, 0.5, 1.5, 1.1, 100.0]
    old = torch.full((1, 6), -1.0, dtype=D)
    logp = leaf_logp(old, [[math.log(r) for r in ratios]])
    adv = t([[1.0, 1.0, -1.0, -1.0, 2.0, 1.0]])
    mask = t([[1, 1, 1, 1, 1, 0]])
    out = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    close(out.loss, [[-1.28, -0.5, 0.8, 1.5, -2.2, 0.0]])
    out.loss.sum().backward()
    close(logp.grad, [[0.0, -0.5, 0.0, 1.5, -2.2, 0.0]])
    # stats: 1 of 5 clipped high, 1 of 5 clipped low; ratio mean (1.5+.5+.5+1.5+1.1)/5 = 1.02, max 1.5
    close(out.stats["clip_frac_high"], 0.2)
    close(out.stats["clip_frac_low"], 0.2)
    close(out.stats["ratio_mean"], 1.02)
    close(out.stats["ratio_max"], 1.5)
    close(out.stats["dual_clip_frac"], 0.0)


def test_ppo_gradient_is_minus_A_ratio_inside_clip_range():
    torch.manual_seed(0)
    old = torch.randn(4, 7, dtype=D)
    log_r = (torch.rand(4, 7, dtype=D) - 0.5) * 0.3  # ratios in [0.86, 1.16] -> inside [0.8, 1.28]
    logp = (old + log_r).requires_grad_(True)
    adv = torch.randn(4, dtype=D)
    out = ppo_clip_loss(logp, old, adv, torch.ones(4, 7, dtype=D), clip_low=0.2, clip_high=0.28)
    out.loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv[:, None] * log_r.exp())
    assert float(out.stats["clip_frac"]) == 0.0


def test_dual_clip_caps_loss_for_negative_advantages():
    # c = 3:
    #  r=4 A=-1: PPO loss -min(-4, -1.28) = 4 -> capped at -c*A = 3, grad 0
    #  r=2 A=-1: 2 < 3, stays 2, grad -A*r = 2
    #  r=4 A=+1: -min(4, 1.28) = -1.28 (dual clip never applies to A > 0), grad 0
    old = torch.zeros(1, 3, dtype=D)
    logp = leaf_logp(old, [[math.log(4.0), math.log(2.0), math.log(4.0)]])
    adv = t([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=D)
    out = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    close(out.loss, [[3.0, 2.0, -1.28]])
    out.loss.sum().backward()
    close(logp.grad, [[0.0, 2.0, 0.0]])
    close(out.stats["dual_clip_frac"], 1 / 3)
    plain = ppo_clip_loss(logp.detach(), old, adv, mask, clip_low=0.2, clip_high=0.28)
    close(plain.loss, [[4.0, 2.0, -1.28]])
    with pytest.raises(ValueError, match="> 1"):
        ppo_clip_loss(logp, old, adv, mask, clip_c=1.0)


# ---------------------------------------------------------------- GSPO

def test_gspo_sequence_level_ratio_and_clip():
    # eps_low = eps_high = 0.2 for readable numbers.
    # seq 0: token log-ratios [0.1, 0.3] -> mean 0.2 -> s = e^0.2 = 1.2214028 > 1.2, A = +1
    #        -> clipped: loss -1.2 on both tokens, gradient 0
    # seq 1: token log-ratios [0.4, -0.4] -> mean 0 -> s = 1, A = -2 -> loss 2 on both tokens,
    #        d loss_t / d logp_t = -A * s = 2 (token 1 alone has ratio e^-0.4 = 0.67 < 0.8, which token-level
    #        PPO would clip with A < 0 -> gradient 0 there)
    old = torch.zeros(2, 2, dtype=D)
    logp = leaf_logp(old, [[0.1, 0.3], [0.4, -0.4]])
    adv = t([1.0, -2.0])
    mask = torch.ones(2, 2, dtype=D)
    out = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    close(out.loss, [[-1.2, -1.2], [2.0, 2.0]])
    out.loss.sum().backward()
    close(logp.grad, [[0.0, 0.0], [2.0, 2.0]])
    close(out.stats["ratio_mean"], (math.exp(0.2) + 1.0) / 2)
    close(out.stats["clip_frac_high"], 0.5)
    lp2 = logp.detach().clone().requires_grad_(True)
    ppo = ppo_clip_loss(lp2, old, adv, mask, clip_low=0.2, clip_high=0.2)
    ppo.loss.sum().backward()
    assert float(lp2.grad[1, 1]) == 0.0


def test_gspo_ratio_couples_tokens_of_a_sequence_only():
    old = torch.zeros(2, 3, dtype=D)
    base = t([[0.01, 0.02, 0.0], [0.0, -0.01, 0.01]])
    adv = t([1.0, 1.0])
    mask = t([[1, 1, 0], [1, 1, 1]])
    a = gspo_loss(old + base, old, adv, mask, clip_low=1.0, clip_high=1.0).loss
    bumped = base.clone()
    bumped[0, 0] += 0.03  # seq 0 mean log-ratio rises by 0.015 -> every token of seq 0 changes equally
    b = gspo_loss(old + bumped, old, adv, mask, clip_low=1.0, clip_high=1.0).loss
    # seq 0 tokens: -exp(0.015) -> -exp(0.03) each; masked token stays 0; seq 1 untouched
    close(a[0], [-math.exp(0.015), -math.exp(0.015), 0.0])
    close(b[0], [-math.exp(0.03), -math.exp(0.03), 0.0])
    torch.testing.assert_close(a[1], b[1])


def test_gspo_token_gradient_equals_sequence_objective_gradient():
    # With seq-mean-token-mean aggregation the GSPO-token loss has the gradient of -mean_i A_i s_i(theta),
    # s_i = exp(mean_t (logp - old)) (no clipping active: eps = 1).
    torch.manual_seed(1)
    old = torch.randn(3, 5, dtype=D)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    adv = torch.randn(3, dtype=D)
    lp1 = (old + 0.1 * torch.randn(3, 5, dtype=D)).requires_grad_(True)
    lp2 = lp1.detach().clone().requires_grad_(True)
    out = gspo_loss(lp1, old, adv, mask, clip_low=1.0, clip_high=1.0)
    aggregate(out.loss, mask, "seq-mean-token-mean").backward()
    s = (((lp2 - old) * mask).sum(-1) / mask.sum(-1)).exp()
    (-(adv * s).mean()).backward()
    torch.testing.assert_close(lp1.grad, lp2.grad)


# ---------------------------------------------------------------- aggregation

LOSS = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
MASK = t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # third sequence empty: ignored, not counted


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 2.5),  # (1+2+3+4) / 4 tokens
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2 sequences
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 1.25),  # (6/4 + 4/4) / 2 with C = 4
    ],
)
def test_aggregation_hand_values(mode, expected):
    close(aggregate(LOSS, MASK, mode, norm_const=4.0), expected)


def test_sum_norm_needs_constant():
    with pytest.raises(ValueError, match="constant"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_micro_batches_with_global_counts_equal_one_batch(mode):
    torch.manual_seed(2)
    B, T = 6, 5
    old = torch.randn(B, T, dtype=D)
    lengths = torch.tensor([2, 3, 5, 1, 4, 5])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
    adv = torch.randn(B, dtype=D)
    base = old + 0.1 * torch.randn(B, T, dtype=D)

    full = base.clone().requires_grad_(True)
    loss = ppo_clip_loss(full, old, adv, mask).loss
    aggregate(loss, mask, mode, norm_const=8.0).backward()

    acc = base.clone().requires_grad_(True)
    # two micro-batches of different sizes and different padded widths (rows 0-1 fit in 3 columns)
    parts = [(slice(0, 2), 3), (slice(2, 6), 5)]
    counts = global_counts([mask[rows, :w] for rows, w in parts])
    assert (counts.tokens, counts.seqs) == (20.0, 6.0)
    naive = 0.0
    for rows, w in parts:
        lp, m = acc[rows, :w], mask[rows, :w]
        mb = ppo_clip_loss(lp, old[rows, :w], adv[rows], m).loss
        aggregate(mb, m, mode, global_tokens=counts.tokens, global_seqs=counts.seqs, norm_const=8.0).backward()
        naive = naive + aggregate(mb, m, mode, norm_const=8.0).detach() / len(parts)
    torch.testing.assert_close(acc.grad, full.grad)
    if mode == "token-mean":  # the naive mean of micro-batch means is a different loss (the test can fail)
        full_loss = aggregate(ppo_clip_loss(base, old, adv, mask).loss, mask, mode)
        assert abs(float(naive) - float(full_loss)) > 1e-3


# ---------------------------------------------------------------- shaping

def test_top_entropy_shaper_keeps_top_rho_tokens():
    # 9 valid tokens (the 1.0 entropy is masked out); rho = 0.2 -> k = ceil(1.8) = 2 -> keep 0.9 and 0.8
    ent = t([[0.1, 0.9, 0.5, 0.3, 0.7], [0.2, 0.8, 0.4, 0.6, 1.0]])
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    adv = t([[1.0] * 5, [2.0] * 5]) * mask
    out = build_shaper("top_entropy", rho=0.2)(
        ShapingInput(advantages=adv, mask=mask, logp=torch.zeros_like(mask), old_logp=torch.zeros_like(mask),
                     entropies=ent)
    )
    close(out.mask, [[0, 1, 0, 0, 0], [0, 1, 0, 0, 0]])
    close(out.advantages, [[0, 1, 0, 0, 0], [0, 2, 0, 0, 0]])
    with pytest.raises(ValueError, match="entropies"):
        build_shaper("top_entropy")(ShapingInput(advantages=adv, mask=mask, logp=mask, old_logp=mask))


def test_policy_loss_after_top_entropy_shaping_normalises_by_kept_tokens():
    # on-policy (ratio 1): token loss = -A. Selected tokens: (0,1) with A=1 and (1,1) with A=2
    # token-mean over the 2 selected tokens: (-1 - 2) / 2 = -1.5 (not over all 6 tokens: -0.5)
    ent = t([[0.1, 0.9, 0.5], [0.2, 0.8, 0.4]])
    mask = torch.ones(2, 3, dtype=D)
    logp = torch.zeros(2, 3, dtype=D, requires_grad=True)
    cfg = GRPOConfig(shaper="top_entropy", shaper_kwargs={"rho": 0.3})  # k = ceil(1.8) = 2
    adv = t([[1.0] * 3, [2.0] * 3])
    shaped = cfg.build_shaper()(ShapingInput(advantages=adv, mask=mask, entropies=ent, cfg=cfg))
    loss, stats = compute_policy_loss(logp, None, shaped.advantages, shaped.mask, cfg, entropies=ent,
                                      global_tokens=float(shaped.mask.sum()))
    close(loss, -1.5)
    close(stats["n_tokens"], 2.0)
    close(stats["entropy"], (0.9 + 0.8) / 2)


def test_per_token_kl_weights_scale_the_kl_term():
    # k1 = 0.5 on the 3 tokens; weights 0, 1, 2 -> weighted token-mean (0 + 0.5 + 1.0) / 3 = 0.5
    mask = torch.ones(1, 3, dtype=D)
    logp = torch.full((1, 3), -1.0, dtype=D, requires_grad=True)
    cfg = GRPOConfig(kl_estimator="k1", kl_coef=1.0)
    w = t([[0.0, 1.0, 2.0]])
    loss, stats = compute_policy_loss(logp, None, t([0.0]), mask, cfg, ref_logp=logp.detach() - 0.5, kl_weights=w)
    close(stats["kl_loss"], 0.5)
    close(stats["kl_weight_mean"], 1.0)
    loss.backward()
    close(logp.grad, [[0.0, 1 / 3, 2 / 3]])  # d/dlogp of w * (logp - ref) / 3


# ---------------------------------------------------------------- compute_policy_loss glue

def test_compute_policy_loss_with_kl_term():
    # on-policy, mask [[1,1,0],[1,0,0]], A = [1, -4]: token losses -1, -1, 4 -> token-mean 2/3
    # ref = logp - 0.5 -> k1 = 0.5 on each token -> kl loss 0.5; total 2/3 + 0.1 * 0.5 = 0.7166667
    mask = t([[1, 1, 0], [1, 0, 0]])
    logp = torch.full((2, 3), -1.0, dtype=D, requires_grad=True)
    cfg = GRPOConfig(kl_estimator="k1", kl_coef=0.1)
    loss, stats = compute_policy_loss(logp, None, t([1.0, -4.0]), mask, cfg, ref_logp=logp.detach() - 0.5)
    close(loss, 2 / 3 + 0.05)
    close(stats["pg_loss"], 2 / 3)
    close(stats["kl"], 0.5)
    # KL folded into the reward: the loss carries no KL term, the metric is still reported
    cfg_r = GRPOConfig(kl_estimator="k1", kl_coef=0.1, kl_in_reward=True)
    loss_r, stats_r = compute_policy_loss(logp, None, t([1.0, -4.0]), mask, cfg_r, ref_logp=logp.detach() - 0.5)
    close(loss_r, 2 / 3)
    close(stats_r["kl"], 0.5)
    with pytest.raises(ValueError, match="ref_logp"):
        compute_policy_loss(logp, None, t([1.0, -4.0]), mask, cfg)


def test_compute_policy_loss_gspo_and_aggregation_from_config():
    # gspo on-policy, seq-mean-token-sum-norm with C = max_response_length = 4:
    # token losses -A: seq 0 (A=1, 2 tokens) sum -2, seq 1 (A=-4, 1 token) sum 4 -> (-2/4 + 4/4) / 2 = 0.25
    mask = t([[1, 1, 0], [1, 0, 0]])
    logp = torch.zeros(2, 3, dtype=D, requires_grad=True)
    cfg = GRPOConfig(policy_loss="gspo", loss_agg="seq-mean-token-sum-norm", max_response_length=4)
    loss, _ = compute_policy_loss(logp, None, t([1.0, -4.0]), mask, cfg)
    close(loss, 0.25)


def test_gspo_clip_range_comes_from_policy_loss_kwargs():
    # one sequence whose ratio is exp(0.05) with A = 1: GSPO's default range (4e-4 above 1) clips it (no
    # gradient); policy_loss_kwargs={clip_high: 0.1} leaves it inside (gradient -A * s = -exp(0.05) per token)
    mask = t([[1, 1]])
    old = torch.zeros(1, 2, dtype=D)
    grads = []
    for kwargs in ({}, {"clip_high": 0.1}):
        logp = torch.full((1, 2), 0.05, dtype=D, requires_grad=True)
        cfg = GRPOConfig(policy_loss="gspo", loss_agg="token-mean", policy_loss_kwargs=kwargs)
        loss, _ = compute_policy_loss(logp, old, t([1.0]), mask, cfg)
        loss.backward()
        grads.append(logp.grad)
    close(grads[0], [[0.0, 0.0]])
    close(grads[1], [[-math.exp(0.05) / 2] * 2])
    with pytest.raises(ConfigError, match="clip_low=1.5 must be in"):
        GRPOConfig(policy_loss="gspo", policy_loss_kwargs={"clip_low": 1.5})


# ---------------------------------------------------------------- registries and config

@pytest.mark.parametrize(
    "getter,bad,valid",
    [
        (get_policy_loss, "ppo2", ["ppo", "gspo"]),
        (get_aggregation, "token_mean", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                         "seq-mean-token-sum-norm"]),
        (get_shaper, "entropy", ["none", "top_entropy"]),
    ],
)
def test_registries_reject_unknown_names(getter, bad, valid):
    with pytest.raises(ConfigError) as e:
        getter(bad)
    assert repr(bad) in str(e.value)
    for name in valid:
        assert name in str(e.value)


def test_config_validates_names_and_values():
    with pytest.raises(ConfigError, match="unknown policy loss 'ppo2'.*valid: clip_cov, gspo, kl_cov, ppo"):
        GRPOConfig(policy_loss="ppo2")
    with pytest.raises(ConfigError, match="dual_clip_c"):
        GRPOConfig(dual_clip_c=1.0)
    with pytest.raises(ConfigError, match="overlong_cache"):
        GRPOConfig(overlong_penalty=True, max_response_length=100)
    with pytest.raises(ConfigError, match="loss_norm_const"):
        GRPOConfig(loss_agg="seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="unknown grpo key.*clip_hi\\b"):
        GRPOConfig.from_dict({"clip_hi": 0.3})
    cfg = GRPOConfig.from_dict({"clip_high": 0.2, "dual_clip_c": 3.0})
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip_c) == (0.2, 0.2, 3.0)


def test_plugin_policy_loss_via_registry():
    @register_policy_loss("test_reinforce")
    def reinforce(logp, old_logp, advantages, mask, cfg):
        return PolicyLossOutput(loss=-advantages * logp * mask, stats={})  # advantages arrive (B, T)

    try:
        cfg = GRPOConfig(policy_loss="test_reinforce")
        logp = torch.full((1, 2), -2.0, dtype=D, requires_grad=True)
        loss, _ = compute_policy_loss(logp, None, t([3.0]), torch.ones(1, 2, dtype=D), cfg)
        close(loss, 6.0)  # -(3 * -2) on both tokens, token-mean
    finally:
        POLICY_LOSSES.unregister("test_reinforce")
