"""Small masked-tensor helpers shared by the GRPO modules."""

from __future__ import annotations

from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask``; 0 (not NaN) when the mask is empty."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over ``mask``; 0 when the mask is empty."""
    m = mask.bool()
    if not bool(m.any()):
        return x.new_zeros(())
    return x[m].max()
