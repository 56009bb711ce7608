"""DAPO filters: dynamic sampling (drop zero-variance groups, refill) and overlong handling.

* :func:`informative_groups` / :func:`dynamic_sampling_mask` -- a group whose rewards are all equal (within
  ``tol``: ``max - min <= tol``) has zero advantage under every estimator and only costs compute; drop it.
* :class:`GroupAccumulator` -- gathers the kept groups of successive generation rounds until
  ``target_groups`` are reached or ``max_draws`` *extra* rounds (after the first) are spent; pure logic, the
  trainer supplies the groups (or a ``draw`` callable to :func:`accumulate_groups`). The DAPO recipe's
  ``max_num_gen_batches = 10`` corresponds to ``max_draws = 9``.
* :func:`overlong_keep_mask` -- overlong filtering: sequences that reached ``max_length`` without EOS are
  truncated, their loss mask is zeroed (TRL ``mask_truncated_completions``).
* :func:`soft_overlong_penalty` -- DAPO soft overlong punishment added to the reward, with
  ``L_max`` = max response length and ``L_cache`` = buffer::

      0                                   if L <= L_max - L_cache
      ((L_max - L_cache) - L) / L_cache * f  if L_max - L_cache < L <= L_max   (linear, reaches -f at L_max)
      -f                                  if L > L_max                      (paper: -1, f = 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor

from .advantages import group_inverse

T = TypeVar("T")


def informative_groups(
    rewards: Tensor, *, group_size: int | None = None, group_index: Tensor | None = None, tol: float = 1e-6
) -> Tensor:
    """Per-group bool ``(n_groups,)``: True where the rewards are not all equal (``max - min > tol``).

    Group order is that of the dense ids (contiguous groups: group g = rows ``[g*G, (g+1)*G)``; with labels:
    sorted unique labels).
    """
    rewards = torch.as_tensor(rewards).detach().float()
    inv = group_inverse(rewards.numel(), group_size=group_size, group_index=group_index, device=rewards.device)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    hi = torch.full((n_groups,), -torch.inf, device=rewards.device).scatter_reduce(0, inv, rewards, "amax")
    lo = torch.full((n_groups,), torch.inf, device=rewards.device).scatter_reduce(0, inv, rewards, "amin")
    return (hi - lo) > tol


def dynamic_sampling_mask(
    rewards: Tensor, *, group_size: int | None = None, group_index: Tensor | None = None, tol: float = 1e-6
) -> Tensor:
    """Per-sequence bool ``(N,)`` keep-mask: False for every member of an all-equal group."""
    rewards = torch.as_tensor(rewards)
    keep = informative_groups(rewards, group_size=group_size, group_index=group_index, tol=tol)
    inv = group_inverse(rewards.numel(), group_size=group_size, group_index=group_index, device=rewards.device)
    return keep[inv]


def _group_informative(rewards: Tensor | Sequence[float], tol: float,
                       band: tuple[float, float] | None = None) -> bool:
    """Whether dynamic sampling keeps a group: its rewards not all equal (DAPO), or with ``band`` = (low, high)
    its mean reward strictly inside (low, high), equal rewards or not (EasyR1's and verl's online filtering:
    ``filter_low < mean < filter_high``)."""
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if r.numel() == 0:
        return False
    if band is not None:
        return band[0] < float(r.double().mean()) < band[1]
    return bool(informative_groups(r, group_size=r.numel(), tol=tol)[0])


@dataclass
class GroupAccumulator(Generic[T]):
    """Collects informative groups over generation rounds, holding at most ``target_groups`` of them.

    Usage::

        acc = GroupAccumulator(target_groups=B, max_draws=cfg.max_draws)
        acc.add(groups, rewards)            # the normal generation round
        while acc.needs_more():             # target not reached and extra rounds left
            acc.add(*draw_more())
        kept = acc.groups                   # <= B groups, in arrival order

    ``groups`` are opaque payloads (whatever the trainer keeps per prompt); ``rewards[k]`` holds the G rewards
    of ``groups[k]``. If the rounds run out first, ``reached_target`` is False and the trainer decides (train
    on fewer groups, or raise as verl does).
    """

    target_groups: int
    max_draws: int = 9
    tol: float = 1e-6
    band: tuple[float, float] | None = None
    """Keep a group when its mean reward is strictly inside (low, high) instead (:func:`_group_informative`)."""
    groups: list[T] = field(default_factory=list)
    rounds: int = 0
    seen: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        if self.target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {self.target_groups}")
        if self.max_draws < 0:
            raise ValueError(f"max_draws must be >= 0, got {self.max_draws}")

    @property
    def reached_target(self) -> bool:
        return len(self.groups) >= self.target_groups

    @property
    def extra_draws(self) -> int:
        return max(self.rounds - 1, 0)

    def needs_more(self) -> bool:
        """True while the target is not reached and another (extra) round is allowed."""
        return not self.reached_target and (self.rounds == 0 or self.extra_draws < self.max_draws)

    def add(self, groups: Sequence[T], rewards: Sequence[Tensor | Sequence[float]]) -> int:
        """Add one generation round; returns how many of its groups were kept."""
        if len(groups) != len(rewards):
            raise ValueError(f"{len(groups)} groups but {len(rewards)} reward rows")
        if self.rounds > 0 and self.extra_draws >= self.max_draws:
            raise RuntimeError(f"max_draws={self.max_draws} extra generation rounds already used")
        self.rounds += 1
        kept = 0
        for g, r in zip(groups, rewards):
            self.seen += 1
            if not _group_informative(r, self.tol, self.band):
                self.dropped += 1
            elif len(self.groups) < self.target_groups:
                self.groups.append(g)
                kept += 1
        return kept

    def stats(self) -> dict[str, float]:
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/groups_seen": float(self.seen),
            "dynamic_sampling/groups_dropped": float(self.dropped),
            "dynamic_sampling/groups_kept": float(len(self.groups)),
            "dynamic_sampling/reached_target": float(self.reached_target),
        }


def accumulate_groups(
    draw: Callable[[], tuple[Sequence[T], Sequence[Tensor | Sequence[float]]]],
    target_groups: int,
    max_draws: int = 9,
    tol: float = 1e-6,
) -> GroupAccumulator[T]:
    """Call ``draw() -> (groups, rewards)`` once, then up to ``max_draws`` more times until the target."""
    acc: GroupAccumulator[T] = GroupAccumulator(target_groups=target_groups, max_draws=max_draws, tol=tol)
    while acc.needs_more():
        acc.add(*draw())
    return acc


def overlong_keep_mask(lengths: Tensor, ended_with_eos: Tensor, max_length: int) -> Tensor:
    """Per-sequence bool: False for truncated sequences (``length >= max_length`` and no EOS).

    A sequence that stopped early without EOS (stop string, environment turn end) is kept.
    Multiply into the loss mask: ``mask * keep[:, None]``.
    """
    lengths = torch.as_tensor(lengths)
    eos = torch.as_tensor(ended_with_eos, dtype=torch.bool, device=lengths.device)
    return ~((lengths >= max_length) & ~eos)


def soft_overlong_penalty(lengths: Tensor, max_length: int, cache_length: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment per sequence (module docstring); ``0 < cache_length <= max_length``."""
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length ({cache_length}) <= max_length ({max_length})")
    if factor < 0:
        raise ValueError(f"overlong penalty factor must be >= 0, got {factor}")
    lengths = torch.as_tensor(lengths).float()
    start = max_length - cache_length
    pen = (start - lengths) / cache_length * factor
    return pen.clamp(min=-factor, max=0.0)
