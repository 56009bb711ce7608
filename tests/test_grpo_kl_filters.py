"""KL estimators and DAPO filters against hand-computed values."""

import math

import pytest
import torch

from mmrl.grpo import (
    GroupAccumulator,
    accumulate_groups,
    dynamic_sampling_mask,
    get_kl,
    informative_groups,
    kl_in_reward,
    kl_penalty,
    overlong_keep_mask,
    soft_overlong_penalty,
)
from mmrl_common.errors import ConfigError

D = torch.float64


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a.to(D), torch.tensor(b, dtype=D), atol=tol, rtol=0)


# ---------------------------------------------------------------- KL

LOGP = torch.tensor([[-1.0, -2.0, -1.5]], dtype=D)
REF = torch.tensor([[-2.0, -1.0, -1.5]], dtype=D)
# d = logp - ref = [1, -1, 0]


def test_k1():
    close(kl_penalty(LOGP, REF, "k1"), [[1.0, -1.0, 0.0]])


def test_k2():
    close(kl_penalty(LOGP, REF, "k2"), [[0.5, 0.5, 0.0]])  # d^2 / 2


def test_k3():
    # exp(ref - logp) - (ref - logp) - 1:
    #  d=1:  e^-1 + 1 - 1 = 0.3678794 ;  d=-1: e^1 - 1 - 1 = 0.7182818 ;  d=0: 1 - 0 - 1 = 0
    close(kl_penalty(LOGP, REF, "k3"), [[math.exp(-1), math.e - 2, 0.0]])
    close(kl_penalty(LOGP, REF, "k3"), [[0.3678794, 0.7182818, 0.0]])


def test_kl_clamp_mask_and_none():
    close(kl_penalty(LOGP, REF, "k1", clamp=0.5), [[0.5, -0.5, 0.0]])
    close(kl_penalty(LOGP, REF, "k3", mask=torch.tensor([[1, 0, 1]])), [[0.3678794, 0.0, 0.0]])
    close(kl_penalty(LOGP, REF, "none"), [[0.0, 0.0, 0.0]])


def test_k3_gradient_flows_to_logp_only():
    logp = LOGP.clone().requires_grad_(True)
    ref = REF.clone().requires_grad_(True)
    kl_penalty(logp, ref, "k3").sum().backward()
    # d/dlogp [exp(ref-logp) - (ref-logp) - 1] = 1 - exp(ref - logp): [1 - e^-1, 1 - e, 0]
    close(logp.grad, [[1 - math.exp(-1), 1 - math.e, 0.0]])
    assert ref.grad is None


def test_kl_in_reward():
    # k1 per token [[1, -0.5, (pad)], [0.2, 0.2, 0.2]] -> sums 0.5 and 0.6; beta 0.1
    # rewards [1, 0] -> [1 - 0.05, 0 - 0.06] = [0.95, -0.06]
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    ref = torch.tensor([[-1.0, 0.5, -7.0], [-0.2, -0.2, -0.2]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    new, seq_kl = kl_in_reward(torch.tensor([1.0, 0.0], dtype=D), old, ref, mask, beta=0.1)
    close(seq_kl, [0.5, 0.6])
    close(new, [0.95, -0.06])


def test_kl_registry_rejects_unknown():
    with pytest.raises(ConfigError) as e:
        get_kl("k4")
    for name in ("'k4'", "k1", "k2", "k3", "none"):
        assert name in str(e.value)


# ---------------------------------------------------------------- dynamic sampling

def test_all_equal_groups_are_dropped():
    # groups of 3: [1,1,1] all equal -> drop; [0,1,0] -> keep; [.5,.5,.5] -> drop;
    # [1, 1+1e-9, 1] equal within tol 1e-6 -> drop; [0, 0, 1e-3] -> keep
    r = torch.tensor([1, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5, 1, 1 + 1e-9, 1, 0, 0, 1e-3], dtype=D)
    assert informative_groups(r, group_size=3).tolist() == [False, True, False, False, True]
    assert dynamic_sampling_mask(r, group_size=3).tolist() == [False] * 3 + [True] * 3 + [False] * 6 + [True] * 3


def test_dynamic_sampling_mask_with_group_index():
    r = torch.tensor([1.0, 2.0, 1.0, 2.0, 5.0])
    idx = torch.tensor([4, 4, 8, 8, 9])  # group 4 [1, 2] keep; group 8 [1, 2] keep; group 9 alone -> drop
    assert dynamic_sampling_mask(r, group_index=idx).tolist() == [True, True, True, True, False]
    idx2 = torch.tensor([0, 1, 0, 1, 1])  # group 0 [1, 1] drop; group 1 [2, 2, 5] keep
    assert dynamic_sampling_mask(r, group_index=idx2).tolist() == [False, True, False, True, True]


def test_accumulator_stops_at_max_draws():
    calls = []

    def draw():
        calls.append(1)
        return ["g"] * 4, [[1.0, 1.0]] * 4  # every group all-equal: nothing is ever kept

    acc = accumulate_groups(draw, target_groups=2, max_draws=3)
    assert len(calls) == 4  # the first round + 3 extra
    assert acc.rounds == 4 and acc.extra_draws == 3
    assert acc.groups == [] and not acc.reached_target and not acc.needs_more()
    assert acc.stats()["dynamic_sampling/groups_dropped"] == 16.0
    with pytest.raises(RuntimeError, match="max_draws"):
        acc.add(["x"], [[0.0, 1.0]])


def test_accumulator_stops_at_target_and_truncates():
    rounds = iter([
        (["a", "b", "c"], [[0, 1], [1, 1], [0, 0]]),  # keeps a
        (["d", "e"], [[1, 1], [1, 0]]),  # keeps e
        (["f", "g", "h"], [[0, 1], [0, 1], [0, 1]]),  # keeps f, g; h over the target -> discarded
        (["never"], [[0, 1]]),
    ])
    acc = accumulate_groups(lambda: next(rounds), target_groups=4, max_draws=9)
    assert acc.groups == ["a", "e", "f", "g"]
    assert acc.rounds == 3 and acc.reached_target and not acc.needs_more()


def test_accumulator_zero_extra_draws():
    acc = GroupAccumulator(target_groups=3, max_draws=0)
    assert acc.needs_more()
    assert acc.add([1, 2], [torch.tensor([0.0, 1.0]), torch.tensor([2.0, 2.0])]) == 1
    assert not acc.needs_more() and acc.groups == [1]


# ---------------------------------------------------------------- overlong

def test_soft_overlong_penalty_breakpoints():
    # L_max = 20, L_cache = 4 -> ramp from 16 (0) to 20 (-1): (16 - L) / 4
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    close(soft_overlong_penalty(lengths, 20, 4), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    # factor f scales the ramp: L=18 -> -0.5 * 0.5 = -0.25; beyond L_max -> -f
    close(soft_overlong_penalty(lengths, 20, 4, factor=0.5), [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError):
        soft_overlong_penalty(lengths, 20, 0)


def test_overlong_filter():
    # hit max length without EOS -> drop; max length with EOS -> keep; short without EOS -> keep
    keep = overlong_keep_mask(torch.tensor([20, 20, 15]), torch.tensor([False, True, False]), 20)
    assert keep.tolist() == [False, True, True]
    mask = torch.ones(3, 4)
    assert (mask * keep[:, None]).sum().item() == 8.0


def _source_online_filter(scores: list[float], low: float = 0.01, high: float = 0.99) -> bool:
    """EasyR1's online filtering as ARES's config.yaml runs it (filter_key overall, filter_low 0.01,
    filter_high 0.99): a group is kept when the mean of its overall rewards lies strictly between the two."""
    mean = sum(scores) / len(scores)
    return low < mean < high


def test_the_band_rule_keeps_groups_by_their_mean_reward_as_easyr1_does() -> None:
    import random

    from mmrl.grpo import GroupAccumulator

    rng = random.Random(0)
    groups = [[0.5] * 8, [1.0] * 8, [0.0] * 8, [1.0] * 7 + [0.96], [0.0] * 7 + [0.2]]  # edge cases first
    groups += [[rng.choice([0.0, 0.2, 0.5, 1.0, 1.2]) for _ in range(8)] for _ in range(300)]
    band = GroupAccumulator(target_groups=len(groups), max_draws=0, band=(0.01, 0.99))
    band.add(list(range(len(groups))), groups)
    assert band.groups == [i for i, g in enumerate(groups) if _source_online_filter(g)]
    assert 0 in band.groups and 3 not in band.groups  # equal rewards of mean 0.5 kept; a mean of 0.995 dropped
    dapo = GroupAccumulator(target_groups=len(groups), max_draws=0)
    dapo.add(list(range(len(groups))), groups)
    assert 0 not in dapo.groups and 3 in dapo.groups  # the default rule: unequal rewards, whatever the mean


def test_a_band_that_is_not_low_below_high_is_refused() -> None:
    from mmrl.grpo import GRPOConfig
    from mmrl_common.errors import ConfigError

    assert GRPOConfig(dynamic_sampling_band=[0.01, 0.99]).dynamic_sampling_band == [0.01, 0.99]
    for bad in ([0.9, 0.1], [0.5], ["a", 1]):
        with pytest.raises(ConfigError, match="dynamic_sampling_band"):
            GRPOConfig(dynamic_sampling_band=bad)
