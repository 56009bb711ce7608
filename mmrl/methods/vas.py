"""Variance-aware sampling (VAS, MMR1): draw more of the prompts whose rollouts disagree.

``data.sampler: vas`` with ``data.sampler_kwargs`` (every setting below has a default). Per training prompt
x, from N rollouts of the current policy:

* the pass rate P(x) = share of rollouts whose ``reward`` component reaches ``pass_threshold``;
* the outcome variance score OVS(x) = P(1 - P) (0 when all pass or all fail; 0.25 at P = 0.5);
* the trajectory diversity score TDS(x): how different the completions are (``diversity``:
  ``self_bleu`` = 1 - self-BLEU-1..3, ``distinct`` = distinct-3, ``edit`` = mean normalised edit
  distance; :mod:`data_pipelines.diversity`), on the completion tokens without padding;
* the variance promotion score VPS(x) = ``alpha`` OVS + ``beta`` TDS.

Each batch of B prompts draws floor(``mix`` B) prompts with replacement with probability proportional to
the VPS (``weighting: proportional``, the default: the paper's Algorithm 1, p(x) = VPS(x) / sum VPS; a
prompt whose rollouts all agree and whose completions are alike has VPS 0 and is left to the uniform part;
all VPS 0: uniform), and the rest uniformly (shuffled passes over the pool, a new order each pass). A batch
of one (the trainer's replacement for an unreadable sample) is therefore uniform.

``weighting: minmax`` is the released code's normalisation instead: the VPS min-max normalised over the pool,
lifted by ``floor`` (w = floor + (1 - floor) (VPS - min) / (max - min); the lowest prompt is drawn ``floor``
times as often as the highest; all equal: uniform). The released code has no floor (``released_code: true``
sets ``floor`` 0 and ``weighting: minmax``); ``floor`` is ours and applies to ``minmax`` only.

Every ``update_every`` steps, before the step's prompts are prepared, the sampler re-scores its pool with
``score_rollouts`` rollouts per prompt of the current policy (``ctx.rescore``, :class:`mmrl.engine.plugins.StepContext`:
no plug-in sees them; ``chunk_prompts`` prompts at a time, their encoded media dropped after each chunk);
the first step scores every prompt. With ``online: true`` a prompt's scores are also replaced by those of
its own training rollouts every step (:meth:`VarianceAwareSampler.update`), and a refresh re-scores only
the stale prompts: those scored ``stale_after`` or more steps ago (default two refresh periods).

The re-scoring rollouts use the trainer's generator (so they change later training rollouts, reproducibly)
but never the draw RNG: the draws come from a counter-based generator (seed, draw number), and a
replacement draw asked for during re-scoring (an unreadable sample) comes from a generator of its own.

Logged every step (``metrics.jsonl``, plotted in ``report.md``): ``vas/vps_drawn`` and ``vas/vps_all`` (mean
VPS of the step's drawn prompts and of the whole pool, at draw time), ``vas/informative_prompts`` (share of
scored prompts with 0 < P < 1), ``vas/refresh_s`` / ``vas/refresh_rollouts`` / ``vas/rescored_prompts``
(this step's re-scoring; 0 on other steps) and their running totals ``vas/refresh_s_total`` /
``vas/refresh_rollouts_total``. The engine's ``informative_groups`` is the share of drawn groups with
unequal rewards.

``released_code: true`` reproduces MMR1's released implementation instead (LengSicong/MMR1,
``verl/curriculum/``: its metrics, its mixed sampler and the weight refresh): the TDS term is the self-BLEU
*similarity* itself, weighted positively (``diversity: self_bleu``), or distinct-3, or the unnormalised mean
pairwise edit distance; the n-gram and edit statistics run on completions right-padded with the pad id to
``rollout.max_new_tokens``; min-max normalisation without the floor (``weighting: minmax``, ``floor`` 0: the
lowest prompt is never drawn by the weighted part); the uniform part walks one fixed permutation cyclically.

Defaults: ``alpha`` 0.8, ``beta`` 0.2, ``mix`` (lambda) 0.5, ``weighting`` proportional as in the paper;
``update_every`` 35 (the paper's main text), ``score_rollouts`` 8 (the paper's ablation default and the
released config; the main text uses 32, as configs/vas.yaml does); ``floor`` 0.05 (minmax only) and
``stale_after`` (2 ``update_every``) are ours; ``reward`` ``accuracy`` with
``pass_threshold`` 1.0 (a rollout passes when it earns full accuracy).

Importing this module also registers MMR1's reward term ``repetition_penalty`` (:mod:`rewards.repetition`), which
configs/vas.yaml adds to the paper's format + accuracy as the released code does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from data_pipelines.diversity import distinct_n, diversity_measure, levenshtein, mean_pairwise, self_bleu
from data_pipelines.samplers import Sampler, register_sampler
from mmrl_common.errors import ConfigError, MmrlError
from rewards import repetition  # noqa: F401  (registers MMR1's repetition_penalty reward: the recipe's one import)

KEY = "data.sampler_kwargs"
WEIGHTINGS = ("proportional", "minmax")


def _released_diversity(name: str):
    """MMR1's released metrics (on padded token lists): self-BLEU similarity, distinct-3, raw edit distance."""
    return {"self_bleu": self_bleu, "distinct": distinct_n,
            "edit": lambda group: mean_pairwise(group, levenshtein)}[name]


def vps_weights(vps: np.ndarray, weighting: str = "proportional", floor: float = 0.0) -> np.ndarray:
    """Unnormalised draw weights of a pool's VPS values: the VPS itself (``proportional``, the paper's
    Algorithm 1) or ``floor + (1 - floor) (VPS - min) / (max - min)`` (``minmax``, the released code's; all
    equal: ones). A pool whose weights are all 0 is drawn uniformly (ones)."""
    v = np.asarray(vps, dtype=np.float64)
    if weighting == "proportional":
        w = np.clip(v, 0.0, None)
    elif weighting == "minmax":
        lo, hi = v.min(), v.max()
        w = (v - lo) / (hi - lo) if hi - lo > 1e-12 else np.ones(len(v))
        w = floor + (1 - floor) * w
    else:
        raise ConfigError(f"{KEY}.weighting={weighting!r}: must be one of {', '.join(WEIGHTINGS)}")
    return w if w.sum() > 0 else np.ones(len(v))


def completion_tokens(seq: Any) -> list[int]:
    """The tokens the policy produced in an episode (every assistant turn; no prompt, no padding)."""
    return [t for t, m in zip(seq.ids, seq.loss_mask) if m]


@register_sampler("vas")
class VarianceAwareSampler(Sampler):
    """MMR1's variance-aware sampler; the settings are described in the module docstring."""

    def __init__(self, samples: Sequence[Any], *, seed: int = 0, alpha: float = 0.8, beta: float = 0.2,
                 mix: float = 0.5, update_every: int = 35, score_rollouts: int = 8, diversity: str = "self_bleu",
                 floor: float = 0.05, online: bool = False, stale_after: int | None = None,
                 reward: str = "accuracy", pass_threshold: float = 1.0, chunk_prompts: int = 8,
                 weighting: str | None = None, released_code: bool = False):
        super().__init__(samples, seed=seed)
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{KEY}.{name}={value!r}: must be a number >= 0")
        if alpha == 0 and beta == 0:
            raise ConfigError(f"{KEY}: alpha and beta are both 0, so every prompt scores 0; set alpha (OVS) "
                              "or beta (TDS) above 0")
        if not isinstance(mix, (int, float)) or not 0 <= mix <= 1:
            raise ConfigError(f"{KEY}.mix={mix!r}: the share of VPS-weighted draws must be in [0, 1]")
        if not isinstance(floor, (int, float)) or not 0 <= floor <= 1:
            raise ConfigError(f"{KEY}.floor={floor!r}: must be in [0, 1]")
        if weighting is None:
            weighting = "minmax" if released_code else "proportional"
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"{KEY}.weighting={weighting!r}: must be one of {', '.join(WEIGHTINGS)} "
                              "(proportional: the paper's p = VPS / sum VPS; minmax: the released code's normalisation)")
        self.weighting = weighting
        for name, value in (("update_every", update_every), ("score_rollouts", score_rollouts),
                            ("chunk_prompts", chunk_prompts), ("stale_after", stale_after)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{KEY}.{name}={value!r}: must be a whole number >= 1")
        self.measure = _released_diversity(diversity) if released_code and diversity in ("self_bleu", "distinct",
                                                                                         "edit") else None
        if self.measure is None:
            self.measure = diversity_measure(diversity, setting=f"{KEY}.diversity")
        self.alpha, self.beta, self.mix, self.floor = float(alpha), float(beta), float(mix), float(floor)
        self.update_every, self.score_rollouts, self.chunk_prompts = update_every, score_rollouts, chunk_prompts
        self.online, self.released_code = bool(online), bool(released_code)
        self.stale_after = stale_after if stale_after is not None else 2 * update_every
        self.reward, self.pass_threshold = str(reward), float(pass_threshold)
        if self.released_code:
            self.floor = 0.0
        n = len(samples)
        # the state (state_dict): scores, refresh bookkeeping, draw counters, position of the uniform part
        self.pass_rate = [0.0] * n
        self.tds = [0.0] * n
        self.scored_at = [-1] * n  # the step of a prompt's latest scores; -1: never scored
        self.last_refresh: int | None = None
        self.draws = 0  # draw() calls so far: the draw RNG is (seed, draws)
        self.spare_draws = 0  # replacement draws asked for while re-scoring
        self.epoch = 0
        self.position = 0
        self.refreshes = 0
        self.refresh_s_total = 0.0
        self.refresh_rollouts_total = 0
        # per process
        self.ctx: Any = None
        self._order = self._permutation(0)
        self._probs: np.ndarray | None = None
        self._refreshing = False
        self._step_seen: int | None = None
        self._step: dict[str, float] = {}
        self._step_drawn_vps: list[float] = []

    # ------------------------------------------------------------------------------------ scores
    def vps(self, i: int) -> float:
        p = self.pass_rate[i]
        return self.alpha * p * (1 - p) + self.beta * self.tds[i]

    def score_group(self, passed: Sequence[float], completions: Sequence[Sequence[int]], pad_id: int = 0,
                    pad_to: int = 0) -> tuple[float, float]:
        """``(P, TDS)`` of one prompt from its rollouts' pass marks (1/0) and completion tokens."""
        if not passed:
            raise ValueError("a prompt's scores need at least one rollout")
        p = float(sum(passed)) / len(passed)
        groups = [list(c) for c in completions]
        if self.released_code:
            width = max([pad_to, *(len(c) for c in groups)])
            groups = [c + [pad_id] * (width - len(c)) for c in groups]
        return p, float(self.measure(groups))

    def set_scores(self, index: int, pass_rate: float, tds: float, step: int) -> None:
        self.pass_rate[index], self.tds[index], self.scored_at[index] = float(pass_rate), float(tds), int(step)
        self._probs = None

    def score_batch(self, batch: Any, step: int) -> int:
        """Scores from a scored rollout batch (one group per prompt); the number of prompts scored."""
        try:
            acc = batch.component(self.reward)
        except KeyError as exc:
            raise ConfigError(f"{KEY}.reward={self.reward!r}: {exc.args[0]}; name the reward component that "
                              "says whether a rollout is correct") from exc
        pad_id, pad_to = 0, 0
        if self.released_code and self.ctx is not None:
            pad_id, pad_to = int(self.ctx.service.policy.pad_id), int(self.ctx.cfg.rollout.max_new_tokens)
        n = 0
        for rows in batch.groups():
            passed = [float(acc[r]) >= self.pass_threshold for r in rows]
            p, tds = self.score_group(passed, [completion_tokens(batch.seqs[r]) for r in rows], pad_id, pad_to)
            self.set_scores(batch.prompt_index[rows[0]], p, tds, step)
            n += 1
        return n

    def probabilities(self) -> np.ndarray:
        """Probability of each prompt for one VPS-weighted draw (``weighting``, module docstring). Never-scored
        prompts count as the mean VPS of the scored ones (all unscored: uniform)."""
        if self._probs is not None:
            return self._probs
        n = len(self.samples)
        scored = np.array([s >= 0 for s in self.scored_at])
        v = np.array([self.vps(i) for i in range(n)], dtype=np.float64)
        if not scored.any():
            w = np.ones(n)
        else:
            v[~scored] = v[scored].mean()
            w = vps_weights(v, self.weighting, self.floor)
        self._probs = w / w.sum()
        return self._probs

    # ------------------------------------------------------------------------------------ drawing
    def _permutation(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, 0, epoch]).permutation(len(self.samples)).tolist()

    def _uniform(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.position = 0
                if not self.released_code:  # the released code cycles through one fixed permutation
                    self.epoch += 1
                    self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def split(self, n: int) -> int:
        """How many of a batch of ``n`` prompts are VPS-weighted draws: floor(mix n)."""
        return math.floor(self.mix * n + 1e-9)

    def draw(self, n: int) -> list[int]:
        if self._refreshing:  # a replacement for an unreadable sample while re-scoring: a generator of its own
            self.spare_draws += 1
            rng = np.random.default_rng([self.seed, 2, self.spare_draws])
            return rng.integers(0, len(self.samples), size=n).tolist()
        self._before_step()
        rng = np.random.default_rng([self.seed, 1, self.draws])
        self.draws += 1
        n_w = self.split(n)
        probs = self.probabilities()
        weighted = rng.choice(len(self.samples), size=n_w, replace=True, p=probs).tolist() if n_w else []
        out = weighted + self._uniform(n - n_w)
        self._step_drawn_vps.extend(self.vps(i) for i in out)
        return out

    # ------------------------------------------------------------------------------------ re-scoring
    def attach(self, ctx: Any) -> None:
        self.ctx = ctx

    def _before_step(self) -> None:
        """Once per training step (the first draw of a step): re-score the pool when it is due."""
        if self.ctx is None:
            return
        step = int(self.ctx.step)
        if step == self._step_seen:
            return
        self._step_seen = step
        self._step_drawn_vps = []
        self._step = {"vas/refresh_s": 0.0, "vas/refresh_rollouts": 0, "vas/rescored_prompts": 0}
        if self.last_refresh is None or step - self.last_refresh >= self.update_every:
            self.refresh(step)
        n = len(self.samples)
        self._step["vas/vps_all"] = sum(self.vps(i) for i in range(n)) / n

    def due_for_refresh(self, step: int) -> list[int]:
        """The prompts a refresh at ``step`` re-scores: all of them, or (online) the stale ones."""
        if not self.online or self.last_refresh is None:
            return list(range(len(self.samples)))
        return [i for i, s in enumerate(self.scored_at) if s < 0 or step - s >= self.stale_after]

    def refresh(self, step: int) -> None:
        """Re-score the due prompts with ``score_rollouts`` rollouts each of the current policy."""
        indices = self.due_for_refresh(step)
        t0 = time.perf_counter()
        rollouts = scored = 0
        self._refreshing = True
        try:
            for batch in self.ctx.rescore(indices, n=self.score_rollouts, chunk=self.chunk_prompts):
                scored += self.score_batch(batch, step)
                rollouts += len(batch)
        finally:
            self._refreshing = False
        seconds = time.perf_counter() - t0
        self.last_refresh = step
        self.refreshes += 1
        self.refresh_s_total += seconds
        self.refresh_rollouts_total += rollouts
        self._step.update({"vas/refresh_s": seconds, "vas/refresh_rollouts": rollouts,
                           "vas/rescored_prompts": scored})

    def update(self, batch: Any) -> None:
        """Online mode: each drawn prompt's scores become those of its training rollouts."""
        if self.online and len(batch):
            step = int(self.ctx.step) if self.ctx is not None else 0
            self.score_batch(batch, step)

    # ------------------------------------------------------------------------------------ logging, state
    def metrics(self) -> dict[str, float]:
        out = dict(self._step)
        if self._step_drawn_vps:
            out["vas/vps_drawn"] = sum(self._step_drawn_vps) / len(self._step_drawn_vps)
        scored = [p for p, s in zip(self.pass_rate, self.scored_at) if s >= 0]
        if scored:
            out["vas/informative_prompts"] = sum(0 < p < 1 for p in scored) / len(scored)
        out["vas/refresh_s_total"] = self.refresh_s_total
        out["vas/refresh_rollouts_total"] = self.refresh_rollouts_total
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"pass_rate": list(self.pass_rate), "tds": list(self.tds), "scored_at": list(self.scored_at),
                "last_refresh": self.last_refresh, "draws": self.draws, "spare_draws": self.spare_draws,
                "epoch": self.epoch, "position": self.position, "refreshes": self.refreshes,
                "refresh_s_total": self.refresh_s_total, "refresh_rollouts_total": self.refresh_rollouts_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = len(self.samples)
        if len(state.get("pass_rate", [])) != n:
            raise MmrlError(f"the checkpoint's VAS state scores {len(state.get('pass_rate', []))} prompts but the "
                            f"training pool has {n}; resume with the data the run started with")
        self.pass_rate = [float(x) for x in state["pass_rate"]]
        self.tds = [float(x) for x in state["tds"]]
        self.scored_at = [int(x) for x in state["scored_at"]]
        self.last_refresh = None if state["last_refresh"] is None else int(state["last_refresh"])
        self.draws, self.spare_draws = int(state["draws"]), int(state["spare_draws"])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.refreshes = int(state["refreshes"])
        self.refresh_s_total = float(state["refresh_s_total"])
        self.refresh_rollouts_total = int(state["refresh_rollouts_total"])
        self._order = self._permutation(self.epoch)
        self._probs = None


def _register_curves() -> None:
    from mmrl.run.report import register_curve

    register_curve("informative_groups", "share of drawn groups with unequal rewards (what GRPO learns from)",
                   "informative_groups.png")
    register_curve("vas/vps_*", "VAS: mean variance promotion score, drawn prompts vs the pool", "vas_vps.png")
    register_curve("vas/refresh_s_total", "VAS: seconds spent re-scoring prompts (running total)",
                   "vas_refresh.png")


_register_curves()
