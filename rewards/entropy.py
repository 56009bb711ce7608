"""Token entropy, window entropy, the high-entropy threshold and high-window-entropy (HWE) counts.

The measures ARES (arXiv 2510.08457) builds on, usable by any method:

* :func:`entropy_from_logits` -- exact per-token entropy ``H_t = -sum_j p_j log p_j`` over the full vocabulary
  (what the HF backend and the training forward pass compute).
* :func:`topk_entropy` -- the approximation from the top-k log-probs only (what a vLLM backend returns, ARES's
  released code uses k = 10): ``-sum_{j<=k} p_j log p_j - p_tail log p_tail`` with
  ``p_tail = max(0, 1 - sum_{j<=k} p_j)`` lumped into one outcome (``tail=False`` drops that term).
  **Error bound:** the tail's own entropy is ``-sum_tail p log p = -p_tail log p_tail + p_tail * H(tail|tail)``
  and ``0 <= H(tail|tail) <= log(V - k)``, so ``0 <= exact - approx <= p_tail * log(V - k)`` (V = vocabulary
  size); without the tail term the shortfall grows by ``-p_tail log p_tail``.
* :func:`window_means` -- window entropy ``Hbar_t = (1/w) sum_{s=t}^{t+w-1} H_s`` for every full window of a
  response (``t = 0 .. L-w``); a response shorter than ``w`` has one window, its mean.
* :func:`rollout_quantile` / :func:`batch_threshold` -- the threshold ``tau``: each rollout's ``q``-quantile
  (0.95) of its window entropies, aggregated over the batch by the mean (the paper's wording) or the median
  (the released code's EMA input). :class:`EntropyThreshold` optionally smooths it across steps
  (``tau <- d*tau + (1-d)*batch value``, d = 0.99 in the code; the value a step uses is the one before its own
  update, as the code does).
* :func:`hwe_windows` -- the HWE count of one response in two modes: ``windows`` (every window whose mean
  exceeds tau; the paper) and ``triggers`` (a reasoning-trigger word followed by ``w`` tokens whose mean
  entropy is at least tau; the code, where the word list is a setting), and the token positions those windows
  cover (ARES relaxes the KL there).
* :func:`branch_points` -- where a response branches (ARES's entropy-triggered exploration): the start of
  each run of windows above tau.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

COUNT_MODES = ("windows", "triggers")
AGGREGATES = ("mean", "median")

DEFAULT_TRIGGERS = (
    "wait", "hmm", "but", "however", "therefore", "thus", "so", "alternatively", "perhaps", "maybe", "let",
    "since", "suppose", "recall", "verify", "check", "actually", "instead", "hence", "because", "first",
    "then", "next", "now", "consider", "assume", "if", "although", "yet", "again",
)
"""Reasoning-trigger words of the ``triggers`` count mode (our own short list; ARES ships a 174-word one)."""


def _wide(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Exact entropy over the last dimension (nats), in float32 or wider."""
    logp = torch.log_softmax(_wide(logits), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def topk_entropy(topk_logprobs: Tensor, *, tail: bool = True) -> Tensor:
    """Entropy approximated from the top-k log-probs ``(..., k)`` (module docstring, with its error bound)."""
    lp = _wide(topk_logprobs)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    if tail:
        p_tail = (1.0 - p.sum(-1)).clamp(min=0.0)
        h = h - torch.where(p_tail > 0, p_tail * p_tail.clamp(min=1e-30).log(), torch.zeros_like(p_tail))
    return h


def topk_error_bound(topk_logprobs: Tensor, vocab_size: int) -> Tensor:
    """The bound ``p_tail * log(V - k)`` on ``exact - topk_entropy(..., tail=True)`` per position."""
    k = topk_logprobs.shape[-1]
    p_tail = (1.0 - _wide(topk_logprobs).exp().sum(-1)).clamp(min=0.0)
    return p_tail * math.log(max(1, vocab_size - k))


def window_means(h: Tensor, w: int) -> Tensor:
    """``(max(1, L-w+1),)`` window entropies of one response's token entropies ``h`` ``(L,)``; empty if L = 0."""
    h = h.float().flatten()
    if w < 1:
        raise ValueError(f"window size must be >= 1, got {w}")
    if h.numel() == 0:
        return h
    if h.numel() < w:
        return h.mean().reshape(1)
    return h.unfold(0, w, 1).mean(-1)


def rollout_quantile(h: Tensor, w: int, q: float = 0.95) -> float | None:
    """The ``q``-quantile (linear interpolation) of one response's window entropies; None when it is empty."""
    means = window_means(h, w)
    if means.numel() == 0:
        return None
    return float(torch.quantile(means, q))


def batch_threshold(responses: Sequence[Tensor], w: int, q: float = 0.95, aggregate: str = "mean") -> float | None:
    """``tau`` of one batch: the mean (or median) over responses of each response's ``q``-quantile."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"threshold aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    vals = [v for v in (rollout_quantile(h, w, q) for h in responses) if v is not None]
    if not vals:
        return None
    t = torch.tensor(vals, dtype=torch.float64)
    # the median of an even count: the mean of the two middle values (numpy's convention)
    return float(t.mean()) if aggregate == "mean" else float(t.quantile(0.5))


class EntropyThreshold:
    """``tau`` across steps: the current batch's value (``ema=None``), or an exponential moving average.

    :meth:`value` is the tau a step uses -- the batch's own value when there is no EMA yet or ``ema`` is None,
    else the average before this step; :meth:`update` folds the step's batch value in (call it once per step).
    """

    def __init__(self, ema: float | None = None):
        if ema is not None and not 0.0 <= ema < 1.0:
            raise ValueError(f"threshold EMA decay must be in [0, 1) or null, got {ema}")
        self.ema = ema
        self.avg: float | None = None

    def value(self, batch_value: float | None) -> float | None:
        if self.ema is None or self.avg is None:
            return batch_value
        return self.avg

    def update(self, batch_value: float | None) -> None:
        if self.ema is None or batch_value is None:
            return
        self.avg = batch_value if self.avg is None else self.ema * self.avg + (1.0 - self.ema) * batch_value

    def state_dict(self) -> dict[str, Any]:
        return {"avg": self.avg}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.avg = state.get("avg")


def normalize_word(token: str) -> str:
    """A token's text as a trigger word: BPE word markers (``Ġ``, ``▁``) and spaces stripped, lower case."""
    return token.replace("Ġ", " ").replace("▁", " ").strip().lower()


def hwe_windows(h: Tensor, tau: float, w: int, mode: str = "windows", *, words: Sequence[str] | None = None,
                triggers: Sequence[str] | frozenset[str] = DEFAULT_TRIGGERS) -> tuple[int, list[int]]:
    """``(count, covered)`` for one response: its HWE count and the sorted token positions inside its
    validated high-entropy windows.

    ``windows``: each window start ``t`` with ``Hbar_t > tau`` counts once and covers ``t .. t+w-1`` (a response
    shorter than ``w``: its one window). ``triggers``: each position ``i`` whose word (``words[i]``, see
    :func:`normalize_word`) is a trigger, with at least ``w`` tokens after it whose mean entropy is ``>= tau``,
    counts once and covers ``i .. i+w``.
    """
    h = h.float().flatten()
    n = h.numel()
    covered: set[int] = set()
    count = 0
    if n == 0:
        return 0, []
    if mode == "windows":
        means = window_means(h, w)
        span = min(w, n)
        for t in (means > tau).nonzero().flatten().tolist():
            count += 1
            covered.update(range(t, t + span))
    elif mode == "triggers":
        if words is None or len(words) != n:
            raise ValueError(f"the triggers count mode needs one word per token ({n}), got "
                             f"{None if words is None else len(words)}")
        trig = {normalize_word(x) for x in triggers}
        for i in range(n - w):
            if normalize_word(words[i]) in trig and float(h[i + 1:i + 1 + w].mean()) >= tau:
                count += 1
                covered.update(range(i, i + w + 1))
    else:
        raise ValueError(f"HWE count mode must be one of {', '.join(COUNT_MODES)}, got {mode!r}")
    return count, sorted(covered)


def branch_points(h: Tensor, tau: float, w: int) -> list[tuple[int, float]]:
    """Where a response branches (ARES's "when to explore"): one point per run of consecutive window starts
    whose window entropy exceeds ``tau`` -- the start ``t`` of the run's highest window (the earliest on a
    tie), where its uncertainty is most sustained; a branch keeps tokens ``0 .. t-1`` and re-samples from
    token ``t`` on -- as ``[(t, peak window entropy), ...]`` in position order. A run of overlapping high
    windows is one region, so a region branches at most once. A response shorter than ``w`` has none."""
    h = h.float().flatten()
    if h.numel() < w:
        return []
    out: list[tuple[int, float]] = []
    best: tuple[int, float] | None = None
    for t, m in enumerate(window_means(h, w).tolist()):
        if m > tau:
            if best is None or m > best[1]:
                best = (t, m)
        elif best is not None:
            out.append(best)
            best = None
    if best is not None:
        out.append(best)
    return out
