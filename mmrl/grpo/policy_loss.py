"""The GRPO policy loss of one (micro-)batch: policy-gradient term, KL to the reference, entropy bonus.

Token shaping has already run on the whole rollout batch (:mod:`mmrl.grpo.shaping`), so the mask, the
advantages and the per-token weights come in shaped, and the aggregation denominators (global token and
sequence counts) count the tokens the shaper kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from ._util import masked_mean
from .advantages import broadcast_to_tokens
from .aggregate import aggregate
from .kl import kl_penalty
from .losses import get_policy_loss

if TYPE_CHECKING:
    from .config import GRPOConfig


def compute_policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    *,
    ref_logp: Tensor | None = None,
    entropies: Tensor | None = None,
    global_tokens: Tensor | float | None = None,
    global_seqs: Tensor | float | None = None,
    loss_weights: Tensor | None = None,
    kl_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss for one (micro-)batch and detached stats.

    ``logp``/``old_logp``/``ref_logp``/``entropies``/``mask``: ``(B, T)`` over response tokens;
    ``old_logp=None`` means on-policy (``logp.detach()``). ``advantages``: ``(B,)`` or ``(B, T)``, computed
    earlier from rewards. ``global_tokens``/``global_seqs``: the step's totals for exact gradient
    accumulation (:mod:`mmrl.grpo.aggregate`); default: this batch's own counts. Token shaping happened
    before (on the whole rollout batch), so ``advantages``, ``mask`` and the weights are already shaped.
    ``loss_weights``/``kl_weights``: ``(B, T)`` factors on the per-token policy-gradient and KL terms
    (default 1; ARES relaxes the KL inside high-entropy windows this way).

    ``loss = agg(w * pg_loss, mask) + kl_coef * agg(w_kl * k(logp, ref), mask) - entropy_coef * agg(H, mask)``;
    the KL term is skipped when ``kl_in_reward`` (it was folded into the rewards) or ``kl_coef == 0``.
    """
    mask = mask.to(logp.dtype)
    old = logp.detach() if old_logp is None else old_logp.detach()
    adv = broadcast_to_tokens(advantages.detach().to(logp.dtype), mask)

    def agg(x: Tensor, m: Tensor) -> Tensor:
        return aggregate(x, m, cfg.loss_agg, global_tokens=global_tokens, global_seqs=global_seqs,
                         norm_const=cfg.norm_const)

    out = get_policy_loss(cfg.policy_loss)(logp, old, adv, mask, cfg)
    if out.loss.shape != logp.shape:
        raise ValueError(f"policy loss {cfg.policy_loss!r} returned shape {tuple(out.loss.shape)}, "
                         f"expected per-token {tuple(logp.shape)}")
    pg_tok = out.loss if loss_weights is None else out.loss * loss_weights.to(logp.dtype)
    pg_loss = agg(pg_tok, mask)
    loss = pg_loss

    stats: dict[str, Tensor] = {f"pg/{k}": v.detach() for k, v in out.stats.items()}
    stats["pg_loss"] = pg_loss.detach()
    stats["n_tokens"] = mask.sum().detach()
    stats["advantage_mean"] = masked_mean(adv, mask).detach()

    if ref_logp is not None:
        kl_tok = kl_penalty(logp, ref_logp, cfg.kl_estimator, clamp=cfg.kl_clamp, mask=mask)
        stats["kl"] = masked_mean(kl_tok, mask).detach()
        if kl_weights is not None:
            stats["kl_weight_mean"] = masked_mean(kl_weights.to(logp.dtype), mask).detach()
        if cfg.kl_coef > 0 and not cfg.kl_in_reward:
            kl_loss = agg(kl_tok if kl_weights is None else kl_tok * kl_weights.to(logp.dtype), mask)
            loss = loss + cfg.kl_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach()
    elif cfg.kl_coef > 0 and not cfg.kl_in_reward and cfg.kl_estimator != "none":
        raise ValueError("kl_coef > 0 with the KL as a loss term needs ref_logp")

    if entropies is not None:
        stats["entropy"] = masked_mean(entropies.detach(), mask)
        if cfg.entropy_coef:
            ent_loss = agg(entropies.to(logp.dtype), mask)
            loss = loss - cfg.entropy_coef * ent_loss
    elif cfg.entropy_coef:
        raise ValueError("entropy_coef != 0 needs per-token entropies")

    stats["loss"] = loss.detach()
    return loss, stats
