"""ARES (arXiv 2510.08457 and its code): the ``ares`` plug-in -- window entropy marks the moments that matter
(and, with ``branching``, where rollouts branch: :mod:`.branching`), exploration, length and KL are shaped by
difficulty; ``imports: [mmrl.methods.ares]``.

The method, its settings and what it logs are described in :mod:`rewards.ares`, which holds its formulas (the
difficulty buckets, both shaping forms, the per-bucket KL controller) beside :mod:`rewards.entropy` (window
entropy, the high-window-entropy count); this module is the plug-in that applies them to every round's
rollouts, and the report's ARES plots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmrl.engine.plugins import Callback, register_plugin
from mmrl.grpo.kl import get_kl
from mmrl.run.report import register_curve
from mmrl_common.errors import ConfigError
from rewards.ares import (
    BUCKETS,
    CODE_CONSTANTS,
    COMPONENT,
    PAPER_TARGET,
    SHAPING_MODES,
    BucketKLController,
    bucket_of,
    code_shaping,
    paper_lambda,
    paper_shaping,
    paper_target,
)
from rewards.entropy import (
    AGGREGATES,
    COUNT_MODES,
    EntropyThreshold,
    batch_threshold,
    hwe_windows,
)

from .branching import branched_episodes
from .cold_start import DEFAULTS as ADACS_DEFAULTS
from .triggers import ARES_TRIGGERS

if TYPE_CHECKING:
    from mmrl.engine.batch import RolloutBatch
    from mmrl.engine.plugins import StepContext

for _piece, _title in (("length", "response length per difficulty bucket (tokens)"),
                       ("entropy", "mean token entropy per difficulty bucket (entropy collapse)"),
                       ("hwe", "high-window-entropy count per response, per bucket"),
                       ("shaping", "ARES shaping reward per bucket"),
                       ("kl_weight", "ARES KL weight beta per bucket")):
    register_curve(f"ares/{_piece}/*", _title, f"ares-{_piece}.png")




# ---------------------------------------------------------------------------------------- the plug-in
DEFAULTS: dict[str, Any] = {
    "window": 4, "quantile": 0.95, "threshold_aggregate": "mean", "threshold_ema": None,
    "count_mode": "windows", "triggers": list(ARES_TRIGGERS),
    "accuracy_component": "accuracy", "correct_at": 0.5,
    "shaping": "code", "shaping_weight": 1.0, "target_scale": 1.0,
    "alpha_init": 0.5, "alpha_step": 0.05, "alpha_max": 2.0, "code_constants": {},
    "paper_target": dict(PAPER_TARGET), "paper_cap": 1.0,
    "dynamic_kl": True, "kl_target": {b: 0.01 for b in BUCKETS}, "kl_ema": 0.97, "kl_err_ema": 0.97,
    "kl_deadzone": 0.02, "kl_step": 0.05, "kl_err_clip": 0.2, "kl_update_every": 100,
    "kl_call_rows": 8,
    "beta_init": 1.0, "beta_min": 1e-4, "beta_max": 1e2, "hwe_kl_rho": 0.5, "recent_window": 20,
    "branching": False, "branch_roots": 4, **ADACS_DEFAULTS,
}
"""Every setting of ``plugins.ares`` and its default (module docstring)."""


def _settings(given: dict[str, Any]) -> dict[str, Any]:
    s = {**DEFAULTS, **given}

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"plugins.ares.{key}={s[key]!r}: {why}")

    if not isinstance(s["window"], int) or s["window"] < 1:
        raise bad("window", "must be an integer >= 1 (4 in ARES)")
    if not 0.0 < float(s["quantile"]) <= 1.0:
        raise bad("quantile", "must be in (0, 1] (0.95 in ARES)")
    for key, valid in (("threshold_aggregate", AGGREGATES), ("count_mode", COUNT_MODES)):
        if s[key] not in valid:
            raise bad(key, f"must be one of {', '.join(valid)}")
    form = s["shaping"]
    if isinstance(form, dict):
        if set(form) != set(BUCKETS) or not all(v in SHAPING_MODES for v in form.values()):
            raise bad("shaping", f"a mapping must give every bucket ({', '.join(BUCKETS)}) one of "
                                 f"{', '.join(SHAPING_MODES)}")
        s["shaping_of"] = dict(form)
    elif form in SHAPING_MODES:
        s["shaping_of"] = {b: form for b in BUCKETS}
    else:
        raise bad("shaping", f"must be one of {', '.join(SHAPING_MODES)}, or a mapping bucket -> one of them")
    if s["threshold_ema"] is not None and not 0.0 <= float(s["threshold_ema"]) < 1.0:
        raise bad("threshold_ema", "must be in [0, 1) (0.99 in the released code) or null (per batch)")
    if not 0.0 < float(s["hwe_kl_rho"]) <= 1.0:
        raise bad("hwe_kl_rho", "must be in (0, 1]: the KL weight inside high-entropy windows (1: no relaxation)")
    for key in ("kl_ema", "kl_err_ema"):
        if not 0.0 <= float(s[key]) < 1.0:
            raise bad(key, "must be in [0, 1)")
    for key in ("kl_step", "kl_err_clip", "kl_deadzone", "alpha_step", "alpha_max", "paper_cap", "target_scale"):
        if float(s[key]) < 0:
            raise bad(key, "must be >= 0")
    if not 0 < float(s["beta_min"]) <= float(s["beta_init"]) <= float(s["beta_max"]):
        raise bad("beta_init", "needs 0 < beta_min <= beta_init <= beta_max")
    if not isinstance(s["recent_window"], int) or s["recent_window"] < 1:
        raise bad("recent_window", "must be an integer >= 1")
    if not isinstance(s["branching"], bool):
        raise bad("branching", "must be true or false")
    if not isinstance(s["branch_roots"], int) or s["branch_roots"] < 1:
        raise bad("branch_roots", "must be an integer >= 1 (full rollouts per group before branching)")
    if not isinstance(s["kl_update_every"], int) or s["kl_update_every"] < 1:
        raise bad("kl_update_every", "must be an integer >= 1")
    if not isinstance(s["kl_call_rows"], int) or s["kl_call_rows"] < 1:
        raise bad("kl_call_rows", "must be an integer >= 1 (rows of a mini-batch per controller call; 8 in the "
                                  "released code: one row per call on each of 8 GPUs)")
    for key, keys_of in (("kl_target", None), ("paper_target", None), ("code_constants", CODE_CONSTANTS)):
        val = s[key]
        if not isinstance(val, dict) or set(val) - set(BUCKETS):
            raise bad(key, f"must map buckets ({', '.join(BUCKETS)}) to values")
    s["kl_target"] = {**DEFAULTS["kl_target"], **s["kl_target"]}
    s["paper_target"] = {**PAPER_TARGET, **s["paper_target"]}
    if any(float(v) <= 0 for v in s["kl_target"].values()):
        raise bad("kl_target", "every target must be > 0 (0.01 in the released code)")
    consts = {b: dict(CODE_CONSTANTS[b]) for b in BUCKETS}
    for b, over in s["code_constants"].items():
        if not isinstance(over, dict) or set(over) - set(consts[b]):
            raise bad("code_constants", f"{b}: set any of {', '.join(consts[b])}")
        consts[b].update({k: float(v) for k, v in over.items()})
    s["code_constants"] = consts
    if not isinstance(s["triggers"], list) or not all(isinstance(w, str) for w in s["triggers"]):
        raise bad("triggers", "must be a list of words")
    return s


def bad_roots(roots: int, group: int) -> ConfigError:
    return ConfigError(f"plugins.ares.branch_roots={roots}: must be below rollout.group_size ({group}); the other "
                       f"rollouts of each group are the branches")


@register_plugin("ares")
class AresPlugin(Callback):
    """ARES difficulty-aware entropy shaping and dynamic KL (module docstring)."""

    SETTINGS = tuple(DEFAULTS)

    def __init__(self, ctx: StepContext, **settings: Any):
        super().__init__(ctx, **settings)
        s = self.s = _settings(settings)
        cfg = ctx.cfg
        if not cfg.rollout.record_entropies:
            raise ConfigError("plugins.ares needs the rollouts' token entropies: set rollout.record_entropies: true")
        self.kl_on = bool(s["dynamic_kl"]) or float(s["hwe_kl_rho"]) < 1.0
        if self.kl_on and not cfg.grpo.uses_reference:
            raise ConfigError("plugins.ares: dynamic_kl / hwe_kl_rho < 1 weight the KL term, which is off: set "
                              "grpo.kl_coef > 0 (0.01 in ARES), or dynamic_kl: false and hwe_kl_rho: 1")
        if s["dynamic_kl"] and not cfg.rollout.record_logprobs:
            raise ConfigError("plugins.ares.dynamic_kl measures each bucket's KL from the rollout log-probs: set "
                              "rollout.record_logprobs: true")
        self.threshold = EntropyThreshold(s["threshold_ema"])
        self.controller = BucketKLController(
            s["kl_target"], ema=float(s["kl_ema"]), err_ema=float(s["kl_err_ema"]), deadzone=float(s["kl_deadzone"]),
            step=float(s["kl_step"]), err_clip=float(s["kl_err_clip"]), every=int(s["kl_update_every"]),
            beta_init=float(s["beta_init"]), beta_min=float(s["beta_min"]), beta_max=float(s["beta_max"]))
        self.alpha = {b: float(s["alpha_init"]) for b in BUCKETS}
        self.recent: dict[str, deque[float]] = {b: deque(maxlen=int(s["recent_window"])) for b in BUCKETS}
        self._words_cache: dict[int, str] = {}
        self.tau_prev: float | None = None  # the tau of the last step (what branching uses)
        if s["branching"]:
            r = cfg.rollout
            if r.max_turns > 1 or r.environment:
                raise ConfigError("plugins.ares.branching works on single-turn rollouts: set "
                                  "plugins.ares.branching: false, or rollout.max_turns: 1 and no rollout.environment")
            if not s["branch_roots"] < r.group_size:
                raise bad_roots(s["branch_roots"], r.group_size)
            ctx.set_rollout_strategy(self.rollout)
        self._reset_step()

    def branch_threshold(self, roots: list[torch.Tensor]) -> float | None:
        """tau for branching: the last step's, or at the first step the roots' own batch value."""
        if self.tau_prev is not None:
            return self.tau_prev
        s = self.s
        return batch_threshold(roots, s["window"], float(s["quantile"]), s["threshold_aggregate"])

    def rollout(self, policy: Any, backend: Any, prompts: Any, samples: Any, **kwargs: Any) -> list[Any]:
        """The training rollouts, branched at high-window-entropy points (:mod:`.branching`)."""
        return branched_episodes(policy, backend, prompts, samples, roots=int(self.s["branch_roots"]),
                                 window=int(self.s["window"]), threshold=self.branch_threshold,
                                 stats=self.branch_stats, **kwargs)

    def _reset_step(self) -> None:
        self.acc: dict[str, list[float]] = {}  # metric name -> values over the step's rounds
        self.tau_batch: list[float] = []
        self.branch_stats: dict[str, list[float]] = {}

    def _add(self, key: str, values: Sequence[float]) -> None:
        self.acc.setdefault(key, []).extend(float(v) for v in values)

    # ------------------------------------------------------------------------------------ per round
    def _words(self, ids: Sequence[int]) -> list[str]:
        tok = self.ctx.service.policy.tokenizer
        out = []
        for i in ids:
            if i not in self._words_cache:
                self._words_cache[i] = tok.convert_ids_to_tokens(int(i))
            out.append(self._words_cache[i])
        return out

    def measure(self, batch: RolloutBatch) -> tuple[float | None, list[int], list[list[int]], list[torch.Tensor]]:
        """``(tau, HWE count per row, covered columns per row, token entropies per row)``."""
        s = self.s
        if batch.entropies is None:
            raise ConfigError("plugins.ares: the rollout batch has no entropies (rollout.record_entropies: true)")
        cols = [batch.loss_mask[i].nonzero().flatten() for i in range(len(batch))]
        ents = [batch.entropies[i, c] for i, c in enumerate(cols)]
        tau_b = batch_threshold(ents, s["window"], float(s["quantile"]), s["threshold_aggregate"])
        if tau_b is not None:
            self.tau_batch.append(tau_b)
        tau = self.threshold.value(tau_b)
        counts, covered = [], []
        for i, (c, h) in enumerate(zip(cols, ents)):
            if tau is None:
                counts.append(0)
                covered.append([])
                continue
            words = None
            if s["count_mode"] == "triggers":
                words = self._words([batch.seqs[i].ids[j] for j in c.tolist()])
            n, pos = hwe_windows(h, tau, s["window"], s["count_mode"], words=words, triggers=s["triggers"])
            counts.append(n)
            covered.append([int(c[p]) for p in pos])
        return tau, counts, covered, ents

    def after_rewards(self, batch: RolloutBatch) -> None:
        s = self.s
        tau, counts, covered, ents = self.measure(batch)
        acc = batch.component(s["accuracy_component"]).float()
        group_acc = batch.group_mean(acc)
        bucket_of_group = [bucket_of(float(a)) for a in group_acc]
        buckets = [bucket_of_group[int(g)] for g in batch.group_index]
        correct = [bool(a >= float(s["correct_at"])) for a in acc]
        shaping = [0.0] * len(batch)
        targets: dict[str, float] = {}
        for b in BUCKETS:
            rows = [i for i, x in enumerate(buckets) if x == b]
            if not rows:
                continue
            n_b = [float(counts[i]) for i in rows]
            mean_b = sum(n_b) / len(n_b)
            form = s["shaping_of"][b]
            if form == "code":
                target = float(round(float(s["target_scale"]) * mean_b))
                for i in rows:
                    shaping[i] = code_shaping(b, correct[i], counts[i], target, self.alpha[b], s["code_constants"])
                gap = (mean_b - target) if b != "hard" else (target - mean_b)
                self.alpha[b] = min(float(s["alpha_max"]), max(0.0, self.alpha[b] + float(s["alpha_step"]) * gap))
            elif form == "paper":
                target = paper_target(n_b, b, s["paper_target"])
                lam = paper_lambda(n_b, target, b)
                for i in rows:
                    shaping[i] = paper_shaping(b, correct[i], counts[i], target, lam, float(s["paper_cap"]))
            else:
                target = mean_b
            targets[b] = target
            lengths = batch.response_length[rows].float()
            self._add(f"ares/length/{b}", lengths.tolist())
            self._add(f"ares/entropy/{b}", [float(ents[i].mean()) if ents[i].numel() else 0.0 for i in rows])
            self._add(f"ares/hwe/{b}", n_b)
            self._add(f"ares/target/{b}", [target])
            self._add(f"ares/accuracy/{b}", [float(acc[i]) for i in rows])
            if form != "none":
                self._add(f"ares/shaping/{b}", [shaping[i] for i in rows])
        n_groups = max(1, len(bucket_of_group))
        for b in BUCKETS:
            self._add(f"ares/share/{b}", [bucket_of_group.count(b) / n_groups])
        if tau is not None:
            self._add("ares/tau", [tau])
        batch.extra["ares_bucket"] = buckets
        batch.extra["ares_hwe"] = torch.tensor(counts, dtype=torch.float32)
        batch.extra["ares_hwe_cols"] = covered
        if any(f != "none" for f in s["shaping_of"].values()):
            value = torch.tensor(shaping, dtype=torch.float32) * float(s["shaping_weight"])
            batch.reward_components[COMPONENT] = value
            batch.rewards = batch.rewards + value

    # ------------------------------------------------------------------------------------ the trained batch
    def after_advantages(self, batch: RolloutBatch) -> None:
        if not self.kl_on:
            return
        s = self.s
        buckets = batch.extra["ares_bucket"]
        if s["dynamic_kl"]:
            beta = torch.tensor([self.controller.beta[b] for b in buckets], dtype=batch.seq_kl_weights.dtype)
            batch.seq_kl_weights = batch.seq_kl_weights * beta
        rho = float(s["hwe_kl_rho"])
        if rho < 1.0:
            w = batch.token_kl_weights.clone()
            for i, cols in enumerate(batch.extra["ares_hwe_cols"]):
                if cols:
                    w[i, torch.tensor(cols, dtype=torch.long)] *= rho
            batch.token_kl_weights = w
        m = batch.loss_mask
        self._add("ares/kl_weight_token_mean", [float((batch.kl_weights() * m).sum() / m.sum().clamp(min=1))])

    def after_update(self, batch: RolloutBatch, stats: dict[str, Any]) -> None:
        if not self.s["dynamic_kl"] or batch.ref_logprobs is None:
            return
        logp = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
        if logp is None:
            raise ConfigError("plugins.ares.dynamic_kl: no rollout log-probs (rollout.record_logprobs: true)")
        est = get_kl(self.ctx.cfg.grpo.kl_estimator)(logp, batch.ref_logprobs)
        m = batch.loss_mask
        seq_kl = (est * m).sum(-1) / m.sum(-1).clamp(min=1)
        buckets = batch.extra["ares_bucket"]
        # one controller call per kl_call_rows rows of each optimizer step's rows, in the trainer's own plan
        # (dp_actor.py calls it once per micro_batch_size_per_device_for_update rows on each rank): the count is
        # the code's, whatever train.micro_batch_size / micro_batch_tokens (memory only) split the rows into
        n = int(self.s["kl_call_rows"])
        steps = [[r for mb in step for r in mb] for step in self.ctx.update_plan(batch)]
        for rows in (step[i:i + n] for step in steps for i in range(0, len(step), n)):
            per_bucket = {}
            for b in BUCKETS:
                mine = [i for i in rows if buckets[i] == b]
                if mine:
                    per_bucket[b] = float(seq_kl[mine].mean())
            self.controller.update(per_bucket)

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        if self.tau_batch:
            step_tau = sum(self.tau_batch) / len(self.tau_batch)
            self.threshold.update(step_tau)
            self.tau_prev = self.threshold.avg if self.threshold.ema is not None else step_tau
        for key, vals in self.branch_stats.items():
            if vals:
                stats[key] = sum(vals) / len(vals)
        for key, vals in self.acc.items():
            if vals:
                stats[key] = sum(vals) / len(vals)
        for b in BUCKETS:
            if f"ares/length/{b}" in stats:
                self.recent[b].append(stats[f"ares/length/{b}"])
            if self.recent[b]:
                stats[f"ares/length_recent/{b}"] = sum(self.recent[b]) / len(self.recent[b])
            stats[f"ares/kl_weight/{b}"] = self.controller.beta[b] if self.s["dynamic_kl"] else 1.0
            if self.controller.kl_ema[b] is not None:
                stats[f"ares/kl/{b}"] = self.controller.kl_ema[b]
            if self.s["shaping_of"][b] == "code":
                stats[f"ares/alpha/{b}"] = self.alpha[b]
        self._reset_step()

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold.state_dict(), "controller": self.controller.state_dict(),
                "tau_prev": self.tau_prev,
                "alpha": dict(self.alpha), "recent": {b: list(v) for b, v in self.recent.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.threshold.load_state_dict(state.get("threshold", {}))
        self.tau_prev = state.get("tau_prev")
        self.controller.load_state_dict(state.get("controller", {}))
        self.alpha.update(state.get("alpha", {}))
        for b, vals in state.get("recent", {}).items():
            self.recent[b].clear()
            self.recent[b].extend(float(v) for v in vals)
