"""Entropy tools against hand-computed values: window entropy, the high-entropy threshold and HWE counts on
hand-made entropy sequences, the top-k entropy approximation against the exact entropy of a real tiny model's
forward pass (with its error bound), Clip-Cov / KL-Cov against their formulas, the 80/20 rule's
normalisation by the kept tokens."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.grpo import GRPOConfig, build_shaper, compute_policy_loss, get_policy_loss, global_counts
from mmrl.grpo.cov_losses import clip_cov_loss, kl_cov_loss, token_covariance
from mmrl.grpo.shaping import ShapingInput
from mmrl_common.errors import ConfigError
from rewards.entropy import (
    EntropyThreshold,
    batch_threshold,
    entropy_from_logits,
    hwe_windows,
    rollout_quantile,
    topk_entropy,
    topk_error_bound,
    window_means,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ------------------------------------------------------------------------------------------ window entropy
def test_window_means_full_windows_and_short_responses():
    h = t([0, 0, 4, 4, 0, 0, 0, 0])
    # windows of 4 starting at 0..4: (0+0+4+4)/4, (0+4+4+0)/4, (4+4+0+0)/4, (4+0+0+0)/4, 0
    assert window_means(h, 4).tolist() == [2.0, 2.0, 2.0, 1.0, 0.0]
    assert window_means(t([3, 1]), 4).tolist() == [2.0]  # shorter than w: one window, its mean
    assert window_means(t([]), 4).numel() == 0
    with pytest.raises(ValueError, match="window size"):
        window_means(h, 0)


def test_threshold_is_the_batch_mean_or_median_of_per_rollout_p95():
    # w = 2 over 0..7: windows 0.5, 1.5, ..., 6.5 (7 values); 95th percentile at position 0.95 * 6 = 5.7
    # between 5.5 and 6.5: 6.2
    assert rollout_quantile(t(range(8)), 2, 0.95) == pytest.approx(6.2)
    a = t([0, 0, 4, 4, 0, 0, 0, 0])  # windows (w=4) 2, 2, 2, 1, 0 -> p95 = 2
    b = t([1, 1, 1, 1, 1])  # windows 1, 1 -> 1
    c = t([3, 1])  # one window 2 -> 2
    assert batch_threshold([a, b, c], 4, 0.95, "mean") == pytest.approx(5 / 3)
    assert batch_threshold([a, b, c], 4, 0.95, "median") == pytest.approx(2.0)
    assert batch_threshold([a, b], 4, 0.95, "median") == pytest.approx(1.5)  # even count: middle mean
    assert batch_threshold([t([])], 4) is None


def test_threshold_ema_uses_the_value_before_the_step_and_survives_a_round_trip():
    th = EntropyThreshold(ema=0.5)
    assert th.value(3.0) == 3.0  # nothing averaged yet: the batch's own value
    th.update(3.0)
    assert th.value(5.0) == 3.0  # the average before this step
    th.update(5.0)
    assert th.avg == pytest.approx(4.0)  # 0.5 * 3 + 0.5 * 5
    again = EntropyThreshold(ema=0.5)
    again.load_state_dict(th.state_dict())
    assert again.value(0.0) == pytest.approx(4.0)
    per_batch = EntropyThreshold(ema=None)
    per_batch.update(9.0)
    assert per_batch.value(2.0) == 2.0
    with pytest.raises(ValueError):
        EntropyThreshold(ema=1.0)


def test_hwe_count_every_window_mode():
    h = t([0, 0, 4, 4, 0, 0, 0, 0])
    # windows 2, 2, 2, 1, 0 with tau 1.5: starts 0, 1, 2 count; they cover tokens 0..5
    assert hwe_windows(h, 1.5, 4, "windows") == (3, [0, 1, 2, 3, 4, 5])
    assert hwe_windows(h, 2.0, 4, "windows") == (0, [])  # strictly above tau
    assert hwe_windows(t([5, 5]), 1.0, 4, "windows") == (1, [0, 1])  # short response: its one window


def test_hwe_count_trigger_mode():
    h = t([0, 3, 3, 3, 3, 0, 0, 0])
    words = ["Ġso", "x", "ĠWait", "x", "x", "x", "but", "x"]
    # w = 2, tau = 2: "so" at 0 -> next two tokens 3, 3 (mean 3 >= 2) counts, covers 0..2; "wait" at 2 -> 3, 3
    # counts, covers 2..4; "but" at 6 has fewer than w tokens after it -> not counted
    assert hwe_windows(h, 2.0, 2, "triggers", words=words) == (2, [0, 1, 2, 3, 4])
    assert hwe_windows(h, 3.0, 2, "triggers", words=words) == (2, [0, 1, 2, 3, 4])  # ">= tau" in this mode
    assert hwe_windows(h, 2.0, 2, "triggers", words=words, triggers=["wait"]) == (1, [2, 3, 4])
    assert hwe_windows(h, 2.0, 2, "triggers", words=["x"] * 8) == (0, [])
    with pytest.raises(ValueError, match="one word per token"):
        hwe_windows(h, 2.0, 2, "triggers")
    with pytest.raises(ValueError, match="count mode"):
        hwe_windows(h, 2.0, 2, "every")


# ------------------------------------------------------------------------------------------ top-k entropy
@pytest.fixture(scope="module")
def tiny_logits(tmp_path_factory):
    """Next-token logits of every position of a real tiny Qwen2.5-VL (random weights) on a text prompt."""
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import make_tiny

    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        path = make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m", seed=0)
        policy = load_policy(path, device="cpu")
        ids = policy.tokenizer("Is the square red or blue? Think first, then answer.", return_tensors="pt").input_ids
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].double()
    finally:
        mp.undo()
    return logits


@pytest.mark.parametrize("temperature", [1.0, 0.02])
def test_topk_entropy_against_the_exact_entropy_of_a_real_forward_pass(tiny_logits, temperature):
    logits = tiny_logits / temperature
    vocab = logits.shape[-1]
    exact = entropy_from_logits(logits)
    logp = torch.log_softmax(logits, -1)
    top10 = logp.topk(10, dim=-1).values
    approx = topk_entropy(top10)
    bound = topk_error_bound(top10, vocab)
    # the bound: 0 <= exact - approx <= p_tail * log(V - k)
    gap = exact - approx
    assert bool((gap >= -1e-9).all()) and bool((gap <= bound + 1e-9).all())
    # without the tail term the approximation is lower still
    assert bool((topk_entropy(top10, tail=False) <= approx + 1e-12).all())
    # all V log-probs: exact
    torch.testing.assert_close(topk_entropy(logp.topk(vocab, dim=-1).values), exact, atol=1e-9, rtol=0)
    # measured on this model: at T = 1 (random weights, near uniform over 1360 tokens, H ~ 7.19 nats) the top 10
    # miss almost everything (gap up to 7.09, bound 7.11); at T = 0.02 (H ~ 0.79) the gap is at most 0.072 nats,
    # the bound 0.23, and the tail term removes over half of the error (0.18 without it)
    if temperature == 0.02:
        assert float(gap.max()) < 0.1 and float(bound.max()) < 0.25
        assert float(gap.max()) < float((exact - topk_entropy(top10, tail=False)).max())


def test_topk_entropy_by_hand():
    # top-2 probabilities 0.5, 0.25 -> tail 0.25: -(0.5 ln 0.5 + 0.25 ln 0.25 + 0.25 ln 0.25) = 1.0397
    lp = t([[math.log(0.5), math.log(0.25)]])
    assert float(topk_entropy(lp)) == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)))
    assert float(topk_entropy(lp, tail=False)) == pytest.approx(-(0.5 * math.log(0.5) + 0.25 * math.log(0.25)))
    assert float(topk_error_bound(lp, 6)) == pytest.approx(0.25 * math.log(4))


# ------------------------------------------------------------------------------------------ Clip-Cov / KL-Cov
LOGP = [[-1.0, -2.0, -3.0, -4.0]]  # centred: 1.5, 0.5, -0.5, -1.5


def test_token_covariance_formula():
    adv = t([[4.0, 1.0, -1.0, -3.0]])  # mean 0.25 -> centred 3.75, 0.75, -1.25, -3.25
    cov = token_covariance(t(LOGP), adv, torch.ones(1, 4, dtype=D))
    torch.testing.assert_close(cov, t([[5.625, 0.375, 0.625, 4.875]]))
    # masked tokens are outside the means and get 0
    cov = token_covariance(t([[-1.0, -3.0, 99.0]]), t([[2.0, 0.0, 50.0]]), t([[1, 1, 0]]))
    torch.testing.assert_close(cov, t([[1.0, 1.0, 0.0]]))  # (1)(1), (-1)(-1)


def test_clip_cov_cuts_the_gradient_of_drawn_high_covariance_tokens():
    adv = t([[4.0, 1.0, -1.0, -4.0]])  # centred as is; cov = 6, 0.5, 0.5, 6
    mask = torch.ones(1, 4, dtype=D)
    old = t(LOGP)
    # ratio 1 everywhere; candidates: 1 < cov < 7 -> tokens 0 and 3; k = max(1, floor(0.5 * 4)) = 2
    logp = t(LOGP).requires_grad_(True)
    out = clip_cov_loss(logp, old, adv, mask, ratio=0.5, lb=1.0, ub=7.0)
    torch.testing.assert_close(out.loss, t([[0.0, -1.0, 1.0, 0.0]]))
    out.loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[0.0, -1.0, 1.0, 0.0]]))  # -A * r on the kept tokens
    assert float(out.stats["cov_frac"]) == pytest.approx(0.5)
    # k = 1: exactly one of the two candidates is drawn
    drops = clip_cov_loss(t(LOGP), old, adv, mask, ratio=0.25, lb=1.0, ub=7.0).loss[0] == 0
    assert drops.tolist() in ([True, False, False, False], [False, False, False, True])
    # cov 6 is not < ub = 5: no candidate, nothing cut (the plain PPO loss)
    torch.testing.assert_close(clip_cov_loss(t(LOGP), old, adv, mask, ratio=0.5, lb=1.0, ub=5.0).loss,
                               t([[-4.0, -1.0, 1.0, 4.0]]))
    # a token clipped by PPO (ratio 1.5 > 1.28 with A > 0) is not a candidate: only token 3 is cut
    old2 = old - t([[math.log(1.5), 0.0, 0.0, 0.0]])
    out2 = clip_cov_loss(t(LOGP), old2, adv, mask, ratio=0.5, lb=1.0, ub=7.0)
    torch.testing.assert_close(out2.loss, t([[-4.0 * 1.28, -1.0, 1.0, 0.0]]))


def test_kl_cov_penalises_the_top_covariance_tokens():
    adv = t([[4.0, 1.0, -1.0, -3.0]])  # cov 5.625, 0.375, 0.625, 4.875
    mask = torch.ones(1, 4, dtype=D)
    d = [0.1, 0.0, 0.0, -0.2]  # logp - old
    old = t(LOGP) - t([d])
    logp = t(LOGP).requires_grad_(True)
    out = kl_cov_loss(logp, old, adv, mask, ratio=0.5, coef=2.0)  # k = 2: tokens 0 and 3
    r = [math.exp(x) for x in d]
    want = [-4 * r[0] + 2 * 0.1, -1.0, 1.0, 3 * r[3] + 2 * 0.2]
    torch.testing.assert_close(out.loss, t([want]))
    out.loss.sum().backward()
    # d/dlogp: -A r + coef * sign(logp - old)
    torch.testing.assert_close(logp.grad, t([[-4 * r[0] + 2.0, -1.0, 1.0, 3 * r[3] - 2.0]]))
    assert float(out.stats["cov_frac"]) == pytest.approx(0.5)
    # k = max(1, floor(0.25 * 4)) = 1: token 0 only
    one = kl_cov_loss(t(LOGP), old, adv, mask, ratio=0.25, coef=2.0).loss
    torch.testing.assert_close(one, t([[-4 * r[0] + 0.2, -1.0, 1.0, 3 * r[3]]]))


def test_cov_losses_from_the_config():
    cfg = GRPOConfig(policy_loss="kl_cov", policy_loss_kwargs={"ratio": 0.5, "coef": 2.0})
    adv = t([[4.0, 1.0, -1.0, -3.0]])
    mask = torch.ones(1, 4, dtype=D)
    out = get_policy_loss("kl_cov")(t(LOGP), t(LOGP), adv, mask, cfg)
    torch.testing.assert_close(out.loss, t([[-4.0, -1.0, 1.0, 3.0]]))  # on-policy: |logp - old| = 0
    cfg = GRPOConfig(policy_loss="clip_cov", policy_loss_kwargs={"ratio": 0.5, "lb": 1.0, "ub": 7.0})
    out = get_policy_loss("clip_cov")(t(LOGP), t(LOGP), t([[4.0, 1.0, -1.0, -4.0]]), mask, cfg)
    torch.testing.assert_close(out.loss, t([[0.0, -1.0, 1.0, 0.0]]))
    with pytest.raises(ConfigError, match=r"policy_loss_kwargs \(policy loss 'kl_cov'\): ratio=2.0 is a share"):
        GRPOConfig(policy_loss="kl_cov", policy_loss_kwargs={"ratio": 2.0})
    with pytest.raises(ConfigError, match="lb=5.0 must be below ub=1.0"):
        GRPOConfig(policy_loss="clip_cov", policy_loss_kwargs={"lb": 5.0, "ub": 1.0})
    # a setting the chosen loss does not have is named, with the nearest one it does have
    with pytest.raises(ConfigError, match=r"policy_loss_kwargs.ration: policy loss 'clip_cov' has no setting "
                                          r"'ration'.*ratio.*its settings: lb, ratio, ub"):
        GRPOConfig(policy_loss="clip_cov", policy_loss_kwargs={"ration": 0.5})
    with pytest.raises(ConfigError, match="policy loss 'ppo' has no setting 'ratio'.*its settings: none"):
        GRPOConfig(policy_loss_kwargs={"ratio": 0.5})


# ------------------------------------------------------------------------------------------ 80/20 rule
def test_top_entropy_rule_normalises_by_the_kept_tokens():
    # 6 valid tokens, rho = 0.5 -> keep ceil(3) = the three highest entropies (0.9, 0.8, 0.7)
    ent = t([[0.9, 0.1, 0.8, 0.0], [0.2, 0.7, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 1, 0]])
    adv = t([[1.0, 5.0, 2.0, 0.0], [7.0, 3.0, 9.0, 0.0]]) * mask
    out = build_shaper("top_entropy", rho=0.5)(ShapingInput(advantages=adv, mask=mask, entropies=ent))
    torch.testing.assert_close(out.mask, t([[1, 0, 1, 0], [0, 1, 0, 0]]))
    counts = global_counts([out.mask])
    assert counts.tokens == 3
    logp = t([[-1.0] * 4, [-1.0] * 4])
    loss, _ = compute_policy_loss(logp, logp, out.advantages, out.mask, GRPOConfig(),
                                  global_tokens=counts.tokens, global_seqs=counts.seqs)
    # on-policy PPO loss -A on the kept tokens, averaged over the 3 kept tokens (not the 6 valid ones)
    assert float(loss) == pytest.approx(-(1.0 + 2.0 + 3.0) / 3)


def test_entropy_bonus_is_subtracted_from_the_loss():
    # token-mean: pg 0 (advantages 0), entropies 1 and 3 on the two valid tokens -> loss = -0.1 * 2
    logp = t([[-1.0, -1.0, -1.0]]).requires_grad_(True)
    ent = t([[1.0, 3.0, 9.0]]).requires_grad_(True)
    loss, st = compute_policy_loss(logp, None, torch.zeros(1, dtype=D), t([[1, 1, 0]]),
                                   GRPOConfig(entropy_coef=0.1), entropies=ent)
    assert float(loss.detach()) == pytest.approx(-0.2) and float(st["entropy"]) == pytest.approx(2.0)
    loss.backward()
    torch.testing.assert_close(ent.grad, t([[-0.05, -0.05, 0.0]]))  # raising entropy lowers the loss
