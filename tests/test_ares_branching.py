"""ARES's entropy-triggered branching: planted entropies decide where each group's rollouts branch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mmrl.engine.rollout import Episode, SamplingParams
from mmrl.methods.ares import branched_episodes, plan_branches
from mmrl.model import Generation, TokenSeq
from mmrl_common.errors import ConfigError
from rewards.entropy import branch_points

LOW = 0.1


def planted(length: int, high: dict[int, float]) -> list[float]:
    return [high.get(i, LOW) for i in range(length)]


# root 0: one sustained spike at tokens 4-7 (entropy 3); root 1: a weaker one at 2-5 (2) and a second at 9-12 (1.5)
ROOT_ENTROPIES = [planted(12, {4: 3.0, 5: 3.0, 6: 3.0, 7: 3.0}),
                  planted(14, {2: 2.0, 3: 2.0, 4: 2.0, 5: 2.0, 9: 1.5, 10: 1.5, 11: 1.5, 12: 1.5})]


def test_branch_points_at_the_planted_windows():
    assert branch_points(torch.tensor(ROOT_ENTROPIES[0]), 1.0, 4) == [(4, pytest.approx(3.0))]
    assert branch_points(torch.tensor(ROOT_ENTROPIES[1]), 1.0, 4) == [(2, pytest.approx(2.0)), (9, pytest.approx(1.5))]
    assert branch_points(torch.tensor(ROOT_ENTROPIES[1]), 1.6, 4) == [(2, pytest.approx(2.0))]
    assert branch_points(torch.tensor(ROOT_ENTROPIES[0]), 5.0, 4) == []  # nothing above tau: no branch
    assert branch_points(torch.tensor([9.0, 9.0]), 1.0, 4) == []  # shorter than a window


class FakeBackend:
    """Roots: planted entropies; continuations: tokens 900.. with entropy 0.5. Records every request."""

    def __init__(self):
        self.calls: list[tuple[list[list[int]], int]] = []

    def generate(self, seqs, *, n, params):
        self.calls.append(([list(s.ids) for s in seqs], n))
        out = []
        for s in seqs:
            if len(s.ids) == 2:  # the bare prompt
                if len(self.calls) == 1:
                    gens = [Generation(token_ids=[100 * (r + 1) + i for i in range(len(e))], text=f"root{r}",
                                       logprobs=[-0.5] * len(e), finished=True, entropies=list(e))
                            for r, e in enumerate(ROOT_ENTROPIES[:n])]
                else:
                    gens = [Generation(token_ids=[7, 7, 7], text="fresh", logprobs=[-0.1] * 3, finished=True,
                                       entropies=[0.2] * 3)]
            else:
                gens = [Generation(token_ids=[900, 901, 902], text="cont", logprobs=[-1.0] * 3, finished=True,
                                   entropies=[0.5] * 3)]
            out.append(gens)
        return out


def run(slots: int, tau: float = 1.0, budget: int = 64):
    policy = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids))))
    backend = FakeBackend()
    prompt = TokenSeq(ids=[1, 2], mm_types=[0, 0])
    params = SamplingParams(max_new_tokens=budget, entropies=True, logprobs=True)
    stats: dict = {}
    eps = branched_episodes(policy, backend, [prompt], [SimpleNamespace(id="q")], n=2 + slots, params=params,
                            roots=2, window=4, threshold=lambda roots: tau, stats=stats)
    return eps, backend, stats


def test_branches_start_at_the_planted_positions_and_join_the_group():
    eps, backend, stats = run(slots=2)
    assert len(eps) == 4 and len(backend.calls) == 2
    root0, root1 = eps[0], eps[1]
    assert backend.calls[0] == ([[1, 2]], 2)
    # the two highest regions: root 0 at 4 (peak 3), root 1 at 2 (peak 2); root 1's region at 9 (1.5) is left out
    assert backend.calls[1] == ([[1, 2, 100, 101, 102, 103], [1, 2, 200, 201]], 1)
    b0, b1 = eps[2], eps[3]
    assert b0.seq.ids == [1, 2, 100, 101, 102, 103, 900, 901, 902]
    assert b0.seq.loss_mask == [0, 0] + [1] * 7  # the kept prefix is trained on, as the continuation
    assert b0.entropies == ROOT_ENTROPIES[0][:4] + [0.5] * 3
    assert b0.logprobs == [-0.5] * 4 + [-1.0] * 3
    assert b0.completion == "100 101 102 103 900 901 902" and b0.prompt is root0.prompt
    assert b1.seq.ids == [1, 2, 200, 201, 900, 901, 902] and b1.entropies == ROOT_ENTROPIES[1][:2] + [0.5] * 3
    assert stats == {"ares/branches": [2.0], "ares/branch_fill": [0.0], "ares/branch_at": [4.0, 2.0]}
    assert root1.seq.ids[2:] == [200 + i for i in range(14)]


def test_fewer_regions_than_slots_are_filled_with_fresh_rollouts():
    eps, backend, stats = run(slots=4)
    assert len(eps) == 6
    # 3 regions branch (root 0 at 4; root 1 at 2 and 9), the fourth slot is a fresh rollout of the prompt
    assert backend.calls[1][0] == [[1, 2, 100, 101, 102, 103], [1, 2, 200, 201],
                                   [1, 2] + [200 + i for i in range(9)], [1, 2]]
    assert eps[5].seq.ids == [1, 2, 7, 7, 7] and stats["ares/branch_fill"] == [1.0]
    # nothing above tau: every extra slot is a fresh rollout
    eps, backend, stats = run(slots=2, tau=10.0)
    assert backend.calls[1][0] == [[1, 2], [1, 2]] and stats["ares/branches"] == [0.0]


def test_a_branch_stays_within_the_token_budget():
    eps, _, _ = run(slots=1, budget=5)  # root 0 branches at 4: one token of room left
    assert eps[2].seq.ids == [1, 2, 100, 101, 102, 103, 900] and eps[2].finished is False
    assert len(eps[2].entropies) == len(eps[2].logprobs) == 5


def test_plan_ranks_regions_by_peak():
    roots = [Episode(sample=None, prompt=TokenSeq([1], [0]), seq=TokenSeq([1], [0]),
                     entropies=e) for e in ROOT_ENTROPIES]
    assert plan_branches(roots, 1.0, 4, 1) == [(0, 4)]
    assert plan_branches(roots, 1.0, 4, 3) == [(0, 4), (1, 2), (1, 9)]
    assert plan_branches(roots, None, 4, 3) == []


def test_branching_errors():
    with pytest.raises(ConfigError, match="branch_roots"):
        branched_episodes(None, FakeBackend(), [], [], n=2, params=SamplingParams(entropies=True), roots=2,
                          window=4, threshold=lambda r: 1.0)
    with pytest.raises(ConfigError, match="single-turn"):
        branched_episodes(None, FakeBackend(), [], [], n=4, params=SamplingParams(entropies=True), roots=2,
                          window=4, threshold=lambda r: 1.0, max_turns=2)
