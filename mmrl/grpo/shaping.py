"""Extension point: per-token advantage / weight / mask shaping before the policy loss.

A :class:`TokenShaper` receives a :class:`ShapingInput` (per-token advantages, mask, current and old
log-probs, optional token entropies of the current policy, and the config) and returns a
:class:`ShapingOutput`:

* ``advantages`` ``(B, T)`` -- replaces the advantages fed to the policy loss (e.g. ARES entropy shaping);
* ``weights`` ``(B, T)`` -- multiplies the per-token policy loss, normalisation unchanged;
* ``mask`` ``(B, T)`` -- the loss mask used for the policy loss *and its aggregation denominators* (so a
  shaper that drops tokens changes what ``token-mean`` divides by; when you pass global counts, compute
  them after shaping). The KL and entropy terms keep the original mask.

Register a factory with :func:`register_shaper`; :func:`build_shaper` calls it with ``cfg.shaper_kwargs``.
Shipped: ``none`` (identity) and ``top_entropy`` (Beyond the 80/20 rule, arXiv 2506.01939: keep the policy
gradient only on the top-rho fraction of response tokens by entropy, ``k = ceil(rho * #valid tokens)`` over
the tokens given -- the authors' code does this per micro-batch and normalises by the selected tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from mmrl_common.registry import Registry

if TYPE_CHECKING:
    from .config import GRPOConfig


@dataclass
class ShapingInput:
    advantages: Tensor  # (B, T) per-token, zero outside mask
    mask: Tensor  # (B, T) float
    logp: Tensor  # (B, T) current policy (may carry grad: shapers should use it detached)
    old_logp: Tensor  # (B, T)
    entropies: Tensor | None = None  # (B, T) per-token entropy of the current policy, if computed
    cfg: GRPOConfig | None = None


@dataclass
class ShapingOutput:
    advantages: Tensor
    weights: Tensor | None = None
    mask: Tensor | None = None


class TokenShaper(Protocol):
    def __call__(self, inp: ShapingInput) -> ShapingOutput: ...


SHAPERS: Registry[Callable[..., TokenShaper]] = Registry("token shaper", "shaper")


def register_shaper(name: str, *, overwrite: bool = False):
    """Register a factory ``(**kwargs) -> TokenShaper`` (a shaper class works) under ``name``."""
    return SHAPERS.register(name, overwrite=overwrite)


def get_shaper(name: str) -> Callable[..., TokenShaper]:
    """The shaper factory registered under ``name``; :class:`~mmrl_common.errors.ConfigError` listing valid names."""
    return SHAPERS.get(name)


def build_shaper(name: str, **kwargs: Any) -> TokenShaper:
    return get_shaper(name)(**kwargs)


@register_shaper("none")
class IdentityShaper:
    """No-op."""

    def __call__(self, inp: ShapingInput) -> ShapingOutput:
        return ShapingOutput(advantages=inp.advantages)


@register_shaper("top_entropy")
class TopEntropyShaper:
    """Keep only the ``ceil(rho * n_valid)`` highest-entropy valid tokens in the loss mask (ties: arbitrary)."""

    def __init__(self, rho: float = 0.2) -> None:
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"top_entropy rho must be in (0, 1], got {rho}")
        self.rho = rho

    def __call__(self, inp: ShapingInput) -> ShapingOutput:
        if inp.entropies is None:
            raise ValueError("the top_entropy shaper needs per-token entropies (compute them in the forward pass)")
        valid = inp.mask.bool()
        n_valid = int(valid.sum().item())
        k = math.ceil(self.rho * n_valid)
        keep = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if k > 0:
            ent = inp.entropies.detach().float().masked_fill(~valid, -torch.inf).reshape(-1)
            keep[ent.topk(k).indices] = True
        keep = keep.view(valid.shape)
        new_mask = (keep & valid).to(inp.mask.dtype)
        return ShapingOutput(advantages=inp.advantages * new_mask, mask=new_mask)
