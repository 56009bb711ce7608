"""Small masked-tensor helpers shared by the GRPO modules."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask``; 0 (not NaN) when the mask is empty."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over ``mask``; 0 when the mask is empty. No host round-trip (no boolean indexing, no
    ``bool()``): the update calls it in every micro-batch."""
    m = mask.bool()
    lowest = x.new_full((), float("-inf"))
    return torch.where(m.any(), torch.where(m, x, lowest).amax(), x.new_zeros(()))
