"""Per-token policy-gradient losses (to be minimised) and their clip statistics.

All functions take ``(B, T)`` tensors: ``logp`` (current policy, carries the gradient), ``old_logp``
(behaviour policy that generated the rollouts, detached), ``advantages`` (``(B,)`` per sequence or
``(B, T)`` per token), ``mask`` (1 on response tokens that train). They return a :class:`PolicyLossOutput`
whose ``loss`` is ``(B, T)`` (zero outside the mask) -- aggregation is a separate step
(:mod:`mmrl.grpo.aggregate`). Stats are detached 0-dim tensors over masked tokens (call ``.item()`` when
logging; we avoid a device sync per micro-batch).

``ppo`` (token ratio ``r = exp(logp - old_logp)``, log-ratio clamped to ``[-20, 20]``)::

    loss = max(-A*r, -A*clip(r, 1-clip_low, 1+clip_high))            # = -min(rA, clip(r)A)
    if clip_c is not None and A < 0:  loss = min(loss, -clip_c*A)      # dual clip, clip_c > 1

Inside the clip range ``d loss / d logp = -A*r``; when clipped (``r > 1+clip_high`` with A > 0,
``r < 1-clip_low`` with A < 0) or dual-clipped (``r > clip_c`` with A < 0) the gradient is 0.

``gspo`` (GSPO-token form, arXiv 2507.18071): sequence ratio
``s_i = exp(sum_t m (logp - old_logp) / sum_t m)`` (log clamped at 10 from above as verl does) and per-token
``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` -- numerically ``s_i`` on every token, so the clip decision is
per sequence, with ``d s_it / d logp_t = s_i``. Loss ``max(-A*s_it, -A*clip(s_it, 1-eps_low, 1+eps_high))``.
With ``seq-mean-token-mean`` aggregation and a per-sequence A the gradient equals the paper's sequence
objective ``-mean_i A_i * s_i``; other aggregations are allowed (per-token advantages flow, as in GSPO-token).

Register a new loss with :func:`register_policy_loss`; it receives the same tensors plus the
:class:`~mmrl.grpo.config.GRPOConfig`. A loss's own knobs are its ``settings`` (declared with their defaults
at registration, optionally with a ``check``; the built-in losses' in :mod:`mmrl.grpo.names`, which a config
reads without torch): the run sets them in ``grpo.policy_loss_kwargs`` (as
``grpo.shaper_kwargs`` for a shaper), and the loss reads them merged with the defaults from
``cfg.loss_settings``; an unknown key or a value the check refuses fails when the configuration loads. Called from
:func:`~mmrl.grpo.config.compute_policy_loss`, ``advantages`` are always per-token ``(B, T)`` (after shaping)
and the returned ``loss`` must be ``(B, T)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from ._util import masked_max, masked_mean
from .names import (
    POLICY_LOSSES,
    policy_loss_settings,  # noqa: F401  (its home is mmrl.grpo.names, without torch)
)

# ``cfg`` below is the run's mmrl.grpo.config.GRPOConfig (not imported: any object with its attributes does)
GRPOSettings = Any

LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_MAX = 10.0


@dataclass
class PolicyLossOutput:
    loss: Tensor  # (B, T) per-token loss, 0 outside the mask
    stats: dict[str, Tensor] = field(default_factory=dict)


class PolicyLoss(Protocol):
    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: GRPOSettings
    ) -> PolicyLossOutput: ...


# POLICY_LOSSES (mmrl.grpo.names): the losses by name; the built-in ones below are declared there too, with their
# settings and checks, so that a config names them and sets their settings without importing torch


def register_policy_loss(name: str, *, overwrite: bool = False, settings: Mapping[str, Any] | None = None,
                         check: Callable[[dict[str, Any]], None] | None = None,
                         ) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register ``fn(logp, old_logp, advantages, mask, cfg) -> PolicyLossOutput`` under ``name``.

    ``settings``: the loss's own knobs and their defaults (set in ``grpo.policy_loss_kwargs``, read by the loss
    from ``cfg.loss_settings``); ``check(settings)`` raises :class:`ValueError` (its message says what is
    wrong) for values the loss cannot use. A built-in loss gives neither: they are declared with its name in
    :mod:`mmrl.grpo.names`."""
    meta: dict[str, Any] = {}
    if settings is not None:
        meta["settings"] = dict(settings)
    if check is not None:
        meta["check"] = check
    return POLICY_LOSSES.register(name, overwrite=overwrite, meta=meta)


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered under ``name``; :class:`~mmrl_common.errors.ConfigError` listing valid names."""
    return POLICY_LOSSES.get(name)


def check_loss_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor,
                      mask: Tensor) -> tuple[Tensor, Tensor]:
    """Check a policy loss's inputs and bring them to its form: ``logp``, ``old_logp`` and ``mask`` are
    ``(B, T)``; ``advantages`` ``(B,)`` (one per sequence, broadcast over its tokens) or ``(B, T)``. Returns
    the advantages (detached) and the mask, both ``(B, T)`` in ``logp``'s dtype; ``ValueError`` on a shape
    mismatch."""
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} "
            "must all be (B, T)"
        )
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages {tuple(advantages.shape)} do not match batch {logp.shape[0]}")
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be (B,) or (B, T)={tuple(logp.shape)}")
    return advantages.detach().to(logp.dtype), mask.to(logp.dtype)


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = None,
) -> PolicyLossOutput:
    """Token-level PPO clipped surrogate with clip-higher and optional dual clip (module docstring)."""
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"dual-clip constant must be > 1, got {clip_c}")
    adv, m = check_loss_inputs(logp, old_logp, advantages, mask)
    log_ratio = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    r = ratio.detach()
    stats = {
        "clip_frac_high": masked_mean(((r > 1.0 + clip_high) & (adv > 0)).to(m.dtype), m),
        "clip_frac_low": masked_mean(((r < 1.0 - clip_low) & (adv < 0)).to(m.dtype), m),
        "ratio_mean": masked_mean(r, m),
        "ratio_max": masked_max(r, m),
    }
    if clip_c is not None:
        cap = -adv * clip_c
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        stats["dual_clip_frac"] = masked_mean(dual.to(m.dtype), m)
    else:
        stats["dual_clip_frac"] = m.new_zeros(())
    stats["clip_frac"] = stats["clip_frac_high"] + stats["clip_frac_low"]
    return PolicyLossOutput(loss=loss * m, stats=stats)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``(B,)`` mean over masked tokens of ``logp - old_logp`` (log of the GSPO sequence ratio)."""
    m = mask.to(logp.dtype)
    return ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1)


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> PolicyLossOutput:
    """GSPO with the GSPO-token gradient form (module docstring); clip is per sequence."""
    adv, m = check_loss_inputs(logp, old_logp, advantages, mask)
    log_s = sequence_log_ratio(logp, old_logp.detach(), m).detach().clamp(max=GSPO_LOG_RATIO_MAX)
    log_s_tok = log_s[:, None] + logp - logp.detach()
    s_tok = log_s_tok.exp()
    loss = torch.maximum(-adv * s_tok, -adv * s_tok.clamp(1.0 - clip_low, 1.0 + clip_high))
    s = log_s.exp()
    seq_valid = (m.sum(-1) > 0).to(m.dtype)
    # clipping is a per-sequence event; report fractions over sequences (advantage sign taken per sequence
    # from the first valid token -- equal on all tokens for outcome rewards)
    first = m.argmax(-1)
    seq_adv = adv.gather(1, first[:, None]).squeeze(1)
    stats = {
        "clip_frac_high": masked_mean(((s > 1.0 + clip_high) & (seq_adv > 0)).to(m.dtype), seq_valid),
        "clip_frac_low": masked_mean(((s < 1.0 - clip_low) & (seq_adv < 0)).to(m.dtype), seq_valid),
        "ratio_mean": masked_mean(s, seq_valid),
        "ratio_max": masked_max(s, seq_valid),
        "dual_clip_frac": m.new_zeros(()),
    }
    stats["clip_frac"] = stats["clip_frac_high"] + stats["clip_frac_low"]
    return PolicyLossOutput(loss=loss * m, stats=stats)


@register_policy_loss("ppo")
def _ppo_from_cfg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: GRPOSettings):
    return ppo_clip_loss(logp, old_logp, advantages, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                         clip_c=cfg.dual_clip_c)


@register_policy_loss("gspo")  # settings {clip_low, clip_high} and their check: declared in mmrl.grpo.names
def _gspo_from_cfg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: GRPOSettings):
    s = cfg.loss_settings
    return gspo_loss(logp, old_logp, advantages, mask, clip_low=s["clip_low"], clip_high=s["clip_high"])
