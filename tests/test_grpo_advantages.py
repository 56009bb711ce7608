"""Advantage estimators against hand-computed values (worked out in the comments)."""

import pytest
import torch

from mmrl.grpo import (
    broadcast_to_tokens,
    compute_advantages,
    get_advantage,
    register_advantage,
)
from mmrl.grpo.advantages import ADVANTAGES
from mmrl_common.errors import ConfigError

# Two groups of G=3, contiguous: A = [1, 2, 3], B = [0, 0, 3]
R = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 3.0])


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def test_grpo_unbiased_std():
    # A: mean 2, deviations -1 0 1, unbiased var (1+0+1)/2 = 1 -> std 1 -> [-1, 0, 1]
    # B: mean 1, deviations -1 -1 2, unbiased var (1+1+4)/2 = 3 -> std 1.7320508
    #    -> [-0.5773503, -0.5773503, 1.1547005]
    # (a biased std would give A = [-1.2247, 0, 1.2247])
    adv = compute_advantages(R, group_size=3, estimator="grpo", eps=1e-6)
    close(adv, [-1.0, 0.0, 1.0, -0.5773503, -0.5773503, 1.1547005])


def test_dr_grpo_has_no_std():
    # r - group mean only: A -> [-1, 0, 1], B -> [-1, -1, 2]
    adv = compute_advantages(R, group_size=3, estimator="dr_grpo")
    close(adv, [-1.0, 0.0, 1.0, -1.0, -1.0, 2.0])
    # scaling rewards scales dr_grpo advantages (no std normalisation) but not grpo ones
    close(compute_advantages(10 * R, group_size=3, estimator="dr_grpo"), [-10.0, 0.0, 10.0, -10.0, -10.0, 20.0])
    torch.testing.assert_close(
        compute_advantages(10 * R, group_size=3, estimator="grpo"),
        compute_advantages(R, group_size=3, estimator="grpo"), atol=1e-5, rtol=0,
    )


def test_rloo_hand_values():
    # A: 1 - (2+3)/2 = -1.5 ; 2 - (1+3)/2 = 0 ; 3 - (1+2)/2 = 1.5
    # B: 0 - (0+3)/2 = -1.5 ; 0 - (0+3)/2 = -1.5 ; 3 - (0+0)/2 = 3
    adv = compute_advantages(R, group_size=3, estimator="rloo")
    close(adv, [-1.5, 0.0, 1.5, -1.5, -1.5, 3.0])


def test_batch_std():
    # group-centred: [-1, 0, 1, -1, -1, 2]; batch std over all six rewards [1,2,3,0,0,3]:
    # mean 1.5, squared deviations .25 .25 2.25 2.25 2.25 2.25 = 9.5, unbiased var 9.5/5 = 1.9,
    # std = 1.3784049 -> 1/std = 0.7254763
    adv = compute_advantages(R, group_size=3, estimator="batch_std", eps=0.0)
    close(adv, [-0.7254763, 0.0, 0.7254763, -0.7254763, -0.7254763, 1.4509525])


def test_uneven_groups_by_index():
    # labels 7 -> rows 0,2,4 rewards [1,3,2]: mean 2, unbiased std 1 -> [-1, 1, 0]
    # labels 3 -> rows 1,3 rewards [5,0]: mean 2.5, unbiased std sqrt(12.5) = 3.5355339 -> [0.7071068, -0.7071068]
    # label 9 -> row 5 alone -> 0 (no baseline)
    r = torch.tensor([1.0, 5.0, 3.0, 0.0, 2.0, 4.0])
    idx = torch.tensor([7, 3, 7, 3, 7, 9])
    adv = compute_advantages(r, group_index=idx, estimator="grpo", eps=0.0)
    close(adv, [-1.0, 0.7071068, 1.0, -0.7071068, 0.0, 0.0])
    # rloo on the same: group 7: 1-(3+2)/2=-1.5, 3-(1+2)/2=1.5, 2-(1+3)/2=0; group 3: 5-0=5, 0-5=-5; solo 0
    close(compute_advantages(r, group_index=idx, estimator="rloo"), [-1.5, 5.0, 1.5, -5.0, 0.0, 0.0])


def test_all_equal_group_gets_zero():
    adv = compute_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), group_size=3)
    close(adv[:3], [0.0, 0.0, 0.0])
    assert adv[3:].abs().sum() > 0


def test_bad_group_size():
    with pytest.raises(ValueError, match="groups of size 4"):
        compute_advantages(R, group_size=4)
    with pytest.raises(ValueError, match="exactly one"):
        compute_advantages(R)


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    close(out, [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])


def test_registry_rejects_unknown_and_lists_options():
    with pytest.raises(ConfigError) as e:
        get_advantage("grpoo")
    msg = str(e.value)
    assert "'grpoo'" in msg
    for name in ("grpo", "dr_grpo", "batch_std", "rloo"):
        assert name in msg
    with pytest.raises(ConfigError):
        compute_advantages(R, group_size=3, estimator="nope")


def test_register_custom_estimator():
    @register_advantage("test_sign")
    def sign_adv(rewards, groups, eps):
        return torch.sign(rewards - groups.mean[groups.inverse])

    try:
        close(compute_advantages(R, group_size=3, estimator="test_sign"), [-1.0, 0.0, 1.0, -1.0, -1.0, 1.0])
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("test_sign")(lambda r, g, e: r)
    finally:
        ADVANTAGES.unregister("test_sign")


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "batch_std", "rloo"])
def test_all_equal_float32_groups_get_exactly_zero(estimator):
    # 1.2 = accuracy 1.0 + format 0.2, the shipped recipes' fully-correct group: the float32 mean of eight
    # 1.2s is one ulp off, which the 1e-6 epsilon did not swamp (+0.106 on every member before the fix)
    rewards = torch.cat([torch.full((8,), 1.2), torch.full((8,), 0.2), torch.tensor([1.2, 0.2] * 4)])
    adv = compute_advantages(rewards, group_size=8, estimator=estimator)
    assert adv.dtype == torch.float32
    assert torch.equal(adv[:16], torch.zeros(16))
    assert adv[16:].abs().min() > 0.1


def test_estimators_see_components_and_extra_fields():
    from mmrl.grpo import register_advantage

    @register_advantage("t_accuracy_only")
    def accuracy_only(rewards, groups, eps):  # a method's estimator: centre the accuracy component, scaled
        acc = groups.components["accuracy"].to(rewards.dtype)
        return (acc - groups.mean.new_tensor(0.5)) * torch.as_tensor(groups.extra["scale"], dtype=rewards.dtype)

    adv = compute_advantages(torch.tensor([1.2, 0.2, 0.2, 1.2]), group_size=2, estimator="t_accuracy_only",
                             components={"accuracy": torch.tensor([1.0, 0.0, 0.0, 1.0])},
                             extra={"scale": [2.0, 2.0, 4.0, 4.0]})
    assert adv.tolist() == [1.0, -1.0, -2.0, 2.0]
