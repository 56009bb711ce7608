"""Per-sequence advantages from scalar rewards, computed within groups (the G completions of one prompt).

Input layout: ``rewards`` is a flat ``(N,)`` tensor. Either the groups are contiguous with a fixed size
(``group_size=G``, ``N = B*G``, rows ``[g*G, (g+1)*G)`` belong to prompt ``g``), or ``group_index`` gives
a label per row (any integers, any order, uneven sizes; e.g. after dynamic-sampling or overlong filtering).

Estimators (registered by name; add your own with :func:`register_advantage`):

``grpo``
    ``(r - mean_g) / (std_g + eps)`` with the **unbiased** (n-1) group std, as in DeepSeekMath GRPO, TRL
    (``torch.std``) and verl ``compute_grpo_outcome_advantage`` (eps 1e-6).
``dr_grpo``
    ``r - mean_g`` (Dr. GRPO: no std division, removes the difficulty bias).
``batch_std``
    ``(r - mean_g) / (std_batch + eps)``: group-mean centring, unbiased std over all rewards of the batch
    (Lite PPO; TRL ``scale_rewards="batch"``).
``rloo``
    ``r_i - mean_{j != i, j in g} r_j`` (leave-one-out baseline) ``= G/(G-1) * (r_i - mean_g)``.

Groups of size 1 have no baseline: every estimator gives them advantage 0 (verl instead passes the raw
reward through; we prefer 0 so that a lone survivor of filtering cannot inject an un-centred signal).
A group whose rewards are all equal gets exactly 0 under every estimator (computed in float64, and set to 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from .names import ADVANTAGES


@dataclass(frozen=True)
class GroupStats:
    """Per-row view of the group structure: ``inverse[i]`` is row i's group (0..n_groups-1)."""

    inverse: Tensor  # (N,) long
    counts: Tensor  # (n_groups,) float, rows per group
    mean: Tensor  # (n_groups,) group mean
    n_groups: int
    components: dict[str, Tensor] = field(default_factory=dict)  # (N,) reward components, when known
    extra: dict[str, Any] = field(default_factory=dict)  # the rollout batch's per-sequence method fields


class AdvantageEstimator(Protocol):
    def __call__(self, rewards: Tensor, groups: GroupStats, eps: float) -> Tensor: ...


# ADVANTAGES (mmrl.grpo.names): the estimators by name; the built-in ones below are declared there too, so that
# a config names them without importing torch


def register_advantage(name: str, *, overwrite: bool = False) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Register ``fn(rewards (N,), groups: GroupStats, eps) -> advantages (N,)`` under ``name``."""
    return ADVANTAGES.register(name, overwrite=overwrite)


def get_advantage(name: str) -> AdvantageEstimator:
    """The estimator registered under ``name``; :class:`~mmrl_common.errors.ConfigError` listing valid names."""
    return ADVANTAGES.get(name)


def group_inverse(
    n: int, *, group_size: int | None = None, group_index: Tensor | None = None, device=None
) -> Tensor:
    """Row -> dense group id (0..n_groups-1) from either a fixed contiguous ``group_size`` or labels."""
    if (group_size is None) == (group_index is None):
        raise ValueError("pass exactly one of group_size or group_index")
    if group_index is not None:
        group_index = torch.as_tensor(group_index, device=device)
        if group_index.shape != (n,):
            raise ValueError(f"group_index must have shape ({n},), got {tuple(group_index.shape)}")
        return torch.unique(group_index, return_inverse=True)[1]
    assert group_size is not None
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards cannot be split into groups of size {group_size}")
    return torch.arange(n, device=device) // group_size


def group_stats(rewards: Tensor, inverse: Tensor) -> GroupStats:
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, torch.ones_like(rewards)
    )
    sums = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    return GroupStats(inverse=inverse, counts=counts, mean=sums / counts, n_groups=n_groups)


def _centred(rewards: Tensor, g: GroupStats) -> Tensor:
    return rewards - g.mean[g.inverse]


def _solo(g: GroupStats) -> Tensor:
    """True for rows whose group has a single member."""
    return g.counts[g.inverse] < 2


@register_advantage("grpo")
def grpo_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    c = _centred(rewards, groups)
    ss = torch.zeros_like(groups.mean).index_add_(0, groups.inverse, c * c)
    std = (ss / (groups.counts - 1).clamp(min=1)).sqrt()
    adv = c / (std[groups.inverse] + eps)
    return torch.where(_solo(groups), torch.zeros_like(adv), adv)


@register_advantage("dr_grpo")
def dr_grpo_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    return _centred(rewards, groups)  # solo groups: r - r = 0 already


@register_advantage("batch_std")
def batch_std_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    std = rewards.std(unbiased=True) if rewards.numel() > 1 else rewards.new_tensor(0.0)
    return _centred(rewards, groups) / (std + eps)


@register_advantage("rloo")
def rloo_advantage(rewards: Tensor, groups: GroupStats, eps: float) -> Tensor:
    n = groups.counts[groups.inverse]
    adv = _centred(rewards, groups) * n / (n - 1).clamp(min=1)
    return torch.where(_solo(groups), torch.zeros_like(adv), adv)


def compute_advantages(
    rewards: Tensor,
    *,
    group_size: int | None = None,
    group_index: Tensor | None = None,
    estimator: str = "grpo",
    eps: float = 1e-6,
    components: dict[str, Tensor] | None = None,
    extra: dict[str, Any] | None = None,
) -> Tensor:
    """Per-sequence advantages ``(N,)`` for flat rewards ``(N,)``; see the module docstring.

    Computed in float32 at least (integer or half rewards are promoted); no gradient flows. ``components``
    and ``extra`` (the rollout batch's reward components and method fields) reach the estimator through
    :class:`GroupStats`.
    """
    fn = get_advantage(estimator)
    rewards = torch.as_tensor(rewards).detach()
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a flat (N,) tensor, got shape {tuple(rewards.shape)}")
    out_dtype = torch.promote_types(rewards.dtype, torch.float32)
    if rewards.numel() == 0:
        return rewards.to(out_dtype).clone()
    # float64 inside: the float32 mean of equal values can be one ulp off, and a 1e-6 epsilon does not
    # swamp the resulting tiny std (1.2 x 8 gave +0.106 on every member); all-equal groups are set to 0.
    r64 = rewards.to(torch.float64)
    inverse = group_inverse(rewards.numel(), group_size=group_size, group_index=group_index,
                            device=rewards.device)
    stats = replace(group_stats(r64, inverse), components=dict(components or {}), extra=dict(extra or {}))
    adv = fn(r64, stats, eps)
    n_groups = int(inverse.max()) + 1
    hi = torch.full((n_groups,), -torch.inf, dtype=r64.dtype, device=r64.device).scatter_reduce(0, inverse, r64, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=r64.dtype, device=r64.device).scatter_reduce(0, inverse, r64, "amin")
    adv = torch.where((hi == lo)[inverse], torch.zeros_like(adv), adv)
    return adv.to(out_dtype)


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """``(B,)`` per-sequence advantages -> ``(B, T)`` per-token, zero where ``mask`` is 0.

    A ``(B, T)`` input is returned masked (already per-token, e.g. after shaping).
    """
    mask = mask.to(advantages.dtype) if advantages.is_floating_point() else mask.float()
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} do not match mask {tuple(mask.shape)}")
    return advantages * mask
