"""Extension point: per-token advantage / weight / mask / KL-weight shaping before the policy loss.

A :class:`TokenShaper` runs **once per step on the whole rollout batch**, after the advantages and before
the update. It receives a :class:`ShapingInput` (per-token advantages, mask, the pre-update log-probs and
entropies when it asks for them, the group ids, rewards and reward components, the batch's extra fields and
the config) and returns a :class:`ShapingOutput`:

* ``advantages`` ``(N, L)`` -- replaces the advantages fed to the policy loss (e.g. ARES entropy shaping);
* ``weights`` ``(N, L)`` -- multiplies the per-token policy loss, normalisation unchanged;
* ``mask`` ``(N, L)`` -- the tokens the policy-gradient term trains on. The step's token and sequence
  counts (the aggregation denominators) are taken after shaping, so the loss normalises by the tokens the
  shaper kept, exactly, however the batch is split into micro-batches;
* ``kl_weights`` ``(N, L)`` -- multiplies the per-token KL term (a per-token KL coefficient).

A shaper that needs the pre-update policy's per-token entropies or log-probs says so with a class attribute
``requires = ("entropies",)`` (or ``"logprobs"``); the trainer then computes them in one gradient-free
pass. Register a factory with :func:`register_shaper`; :func:`build_shaper` calls it with
``cfg.shaper_kwargs``. Shipped: ``none`` (identity) and ``top_entropy`` (Beyond the 80/20 rule, arXiv
2506.01939: keep the policy gradient only on the top-rho fraction of response tokens by entropy,
``k = ceil(rho * #valid tokens)`` over the step's tokens; the authors' code selects per micro-batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from .names import SHAPERS

# ``cfg`` below is the run's mmrl.grpo.config.GRPOConfig (not imported: that module imports this one)
GRPOSettings = Any


@dataclass
class ShapingInput:
    advantages: Tensor  # (N, L) per-token, zero outside mask
    mask: Tensor  # (N, L) float
    logp: Tensor | None = None  # (N, L) pre-update policy log-probs, when the shaper requires them
    old_logp: Tensor | None = None  # (N, L) behaviour policy log-probs (equal to logp on-policy)
    entropies: Tensor | None = None  # (N, L) per-token entropy of the pre-update policy, when required
    cfg: GRPOSettings | None = None
    group_index: Tensor | None = None  # (N,) long, 0..n_groups-1
    rewards: Tensor | None = None  # (N,) total rewards
    components: dict[str, Tensor] = field(default_factory=dict)  # (N,) each, unweighted
    extra: dict[str, Any] = field(default_factory=dict)  # the batch's per-sequence method fields
    batch: Any = None  # the whole mmrl.batch.RolloutBatch, for anything else


@dataclass
class ShapingOutput:
    advantages: Tensor
    weights: Tensor | None = None
    mask: Tensor | None = None
    kl_weights: Tensor | None = None


class TokenShaper(Protocol):
    requires: tuple[str, ...]

    def __call__(self, inp: ShapingInput) -> ShapingOutput: ...


# SHAPERS (mmrl.grpo.names): the shaper factories by name; the built-in ones below are declared there too, so
# that a config names them without importing torch


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

    requires: tuple[str, ...] = ()

    def __call__(self, inp: ShapingInput) -> ShapingOutput:
        return ShapingOutput(advantages=inp.advantages)


@register_shaper("top_entropy")
class TopEntropyShaper:
    """Keep only the ``ceil(rho * n_valid)`` highest-entropy valid tokens in the loss mask (ties: arbitrary)."""

    requires: tuple[str, ...] = ("entropies",)

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
