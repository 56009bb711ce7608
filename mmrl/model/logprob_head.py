"""Log-probabilities of target tokens through the LM head, a chunk of rows at a time.

:func:`token_logprobs` computes ``log_softmax(lm_head(h) / T)[target]`` (and the entropy when asked for)
``chunk`` rows at a time, each chunk under non-reentrant activation checkpointing, so that forward and backward
hold one chunk's full-vocabulary tensors at a time; the values and gradients equal those of the full
log-softmax (:func:`full_logprobs`, kept as the reference) within fp32 round-off.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def token_logprobs(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                    *, with_entropy: bool, entropy_grad: bool, chunk: int, calls: int = 0,
                    recompute: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) fp32 log-probs of ``targets`` (and entropies) under ``lm_head(hidden) / temperature``.

    ``chunk`` > 0: ``chunk`` rows at a time, each under non-reentrant activation checkpointing, so forward
    and backward hold one chunk's full-vocabulary tensors at a time; 0: the full log-softmax at once.
    ``calls``: call the LM head at least this many times, the extra calls on one dummy row whose result
    joins the output times 0 (ZeRO-3: every rank makes the same calls, forward and backward). ``recompute``
    False: no checkpointing, each chunk keeps its logits for backward (more memory).
    """
    if chunk <= 0:
        return full_logprobs(lm_head, hidden, targets, temperature, with_entropy=with_entropy,
                              entropy_grad=entropy_grad)
    graph = recompute and torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    logps, ents = [], []
    pieces = list(zip(hidden.split(chunk), targets.split(chunk)))
    anchor = None
    for _ in range(max(0, calls - len(pieces))):
        # in the graph of ``hidden`` (when it has one), so the LM head's backward runs for it too
        h = hidden.new_zeros(1, hidden.shape[-1]) + hidden.sum() * 0.0
        fn = _ChunkLogprobs(lm_head, temperature, False)
        out = checkpoint(fn, h, targets.new_zeros(1), use_reentrant=False) if graph else fn(h, targets.new_zeros(1))
        anchor = out.sum() * 0.0 if anchor is None else anchor + out.sum() * 0.0
    for h, t in pieces:
        if with_entropy and entropy_grad:
            fn: Any = functools.partial(_chunk_logprobs_with_entropy, lm_head, temperature=temperature)
        else:
            fn = _ChunkLogprobs(lm_head, temperature, with_entropy)
        out = checkpoint(fn, h, t, use_reentrant=False) if graph else fn(h, t)
        if isinstance(fn, _ChunkLogprobs):
            logps.append(out)
            ents.append(fn.entropy)
        else:
            logps.append(out[0])
            ents.append(out[1])
    if not logps:  # nothing masked
        empty = hidden.new_zeros(0, dtype=torch.float32)
        if anchor is not None:
            empty = empty + anchor
        return empty, (hidden.new_zeros(0, dtype=torch.float32) if with_entropy else None)
    lp = torch.cat(logps)
    return (lp if anchor is None else lp + anchor), (torch.cat(ents) if with_entropy else None)


def full_logprobs(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   *, with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unchunked path: the full (N, vocabulary) fp32 log-softmax, kept for backward (the reference)."""
    logits = lm_head(hidden).float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)
    return logps, ent


def _chunk_logprobs_with_entropy(lm_head: torch.nn.Module, h: torch.Tensor, t: torch.Tensor, *,
                                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, entropies with gradient: the plain log-softmax graph (recomputed per chunk in backward)."""
    logp_all = F.log_softmax(lm_head(h).float() / temperature, dim=-1)
    return logp_all.gather(-1, t[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


class _ChunkLogprobs:
    """One chunk's log-probs of its targets, the function :func:`torch.utils.checkpoint.checkpoint` runs.

    The entropy (no gradient) is taken on the first call only and kept in :attr:`entropy`: the second call,
    checkpointing's recomputation in backward, needs the logits alone.
    """

    def __init__(self, lm_head: torch.nn.Module, temperature: float, with_entropy: bool) -> None:
        self.lm_head, self.temperature, self.with_entropy = lm_head, temperature, with_entropy
        self.entropy: torch.Tensor | None = None

    def __call__(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        want = self.with_entropy and self.entropy is None
        logp, ent = _TargetLogprob.apply(self.lm_head(h), t, self.temperature, want)
        if want:
            self.entropy = ent
        return logp


_ROW_BLOCK = 128  # rows per temporary inside one chunk (128 x 152k fp32 = 78 MB)


class _TargetLogprob(torch.autograd.Function):
    """``log_softmax(logits / T)[target]`` (fp32) keeping only the logits (in their own dtype) and the
    logsumexp for backward, where the gradient ``(onehot - softmax) * g / T`` is built in one fp32 buffer.
    The second output is the entropy when asked for (else empty), without gradient."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = logits.float() / temperature  # a new fp32 tensor: the logits stay as they are
        # logsumexp and the entropy a few rows at a time: their temporaries are never a third chunk-sized
        # tensor (each row's value is the same either way)
        lse = torch.cat([torch.logsumexp(rows, dim=-1) for rows in logp_all.split(_ROW_BLOCK)])
        logp_all.sub_(lse[:, None])
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        ent = (torch.cat([-(rows.exp().mul_(rows)).sum(-1) for rows in logp_all.split(_ROW_BLOCK)])
               if with_entropy else logp.new_zeros(0))
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[torch.Tensor, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        temperature = ctx.temperature
        out = (logits.float() / temperature).sub_(lse[:, None]).exp_()  # softmax
        out.mul_(-grad[:, None]).scatter_add_(-1, targets[:, None], grad[:, None]).div_(temperature)
        return out.to(logits.dtype), None, None, None

