"""ARES's "when to explore": rollouts that branch at high-window-entropy (HWE) points.

A rollout strategy (:class:`mmrl.engine.rollout.RolloutStrategy`, installed by the ``ares`` plug-in with
``branching: true``). For each prompt's group of ``n``:

1. ``roots`` full rollouts (``branch_roots``), with their token entropies;
2. the threshold tau (the plug-in's: the previous step's value; at the first step the roots' own batch value);
3. every root's branch points (:func:`rewards.entropy.branch_points`): one per run of windows whose mean
   entropy exceeds tau, at the start ``t`` of its highest window, ranked over the whole group by that peak;
4. the best ``n - roots`` points each get one branch: the root's tokens ``0 .. t-1`` kept, token ``t`` onward
   sampled afresh (at most ``max_new_tokens`` response tokens in all). Slots left when the group has fewer
   high-entropy regions than that are filled with fresh full rollouts (no branch where nothing is uncertain).

Branches join their prompt's group like any rollout (the group's advantages are normalised over roots,
branches and fill-ins together); the kept prefix is trained on in every row that carries it, with the root's
sampling log-probs and entropies (the same policy sampled it). Published: the trigger (window entropy over
tau, windows of 4) and "at most one branch per high-entropy window, with a cap on total trajectories"; the
number of roots, the ranking by peak and the fill-in are not published (the paper's full text was not
available, and the released code samples plain groups): our choices. Single-turn rollouts only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mmrl.engine.rollout import Episode, RolloutBackend, SamplingParams, run_episodes
from mmrl.model import Policy, TokenSeq
from mmrl_common.errors import ConfigError
from rewards.entropy import branch_points

Threshold = Callable[[list[torch.Tensor]], "float | None"]


def response_ids(ep: Episode) -> list[int]:
    """The tokens a single-turn episode generated (after its prompt)."""
    return list(ep.seq.ids[len(ep.prompt.ids):])


def plan_branches(roots: Sequence[Episode], tau: float | None, window: int, slots: int
                  ) -> list[tuple[int, int]]:
    """``[(root, t), ...]``: the ``slots`` best branch points of one group's roots (highest peak window
    entropy first; ties: earlier root, earlier point), in root then position order."""
    if tau is None or slots <= 0:
        return []
    found = []
    for r, ep in enumerate(roots):
        for t, peak in branch_points(torch.tensor(ep.entropies, dtype=torch.float32), tau, window):
            found.append((-peak, r, t))
    best = sorted(found)[:slots]
    return sorted((r, t) for _, r, t in best)


def branched_episodes(policy: Policy, backend: RolloutBackend, prompts: Sequence[TokenSeq],
                      samples: Sequence[Any], *, n: int, params: SamplingParams, roots: int, window: int,
                      threshold: Threshold, stats: dict[str, list[float]] | None = None,
                      environment: Callable[[Any], Any] | None = None, max_turns: int = 1) -> list[Episode]:
    """``n`` episodes per prompt, ``roots`` of them full and the rest branched (module docstring)."""
    if max_turns > 1 or environment is not None:
        raise ConfigError("plugins.ares.branching works on single-turn rollouts: set plugins.ares.branching: "
                          "false, or rollout.max_turns: 1 without an environment")
    if not params.entropies:
        raise ConfigError("plugins.ares.branching needs the rollouts' token entropies: rollout.record_entropies: true")
    if not 1 <= roots < n:
        raise ConfigError(f"plugins.ares.branch_roots={roots}: must be in [1, group size {n})")
    first = run_episodes(policy, backend, prompts, samples, n=roots, params=params)
    tau = threshold([torch.tensor(ep.entropies, dtype=torch.float32) for ep in first])
    budget = params.max_new_tokens
    plans, requests = [], []
    for p, prompt in enumerate(prompts):
        group = first[p * roots:(p + 1) * roots]
        picks = plan_branches(group, tau, window, n - roots)
        picks = [(r, t) for r, t in picks if t < budget]
        plans.append(picks)
        for r, t in picks:
            requests.append(prompt.extend(response_ids(group[r])[:t], trained=True))
        requests.extend([prompt] * (n - roots - len(picks)))  # fill-ins: fresh rollouts
    second_params = params if params.seed is None else dataclasses.replace(params, seed=(params.seed + 1) % 2**63)
    gens = [g[0] for g in backend.generate(requests, n=1, params=second_params)] if requests else []
    out: list[Episode] = []
    k = 0
    for p, (prompt, sample) in enumerate(zip(prompts, samples)):
        group = first[p * roots:(p + 1) * roots]
        out.extend(group)
        for r, t in plans[p]:
            out.append(_branch(policy, group[r], t, gens[k], budget))
            k += 1
        for _ in range(n - roots - len(plans[p])):
            ep = Episode(sample=sample, prompt=prompt, seq=prompt.extend(gens[k].token_ids, trained=True),
                         turns=[gens[k].text], logprobs=list(gens[k].logprobs), entropies=list(gens[k].entropies),
                         finished=gens[k].finished)
            out.append(ep)
            k += 1
        if stats is not None:
            stats.setdefault("ares/branches", []).append(float(len(plans[p])))
            stats.setdefault("ares/branch_fill", []).append(float(n - roots - len(plans[p])))
            stats.setdefault("ares/branch_at", []).extend(float(t) for _, t in plans[p])
    return out


def _branch(policy: Policy, root: Episode, t: int, gen: Any, budget: int) -> Episode:
    """The episode of a branch: ``root``'s first ``t`` tokens, then ``gen`` (cut at ``budget`` tokens in all)."""
    keep = budget - t
    cont, finished = list(gen.token_ids), bool(gen.finished)
    if len(cont) > keep:
        cont, finished = cont[:keep], False
    ids = response_ids(root)[:t] + cont
    return Episode(sample=root.sample, prompt=root.prompt, seq=root.prompt.extend(ids, trained=True),
                   turns=[policy.tokenizer.decode(ids, skip_special_tokens=True)],
                   logprobs=list(root.logprobs[:t]) + list(gen.logprobs[:len(cont)]) if root.logprobs else [],
                   entropies=list(root.entropies[:t]) + list(gen.entropies[:len(cont)]), finished=finished)
