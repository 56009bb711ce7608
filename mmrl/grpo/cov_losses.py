"""Clip-Cov and KL-Cov policy losses (arXiv 2505.22617, "The Entropy Mechanism of RL for Reasoning LMs").

Both act on the tokens whose log-probability and advantage co-vary most -- the ones that drive entropy down
under policy gradient. Over the valid tokens of the (micro-)batch, as the authors' code does::

    Cov_t = (logp_t - mean(logp)) * (A_t - mean(A))       (log-probs detached; means over valid tokens)

``clip_cov`` (``policy_loss: clip_cov``): the ordinary PPO clipped loss (``clip_low``/``clip_high``/
``dual_clip_c``); among the tokens that clipping left alone and whose covariance lies strictly inside
``(lb, ub)``, ``max(1, floor(ratio * N))`` drawn uniformly at random (N = valid
tokens; none when no token qualifies) have their loss set to 0, i.e. no gradient. Defaults r = 2e-4,
bounds 1 and 5 (the authors' recipes, which also set the PPO clip to 1 -- here the recipe decides).

``kl_cov`` (``policy_loss: kl_cov``): no ratio clipping, ``-A*r`` on every token, plus
``coef * |logp - old_logp|`` on the ``max(1, floor(ratio * N))`` tokens with the largest
covariance. Defaults coefficient 1, ratio 2e-4 as a fraction (verl's units; the authors' repo stores
``k_percent`` = 0.2 for 7B models, i.e. 2e-3 here).

Both log ``cov_frac`` (share of valid tokens selected) and ``cov_mean`` (mean covariance). On-policy with one
optimizer step per batch the ratio is 1 and ``|logp - old_logp|`` is 0 in value (its gradient is not): the
KL-Cov penalty acts through its gradient ``coef * sign(logp - old_logp)``, which is 0 at equality, so
these losses matter when updates are off-policy (several mini-batches or PPO epochs), as in the authors' runs.

Their settings go in ``grpo.policy_loss_kwargs``: ``{ratio: 2e-4, lb: 1, ub: 5}`` for ``clip_cov``,
``{ratio: 2e-4, coef: 1}`` for ``kl_cov`` (the authors' defaults; the ratio is a share of the valid tokens).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ._util import masked_mean
from .losses import LOG_RATIO_CLAMP, PolicyLossOutput, check_loss_inputs, ppo_clip_loss, register_policy_loss

if TYPE_CHECKING:
    from .config import GRPOConfig


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``(B, T)`` centred product of the detached log-probs and the advantages over valid tokens; 0 elsewhere."""
    m = mask.to(logp.dtype)
    lp = logp.detach()
    adv = advantages.detach().to(lp.dtype)
    n = m.sum().clamp(min=1)
    lp_c = lp - (lp * m).sum() / n
    adv_c = adv - (adv * m).sum() / n
    return lp_c * adv_c * m


def _n_select(ratio: float, n_valid: int) -> int:
    return max(1, math.floor(ratio * n_valid)) if n_valid > 0 and ratio > 0 else 0


def clip_cov_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, ratio: float = 2e-4,
                  lb: float = 1.0, ub: float = 5.0, clip_low: float = 0.2, clip_high: float = 0.28,
                  clip_c: float | None = None, generator: torch.Generator | None = None) -> PolicyLossOutput:
    """Clip-Cov (module docstring). ``generator`` seeds the random choice (default: torch's global RNG)."""
    adv, m = check_loss_inputs(logp, old_logp, advantages, mask)
    out = ppo_clip_loss(logp, old_logp, adv, m, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    r = (logp.detach() - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    clipped = ((r > 1.0 + clip_high) & (adv > 0)) | ((r < 1.0 - clip_low) & (adv < 0))
    if clip_c is not None:
        clipped |= (adv < 0) & (r > clip_c)
    cov = token_covariance(logp, adv, m)
    valid = m.bool()
    cand = (valid & ~clipped & (cov > lb) & (cov < ub)).flatten().nonzero().flatten()
    k = min(_n_select(ratio, int(valid.sum())), cand.numel())
    drop = torch.zeros(valid.numel(), dtype=torch.bool, device=logp.device)
    if k > 0:
        pick = torch.randperm(cand.numel(), generator=generator, device="cpu")[:k].to(cand.device)
        drop[cand[pick]] = True
    drop = drop.view(valid.shape)
    loss = torch.where(drop, torch.zeros_like(out.loss), out.loss)
    stats = dict(out.stats)
    stats["cov_frac"] = masked_mean(drop.to(m.dtype), m)
    stats["cov_mean"] = masked_mean(cov, m)
    return PolicyLossOutput(loss=loss * m, stats=stats)


def kl_cov_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, ratio: float = 2e-4,
                coef: float = 1.0) -> PolicyLossOutput:
    """KL-Cov (module docstring)."""
    adv, m = check_loss_inputs(logp, old_logp, advantages, mask)
    log_ratio = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_t = log_ratio.exp()
    loss = -adv * ratio_t
    cov = token_covariance(logp, adv, m)
    valid = m.bool()
    k = _n_select(ratio, int(valid.sum()))
    pen = torch.zeros(valid.numel(), dtype=torch.bool, device=logp.device)
    if k > 0:
        pen[cov.masked_fill(~valid, -torch.inf).flatten().topk(k).indices] = True
    pen = pen.view(valid.shape)
    loss = loss + torch.where(pen, coef * (logp - old_logp.detach()).abs(), torch.zeros_like(loss))
    r = ratio_t.detach()
    zero = m.new_zeros(())
    stats = {"clip_frac": zero, "clip_frac_high": zero, "clip_frac_low": zero, "dual_clip_frac": zero,
             "ratio_mean": masked_mean(r, m), "ratio_max": r[valid].max() if bool(valid.any()) else zero,
             "cov_frac": masked_mean(pen.to(m.dtype), m), "cov_mean": masked_mean(cov, m)}
    return PolicyLossOutput(loss=loss * m, stats=stats)


# The settings of both losses, their defaults and checks are declared with their names in mmrl.grpo.names (a config
# sets and checks them without torch); tests/test_torch_free_names.py holds those defaults to the ones above.
@register_policy_loss("clip_cov")
def _clip_cov_from_cfg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: GRPOConfig):
    s = cfg.loss_settings
    return clip_cov_loss(logp, old_logp, advantages, mask, ratio=s["ratio"], lb=s["lb"], ub=s["ub"],
                         clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.dual_clip_c)


@register_policy_loss("kl_cov")
def _kl_cov_from_cfg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: GRPOConfig):
    s = cfg.loss_settings
    return kl_cov_loss(logp, old_logp, advantages, mask, ratio=s["ratio"], coef=s["coef"])
