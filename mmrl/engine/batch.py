"""The rollout batch: everything about one step's sequences, one object from rollout to update.

Per-sequence fields are lists or ``(N,)`` tensors, N = number of sequences (G consecutive rollouts per
prompt). Per-token fields are ``(N, L)`` tensors aligned with the **right-padded full sequences** (prompt,
completion turns and environment turns; L = the longest sequence): entry ``[i, t]`` belongs to token ``t`` of
``seqs[i]``. They carry meaning where ``loss_mask`` is 1 (the tokens the policy produced and trains on).

Who fills what, in step order (see :meth:`mmrl.engine.trainer.GRPOTrainer.train_step`):

* rollout: ``samples``, ``prompt_index``, ``group_index``, ``seqs``, ``loss_mask``, ``completions``, ``turns``,
  ``env_info``, ``finished``, and -- when the backend records them -- ``rollout_logprobs``, ``entropies``;
* rewards: ``rewards`` (the weighted total) and ``reward_components`` (every component, unweighted);
* reference pass: ``ref_logprobs`` and ``old_logprobs`` (pre-update policy) where the update needs them;
* advantages: ``advantages`` (``(N,)`` per sequence, or ``(N, L)`` per token after shaping);
* token shaping: ``loss_mask``, ``token_loss_weights``, ``token_kl_weights`` (and advantages);
* methods: ``seq_kl_weights``/``seq_loss_weights`` and anything in ``extra`` (a free dict of per-sequence
  values: lists or ``(N, ...)`` tensors), at any hook.

The loss uses ``kl_weights() = seq_kl_weights[:, None] * token_kl_weights`` on the KL term and
``loss_weights()`` on the policy-gradient term.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mmrl.model import TokenSeq
from mmrl.model.packing import token_budget_chunks
from mmrl.model.shared_prefix import prefix_plan

TOKEN_FIELDS = ("loss_mask", "rollout_logprobs", "entropies", "advantages", "ref_logprobs", "old_logprobs",
                "token_kl_weights", "token_loss_weights")


def _pad_cols(t: Tensor, width: int, value: float = 0.0) -> Tensor:
    if t.shape[1] >= width:
        return t
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, pad], dim=1)


def token_tensor(rows: Sequence[Sequence[float]], masks: Sequence[Sequence[int]], width: int) -> Tensor:
    """``(N, width)`` float tensor from per-row values given only at the mask-1 positions of each row."""
    out = torch.zeros(len(rows), width)
    for i, (vals, mask) in enumerate(zip(rows, masks)):
        cols = [t for t, m in enumerate(mask) if m]
        if vals and len(vals) == len(cols):
            out[i, cols] = torch.tensor(list(vals), dtype=torch.float32)
    return out


@dataclass
class RolloutBatch:
    samples: list[Any]
    prompt_index: list[int]
    """Per sequence: the index the sampler drew (into the current training pool)."""
    group_index: Tensor
    """(N,) long: 0..n_groups-1, consecutive groups."""
    seqs: list[TokenSeq]
    completions: list[str]
    """The final assistant turn of each episode (what answer rewards read)."""
    turns: list[list[str]]
    env_info: list[dict[str, Any]]
    finished: Tensor
    """(N,) bool: the last turn ended on EOS or a stop string (not cut by max_new_tokens)."""
    loss_mask: Tensor
    """(N, L) float: tokens the policy produced and the update trains on."""
    rollout_logprobs: Tensor | None = None
    entropies: Tensor | None = None
    rewards: Tensor | None = None
    reward_components: dict[str, Tensor] = field(default_factory=dict)
    advantages: Tensor | None = None
    ref_logprobs: Tensor | None = None
    old_logprobs: Tensor | None = None
    seq_kl_weights: Tensor | None = None
    token_kl_weights: Tensor | None = None
    seq_loss_weights: Tensor | None = None
    token_loss_weights: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, width = self.loss_mask.shape
        if self.seq_kl_weights is None:
            self.seq_kl_weights = torch.ones(n)
        if self.seq_loss_weights is None:
            self.seq_loss_weights = torch.ones(n)
        if self.token_kl_weights is None:
            self.token_kl_weights = torch.ones(n, width)
        if self.token_loss_weights is None:
            self.token_loss_weights = torch.ones(n, width)

    # ------------------------------------------------------------------------------------ construction
    @classmethod
    def from_episodes(cls, episodes: Sequence[Any], prompt_index: Sequence[int], group_size: int) -> RolloutBatch:
        """A batch from :class:`mmrl.engine.rollout.Episode` objects (``group_size`` consecutive ones per prompt)."""
        n = len(episodes)
        width = max((len(ep.seq) for ep in episodes), default=0)
        masks = [ep.seq.loss_mask for ep in episodes]
        loss_mask = torch.zeros(n, width)
        for i, m in enumerate(masks):
            loss_mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
        logps = token_tensor([ep.logprobs for ep in episodes], masks, width) \
            if n and all(ep.logprobs for ep in episodes) else None
        ents = token_tensor([ep.entropies for ep in episodes], masks, width) \
            if n and all(ep.entropies for ep in episodes) else None
        return cls(
            samples=[ep.sample for ep in episodes],
            prompt_index=[prompt_index[i // group_size] for i in range(n)],
            group_index=torch.arange(n) // group_size,
            seqs=[ep.seq for ep in episodes],
            completions=[ep.completion for ep in episodes],
            turns=[list(ep.turns) for ep in episodes],
            env_info=[dict(ep.env.info) if ep.env is not None else {} for ep in episodes],
            finished=torch.tensor([bool(ep.finished) for ep in episodes], dtype=torch.bool),
            loss_mask=loss_mask, rollout_logprobs=logps, entropies=ents)

    # ------------------------------------------------------------------------------------ shape
    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def width(self) -> int:
        return int(self.loss_mask.shape[1])

    @property
    def n_groups(self) -> int:
        return int(self.group_index.max()) + 1 if len(self) else 0

    @property
    def response_length(self) -> Tensor:
        """(N,) tokens the policy produced in each episode (all assistant turns)."""
        return torch.tensor([sum(s.loss_mask) for s in self.seqs], dtype=torch.long)

    def groups(self) -> Iterator[list[int]]:
        """Row indices of each group, in group order."""
        for g in range(self.n_groups):
            yield (self.group_index == g).nonzero().flatten().tolist()

    def minibatches(self, size: int | None) -> list[list[int]]:
        """The rows of each optimizer step's mini-batch of about ``size`` rows (None: the whole batch), in the
        order they are trained.

        The groups are dealt round-robin over ``K = ceil(rows / size)`` mini-batches: mini-batch ``j`` holds
        the groups ``g`` with ``g mod K == j`` (each group's rows together and in order), so mini-batches
        differ by at most a group. Data-parallel ranks roll out contiguous shares of the groups, and a
        contiguous run of groups holds as many of each residue as any other (within one), so every rank
        trains an equal share (within a group) of every optimizer step. The rule reads only the group index,
        never the number of ranks: one process and N ranks train the same rows in the same optimizer steps.
        A mini-batch smaller than a group (``K`` at least the number of groups) is the plain cut of ``size``
        consecutive rows."""
        n = len(self)
        if not size or size >= n:
            return [list(range(n))] if n else []
        k = -(-n // size)
        groups = list(self.groups())
        if k >= len(groups):
            return [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        return [[r for g in range(j, len(groups), k) for r in groups[g]] for j in range(k)]

    def group_rows(self) -> list[int]:
        """The first row of each group (one row per prompt)."""
        return [rows[0] for rows in self.groups()]

    def group_spread(self, values: Sequence[float | None]) -> float | None:
        """Mean within-group population standard deviation of a per-sequence value, over the groups with at
        least one applicable (not None) value that is not 0 (None when there is no such group)."""
        stds = []
        for rows in self.groups():
            vals = [float(values[i]) for i in rows if values[i] is not None]
            if any(v != 0 for v in vals):
                stds.append(float(torch.tensor(vals).std(unbiased=False)))
        return sum(stds) / len(stds) if stds else None

    def group_mean(self, values: Tensor) -> Tensor:
        """(n_groups,) mean of a per-sequence tensor within each group."""
        values = values.float()
        sums = torch.zeros(self.n_groups).index_add_(0, self.group_index, values)
        counts = torch.zeros(self.n_groups).index_add_(0, self.group_index, torch.ones_like(values))
        return sums / counts.clamp(min=1)

    def component(self, name: str) -> Tensor:
        """One reward component ``(N,)``; a clear error naming the components there are."""
        if name not in self.reward_components:
            have = ", ".join(sorted(self.reward_components)) or "(none yet: rewards run after the rollout hook)"
            raise KeyError(f"no reward component {name!r} in this batch; it has: {have}")
        return self.reward_components[name]

    def kl_weights(self) -> Tensor:
        return self.seq_kl_weights[:, None] * self.token_kl_weights

    def loss_weights(self) -> Tensor:
        return self.seq_loss_weights[:, None] * self.token_loss_weights

    # ------------------------------------------------------------------------------------ slicing
    def select(self, rows: Sequence[int]) -> RolloutBatch:
        """A new batch with these rows (group ids renumbered densely, in order of first appearance)."""
        rows = list(rows)
        idx = torch.tensor(rows, dtype=torch.long)
        n = len(self)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            values[f.name] = _take(v, rows, idx, n)
        if rows:
            values["group_index"] = torch.unique_consecutive(values["group_index"], return_inverse=True)[1]
        return RolloutBatch(**values)

    @classmethod
    def concat(cls, batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """One batch from several (e.g. generation rounds of dynamic sampling); group ids are offset."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("nothing to concatenate")
        if len(batches) == 1:
            return batches[0]
        width = max(b.width for b in batches)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            parts = [getattr(b, f.name) for b in batches]
            if f.name == "group_index":
                offset, out = 0, []
                for b in batches:
                    out.append(b.group_index + offset)
                    offset += b.n_groups
                values[f.name] = torch.cat(out)
            else:
                values[f.name] = _join(f.name, parts, width)
        return cls(**values)

    def micro_batch(self, rows: Sequence[int]) -> tuple[list[TokenSeq], int]:
        """The sequences of ``rows`` and their padded width (``policy.pad`` pads to the longest of them)."""
        seqs = [self.seqs[i] for i in rows]
        return seqs, max(len(s) for s in seqs)

    def tokens(self, name: str, rows: Sequence[int], width: int) -> Tensor | None:
        """A per-token field for a micro-batch: rows ``rows``, the first ``width`` columns."""
        t = getattr(self, name)
        t = t() if callable(t) else t  # kl_weights() / loss_weights() combine two fields
        if t is None:
            return None
        return t[torch.tensor(list(rows), dtype=torch.long), :width]


def _take(v: Any, rows: list[int], idx: Tensor, n: int) -> Any:
    if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == n:
        return v[idx]
    if isinstance(v, list) and len(v) == n:
        return [v[i] for i in rows]
    if isinstance(v, dict):
        return {k: _take(x, rows, idx, n) for k, x in v.items()}
    return v


def _join(name: str, parts: list[Any], width: int) -> Any:
    first = parts[0]
    if first is None or any(p is None for p in parts):
        return None
    if isinstance(first, Tensor):
        if name in TOKEN_FIELDS and first.dim() == 2:
            fill = 1.0 if name in ("token_kl_weights", "token_loss_weights") else 0.0
            return torch.cat([_pad_cols(p, width, fill) for p in parts])
        return torch.cat(parts)
    if isinstance(first, list):
        return [x for p in parts for x in p]
    if isinstance(first, dict):
        keys = [k for k in first if all(k in p for p in parts)]
        return {k: _join(k, [p[k] for p in parts], width) for k in keys}
    return first


# ------------------------------------------------------------------------------------------ the update's plan
def shared_prefixes(batch: RolloutBatch, rows: Sequence[int]) -> list[int]:
    """Each row's shared prefix in a log-prob pass that holds its whole group: the tokens of the group's common
    prompt that the shared-prefix pass runs once for all of them (:func:`mmrl.model.shared_prefix.prefix_plan`
    over the group's rows, in order; 0 where the rows run whole: a group of one, vision tokens after the common
    part)."""
    rows = list(rows)
    by_group: dict[int, list[int]] = {}
    for i in rows:
        by_group.setdefault(int(batch.group_index[i]), []).append(i)
    out: dict[int, int] = {}
    for members in by_group.values():
        plan = prefix_plan([batch.seqs[i] for i in members])
        for part, n in plan or [(list(range(len(members))), 0)]:
            for j in part:
                out[members[j]] = n
    return [out[i] for i in rows]


def micro_batch_rows(rows: Sequence[int], train: Any, batch: RolloutBatch | None = None) -> list[list[int]]:
    """Micro-batches of ``rows``, in order: ``train.micro_batch_size`` rows each or, with
    ``train.micro_batch_tokens`` and the ``batch`` the rows index, by that token budget: rows join while the
    tokens their pass computes stay within it; with ``train.shared_prefix`` (on) a group's shared prompt counts
    once (:func:`shared_prefixes`), every row's tokens after it once each; a row longer than the budget is a
    micro-batch alone; a group starts a new micro-batch rather than be split where it fits one whole
    (:func:`mmrl.model.packing.token_budget_chunks`). Consecutive rows stay together, so a group's rows meet in one
    micro-batch wherever they fit (the shared-prefix forward needs them side by side). The loss needs no change
    for either: each micro-batch's terms are normalised by the whole mini-batch's counts (``global_counts``), so
    their sum is the same however the rows are split."""
    rows = list(rows)
    budget = int(getattr(train, "micro_batch_tokens", 0) or 0)
    if budget > 0 and batch is not None:
        groups = [int(batch.group_index[i]) for i in rows]
        shared = bool(getattr(train, "shared_prefix", True))
        return token_budget_chunks(rows, [len(batch.seqs[i]) for i in rows], budget, groups=groups,
                                   prefixes=shared_prefixes(batch, rows) if shared else None)
    mb = max(1, int(train.micro_batch_size))
    return [rows[i:i + mb] for i in range(0, len(rows), mb)]


def update_plan(batch: RolloutBatch, cfg: Any) -> list[list[list[int]]]:
    """The update of ``batch`` under the run config ``cfg``, in order: one entry per optimizer step (every PPO
    epoch's mini-batches, :meth:`RolloutBatch.minibatches`), each the rows of its micro-batches
    (:func:`micro_batch_rows`). The trainer runs this plan (each rank its own rows of each micro-batch); plug-ins
    read it through ``StepContext.update_plan``."""
    minis = batch.minibatches(cfg.grpo.ppo_mini_batch_size)
    return [micro_batch_rows(mini, cfg.train, batch) for _ in range(max(1, int(cfg.grpo.ppo_epochs)))
            for mini in minis]

