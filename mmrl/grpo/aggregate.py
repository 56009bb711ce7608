"""Loss aggregation: per-token losses ``(B, T)`` + mask -> one scalar.

Modes (``i`` = sequence, ``t`` = token, ``m`` = mask, ``S`` = number of sequences with at least one masked-in
token, ``N = sum m``):

``token-mean``              ``sum_{i,t} m*l / N``                     (DAPO token-level loss, Lite PPO; default)
``seq-mean-token-mean``     ``(1/S) sum_i (sum_t m*l / sum_t m)``     (original GRPO)
``seq-mean-token-sum``      ``(1/S) sum_i sum_t m*l``
``seq-mean-token-sum-norm`` ``(1/S) sum_i (sum_t m*l) / C``           (Dr. GRPO: C is a *constant*, e.g. the
                            max response length; this is the ``masked_sum(..., constant_normalizer=C)``
                            then batch-mean of the authors' code. C must not depend on the micro-batch's
                            padding, or accumulation stops being exact.)

Sequences whose mask is empty (e.g. removed by the overlong filter) contribute nothing and are not counted
in ``S``.

**Gradient accumulation, exactly.** The mean of per-micro-batch means is *not* the mean over the whole
batch when micro-batches hold different numbers of tokens (or non-empty sequences). To make accumulation
over micro-batches equal one big batch, count once for the whole optimizer step and pass the totals::

    counts = global_counts([mb.mask for mb in micro_batches])       # before the first backward
    for mb in micro_batches:
        loss = aggregate(l_mb, mb.mask, mode, global_tokens=counts.tokens, global_seqs=counts.seqs, ...)
        loss.backward()                                            # do NOT divide by len(micro_batches)

Every mode is a sum of per-token or per-sequence terms divided by a batch-wide constant, so with the global
denominators the micro-batch losses add up to the full-batch loss term by term, and so do the gradients.
With data parallelism, all-reduce (sum) the counts across ranks first; DDP then *averages* gradients over
the W ranks, so pass ``tokens/W`` and ``seqs/W`` (or scale the loss by W) to keep the same gradient.
If the mask changes after counting (a token shaper that drops tokens), count after shaping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from .names import AGGREGATIONS


@dataclass(frozen=True)
class Denominators:
    """What an aggregation divides by: global (or local) token and sequence counts, and the constant C."""

    tokens: Tensor | float
    seqs: Tensor | float
    norm_const: float | None = None


class Aggregation(Protocol):
    def __call__(self, loss: Tensor, mask: Tensor, denom: Denominators) -> Tensor: ...


# AGGREGATIONS (mmrl.grpo.names): the aggregations by name; the built-in ones below are declared there too, so
# that a config names them without importing torch


def register_aggregation(name: str, *, overwrite: bool = False) -> Callable[[Aggregation], Aggregation]:
    """Register ``fn(loss (B,T), mask (B,T), denom: Denominators) -> scalar`` under ``name``."""
    return AGGREGATIONS.register(name, overwrite=overwrite)


def get_aggregation(name: str) -> Aggregation:
    """The aggregation registered under ``name``; :class:`~mmrl_common.errors.ConfigError` listing valid names."""
    return AGGREGATIONS.get(name)


@dataclass(frozen=True)
class GlobalCounts:
    tokens: float  # masked-in tokens in the whole optimizer step
    seqs: float  # sequences with at least one masked-in token


def count_tokens_and_seqs(mask: Tensor) -> GlobalCounts:
    m = mask.bool()
    return GlobalCounts(tokens=float(m.sum().item()), seqs=float(m.any(-1).sum().item()))


def global_counts(masks: Iterable[Tensor]) -> GlobalCounts:
    """Totals over all micro-batches of one optimizer step (see the module docstring)."""
    tokens = seqs = 0.0
    for mk in masks:
        c = count_tokens_and_seqs(mk)
        tokens += c.tokens
        seqs += c.seqs
    return GlobalCounts(tokens=tokens, seqs=seqs)


def _safe(x: Tensor | float) -> Tensor | float:
    return x.clamp(min=1) if isinstance(x, Tensor) else max(float(x), 1.0)


@register_aggregation("token-mean")
def token_mean(loss: Tensor, mask: Tensor, denom: Denominators) -> Tensor:
    return (loss * mask).sum() / _safe(denom.tokens)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, denom: Denominators) -> Tensor:
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _safe(denom.seqs)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, denom: Denominators) -> Tensor:
    return (loss * mask).sum() / _safe(denom.seqs)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, denom: Denominators) -> Tensor:
    if denom.norm_const is None or denom.norm_const <= 0:
        raise ValueError("seq-mean-token-sum-norm needs a positive constant norm_const (e.g. max response length)")
    return (loss * mask).sum() / (_safe(denom.seqs) * denom.norm_const)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: Tensor | float | None = None,
    global_seqs: Tensor | float | None = None,
    norm_const: float | None = None,
) -> Tensor:
    """Scalar loss from per-token ``loss`` (B, T); denominators default to this batch's own counts."""
    fn = get_aggregation(mode)
    if loss.shape != mask.shape:
        raise ValueError(f"loss {tuple(loss.shape)} and mask {tuple(mask.shape)} differ")
    m = mask.to(loss.dtype)
    tokens = m.sum() if global_tokens is None else global_tokens
    seqs = (m.sum(-1) > 0).to(loss.dtype).sum() if global_seqs is None else global_seqs
    return fn(loss, m, Denominators(tokens=tokens, seqs=seqs, norm_const=norm_const))

