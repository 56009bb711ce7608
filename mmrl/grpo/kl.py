"""Per-token KL estimators between the policy and a reference model, and the two ways to apply them.

With ``d = logp - ref_logp`` (log-ratio clamped to ``[-20, 20]`` before any ``exp``), samples from the policy
(Schulman, "Approximating KL divergence"):

``k1``   ``d``                              unbiased, high variance, can be negative
``k2``   ``d**2 / 2``                       biased, its gradient is the KL gradient
``k3``   ``exp(-d) - (-d) - 1 = exp(ref - logp) - (ref - logp) - 1``   unbiased, >= 0, low variance (GRPO)
``abs``  ``|d|``
``none`` zeros (no KL)

``clamp`` (optional) clips the estimate to ``[-clamp, clamp]`` (verl clamps k3 to 10).

Placement:

* **as a loss** (GRPO): ``loss = pg_loss + beta * aggregate(kl_penalty(logp, ref_logp, kind))`` -- see
  :func:`mmrl.grpo.config.compute_policy_loss`.
* **in the reward** (classic RLHF-PPO, ``kl_in_reward``): :func:`kl_in_reward` returns
  ``r_i - beta * sum_t k(old_logp, ref_logp)`` (default ``k1``) before advantages are computed; no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from .names import KL_ESTIMATORS

LOG_RATIO_CLAMP = 20.0


class KLEstimator(Protocol):
    def __call__(self, logp: Tensor, ref_logp: Tensor) -> Tensor: ...


# KL_ESTIMATORS (mmrl.grpo.names): the estimators by name; the built-in ones below are declared there too, so
# that a config names them without importing torch


def register_kl(name: str, *, overwrite: bool = False) -> Callable[[KLEstimator], KLEstimator]:
    """Register ``fn(logp (B,T), ref_logp (B,T)) -> per-token estimate (B,T)`` under ``name``."""
    return KL_ESTIMATORS.register(name, overwrite=overwrite)


def get_kl(name: str) -> KLEstimator:
    """The estimator registered under ``name``; :class:`~mmrl_common.errors.ConfigError` listing valid names."""
    return KL_ESTIMATORS.get(name)


def _log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return (logp - ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register_kl("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


@register_kl("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


@register_kl("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    neg_d = -_log_ratio(logp, ref_logp)  # ref - logp
    return neg_d.exp() - neg_d - 1.0


@register_kl("abs")
def kl_abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return (logp - ref_logp).abs()


@register_kl("none")
def kl_none(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return torch.zeros_like(logp)


def kl_penalty(
    logp: Tensor, ref_logp: Tensor, kind: str = "k3", *, clamp: float | None = None, mask: Tensor | None = None
) -> Tensor:
    """Per-token KL estimate ``(B, T)``; ``ref_logp`` is detached; zero outside ``mask`` if given."""
    est = get_kl(kind)(logp, ref_logp.detach())
    if clamp is not None:
        est = est.clamp(-clamp, clamp)
    if mask is not None:
        est = est * mask.to(est.dtype)
    return est


def kl_in_reward(
    rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    beta: float,
    kind: str = "k1",
    *,
    clamp: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(rewards - beta * seq_kl, seq_kl)`` with ``seq_kl_i = sum_t mask * k(logp, ref_logp)``.

    ``logp`` here is the behaviour (rollout / old) policy's log-probs: the penalty is part of the reward,
    computed once before advantages, and carries no gradient.
    """
    with torch.no_grad():
        seq_kl = kl_penalty(logp.detach(), ref_logp, kind, clamp=clamp, mask=mask).sum(-1)
        return rewards - beta * seq_kl.to(rewards.dtype), seq_kl
