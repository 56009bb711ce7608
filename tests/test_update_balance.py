"""Every rank trains in every optimizer step: the mini-batch rule (:meth:`RolloutBatch.minibatches`) deals the
groups round-robin, so each rank's contiguous share of the rollouts is spread over all of the step's
mini-batches, by a rule that reads the group index alone (one process and N ranks train the same rows in the
same optimizer steps). ``balance_stats`` reports what the ranks did. The two-rank runs that check the same
on real ranks are in tests/test_distributed.py."""

from __future__ import annotations

import torch

from mmrl.engine.batch import RolloutBatch
from mmrl.engine.distributed import World
from mmrl.engine.trainer import balance_stats
from mmrl.model import TokenSeq


def batch_of(group_sizes: list[int]) -> RolloutBatch:
    """A rollout batch whose groups have these sizes (rows in group order, as rollouts produce them)."""
    index = torch.cat([torch.full((n,), g) for g, n in enumerate(group_sizes)])
    n = len(index)
    return RolloutBatch(samples=[None] * n, prompt_index=index.tolist(), group_index=index,
                        seqs=[TokenSeq(ids=[1, 2], mm_types=[0, 0]) for _ in range(n)], completions=[""] * n,
                        turns=[[] for _ in range(n)], env_info=[{} for _ in range(n)],
                        finished=torch.ones(n, dtype=torch.bool), loss_mask=torch.ones(n, 2))


def owners(batch: RolloutBatch, ranks: int) -> list[int]:
    """The rank that rolled out each row: contiguous shares of the groups, as the trainer deals prompts."""
    out = [0] * len(batch)
    for r in range(ranks):
        for g in World(rank=r, size=ranks).share(batch.n_groups):
            for i in (batch.group_index == g).nonzero().flatten().tolist():
                out[i] = r
    return out


def per_rank_groups(batch: RolloutBatch, mini: list[int], ranks: int) -> list[int]:
    own = owners(batch, ranks)
    return [len({int(batch.group_index[i]) for i in mini if own[i] == r}) for r in range(ranks)]


def test_the_readme_eight_gpu_batch_gives_every_rank_one_group_of_every_optimizer_step() -> None:
    # 64 prompts x 8 answers, ppo_mini_batch_size 64 rows, 8 ranks of 8 prompts each
    batch = batch_of([8] * 64)
    minis = batch.minibatches(64)
    assert len(minis) == 8 and all(len(m) == 64 for m in minis)
    assert sorted(r for m in minis for r in m) == list(range(512))  # every row once
    for m in minis:
        assert per_rank_groups(batch, m, 8) == [1] * 8
        # a group's rows stay together and in order (the shared-prefix pass needs them side by side)
        for k in range(0, 64, 8):
            assert m[k:k + 8] == list(range(m[k], m[k] + 8))
    # the same rows in the same optimizer steps whatever the number of ranks: the rule never sees it
    for ranks in (1, 2, 4, 8):
        for m in minis:
            assert sum(per_rank_groups(batch, m, ranks)) == 8


def test_uneven_batches_stay_balanced_within_a_group() -> None:
    # dynamic sampling kept 61 groups; 6 ranks hold 11, 10, 10, 10, 10, 10 of them
    batch = batch_of([8] * 61)
    minis = batch.minibatches(64)
    assert len(minis) == 8 and sorted(r for m in minis for r in m) == list(range(61 * 8))
    assert {len(m) for m in minis} == {56, 64}  # 8 mini-batches of 61 groups: 8 or 7 groups each
    for m in minis:
        counts = per_rank_groups(batch, m, 6)
        assert min(counts) >= 1 and max(counts) - min(counts) <= 1, counts
    # groups of different sizes (a skipped sample leaves a short group): still every row once, groups whole
    ragged = batch_of([8, 8, 5, 8, 8, 8, 3, 8])
    minis = ragged.minibatches(16)
    assert len(minis) == 4 and sorted(r for m in minis for r in m) == list(range(len(ragged)))
    home = {int(ragged.group_index[i]): j for j, m in enumerate(minis) for i in m}
    assert all(home[int(ragged.group_index[i])] == j for j, m in enumerate(minis) for i in m)  # groups whole


def test_a_mini_batch_smaller_than_a_group_is_the_plain_contiguous_cut() -> None:
    batch = batch_of([8] * 4)
    assert batch.minibatches(4) == [list(range(i, i + 4)) for i in range(0, 32, 4)]
    assert batch.minibatches(None) == [list(range(32))] == batch.minibatches(32) == batch.minibatches(100)


def test_balance_stats() -> None:
    # two ranks, two optimizer steps: the old contiguous mini-batches gave each step to one rank
    assert balance_stats([[100, 0], [0, 100]]) == {"balance/tokens_max_over_mean": 2.0,
                                                   "balance/idle_rank_steps": 2}
    even = balance_stats([[100, 90], [100, 110]])
    assert even["balance/idle_rank_steps"] == 0
    assert abs(even["balance/tokens_max_over_mean"] - (1.0 + 110 / 100) / 2) < 1e-12
    assert balance_stats([[5, 7]])["balance/tokens_max_over_mean"] == 1.0  # one process: even by definition
    assert balance_stats([[0], [0]])["balance/idle_rank_steps"] == 0  # nothing trained by anyone
