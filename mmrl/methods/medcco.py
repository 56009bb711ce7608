"""MedCCO / ARMed: a staged curriculum as a plug-in (MedCCO's closed-to-open schedule, arXiv 2505.19213;
docs/methods/medcco.md), with the medical rewards (``medical_closed``, ``lexical``, ``semantic``,
``medcco_open``, ``armed``: :mod:`rewards.medical`, registered by importing this module).

Turn it on in a run config (``imports: [mmrl.methods.medcco]``, then)::

    plugins:
      curriculum:
        stages:
          - name: closed
            select: {answer_types: [closed]}
            rewards: [{name: medical_closed}, {name: format, weight: 0.2, kwargs: {mode: answer}}]
            switch: {rule: steps, steps: 100}
          - name: open
            select: {answer_types: [open]}
            rewards: [...]

Each stage is a mapping with these keys (defaults in brackets):

* ``name`` -- shown in the logs (``curriculum_stage``), the report and ``curriculum.json``.
* ``select`` [every training sample] -- which samples the stage trains on; every given condition must hold:
  ``answer_types`` (closed/open: ``meta.answer_type``, else by problem type, as the medical rewards decide),
  ``problem_types``, ``tasks`` (``meta.task``), ``meta`` (``{key: [allowed values]}``).
* ``rewards`` [the run's ``rewards``] -- the stage's reward entries; ``grpo`` [none] -- GRPO settings that
  differ from the run's (``{kl_coef: 0.01}``).
* ``replay`` [0] -- share of the stage's pool drawn from the samples of the earlier stages that this stage
  does not select itself (seeded by ``train.seed``): with N own samples, ``round(N·r/(1−r))`` earlier ones are
  added (at most all of them); the realised share is logged. MedCCO does not say whether it replays; its
  stated reason for staging (closed and open rewards conflict in one batch) argues against it, so the paper
  recipe keeps it at 0.
* ``reset_reference`` [true for every stage after the first] -- MedCCO's "curriculum bridge": the KL
  reference becomes the policy at the end of the previous stage (only matters with ``grpo.kl_coef > 0``).
* ``reset_optimizer`` [false] -- the optimizer's state (AdamW's moments) is dropped when the stage starts, as
  in a new run from the end-of-stage policy; ``restart_schedule`` [as ``reset_optimizer``] -- the learning-rate
  schedule (``train.lr_schedule`` with ``train.warmup_steps``) begins again with the stage, as in that new run:
  warm-up from the stage's first step, then the decay over the stage's own steps (its ``switch: {rule: steps}``
  count; otherwise to the run's last step), so the stage starts at the peak rate (without it the run's schedule
  goes on: under cosine a second half-run stage trains at about 0.18 of the peak on average); ``lr`` [the
  run's] -- the stage's peak learning rate (the schedule, restarted or not, scaled to it). All three only in a
  later stage; MedCCO says none of them (a second verl run from the stage-1 checkpoint would start with a fresh
  optimizer and schedule: an inference).
* ``switch`` [none: the stage runs to the end of training; the last stage's is ignored] -- when to move on:

  - ``{rule: steps, steps: N}``: after N steps in the stage;
  - ``{rule: plateau, window: 20, patience: 20, min_delta: 0.01, metric: reward}``: the moving average of
    ``metric`` (any number logged each step) over the last ``window`` steps has not beaten its best by more
    than ``min_delta`` for ``patience`` steps;
  - ``{rule: sparsity, threshold: 0.8, window: 10}``: the share of groups whose rewards are all equal
    (``1 − informative_groups``: zero variance, no GRPO signal; Fleming-R1's trigger) averaged over the last
    ``window`` steps reaches ``threshold``.

  The performance rules also take ``min_steps`` [``window``] and ``max_steps`` [none] (a hard cap).

Logged every step: ``curriculum/stage_index`` (0-based), ``curriculum/stage_step``, ``curriculum/moving_metric``
(the plateau rule's moving average; the stage's mean reward otherwise), ``curriculum/zero_variance_share``
(moving), ``curriculum/replay_share`` and ``curriculum/switched`` (1 on the step that switched); and
``reward_spread/<component>``: the mean within-group (population) standard deviation of each reward
component, over the groups where that component is not 0 on every rollout (not applicable there, or failed
by all) -- the signal GRPO's group normalisation sees. Each switch (step, stage, reason, statistics of the
finished stage) goes to ``curriculum.json`` in the run folder. The plug-in's state (stage, counters, moving
windows, switch history) and the state of stateful rewards (ARMed's buffer) are saved with every checkpoint;
a resumed run continues in the stage, and at the stage step, where it stopped.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

import rewards.medical  # noqa: F401  (registers the medical rewards the recipe names)
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.run.report import register_curve
from mmrl_common.errors import ConfigError
from rewards.medical import answer_type

if TYPE_CHECKING:
    from mmrl.engine.batch import RolloutBatch

__all__ = ["Curriculum", "component_spread", "sample_answer_type"]

STAGE_KEYS = ("name", "select", "rewards", "grpo", "replay", "reset_reference", "reset_optimizer",
              "restart_schedule", "lr", "switch")
SELECT_KEYS = ("answer_types", "problem_types", "tasks", "meta")
RULES = {"steps": ("steps",), "plateau": ("window", "patience", "min_delta", "metric", "min_steps", "max_steps"),
         "sparsity": ("threshold", "window", "min_steps", "max_steps")}
DEFAULTS = {"window": 20, "patience": 20, "min_delta": 0.01, "metric": "reward", "threshold": 0.8}
SETTINGS = ("stages",)

register_curve("curriculum/stage_index", "Curriculum stage", "curriculum_stage.png")
register_curve("reward_spread/*", "Within-group spread of each reward component", "reward_spread.png")


def sample_answer_type(sample: Any) -> str:
    """``closed`` or ``open`` for a sample, as the medical rewards decide it."""
    return answer_type(sample.problem_type, sample.meta)


def _as_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, (str, int, float, bool)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{where}: expected a value or a list of values, got {value!r}")


def _selector(select: Any, where: str):
    if select is None:
        return lambda s: True
    if not isinstance(select, Mapping):
        raise ConfigError(f"{where}.select: expected a mapping with keys {', '.join(SELECT_KEYS)}, got {select!r}")
    unknown = [k for k in select if k not in SELECT_KEYS]
    if unknown:
        raise ConfigError(f"{where}.select: unknown key {unknown[0]!r}; valid: {', '.join(SELECT_KEYS)}")
    answer_types = select.get("answer_types")
    if answer_types is not None:
        answer_types = _as_list(answer_types, f"{where}.select.answer_types")
        bad = [a for a in answer_types if a not in ("open", "closed")]
        if bad:
            raise ConfigError(f"{where}.select.answer_types: {bad[0]!r} is neither 'open' nor 'closed'")
    problem_types = None if select.get("problem_types") is None else \
        _as_list(select["problem_types"], f"{where}.select.problem_types")
    tasks = None if select.get("tasks") is None else _as_list(select["tasks"], f"{where}.select.tasks")
    meta = select.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise ConfigError(f"{where}.select.meta: expected {{key: [values]}}, got {meta!r}")
    meta = {k: _as_list(v, f"{where}.select.meta.{k}") for k, v in meta.items()}

    def keep(s: Any) -> bool:
        if answer_types is not None and sample_answer_type(s) not in answer_types:
            return False
        if problem_types is not None and s.problem_type not in problem_types:
            return False
        if tasks is not None and s.meta.get("task") not in tasks:
            return False
        return all(s.meta.get(k) in allowed for k, allowed in meta.items())

    return keep


def _switch(raw: Any, where: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or raw.get("rule") not in RULES:
        raise ConfigError(f"{where}.switch: expected {{rule: steps|plateau|sparsity, ...}}, got {raw!r}")
    rule = raw["rule"]
    unknown = [k for k in raw if k != "rule" and k not in RULES[rule]]
    if unknown:
        raise ConfigError(f"{where}.switch: {unknown[0]!r} is not a setting of rule {rule!r}; "
                          f"valid: {', '.join(RULES[rule])}")
    out = {"rule": rule, **{k: raw.get(k, DEFAULTS.get(k)) for k in RULES[rule]}}
    if rule == "steps":
        if not isinstance(out["steps"], int) or out["steps"] < 1:
            raise ConfigError(f"{where}.switch.steps: a positive number of steps is needed, got {out['steps']!r}")
        return out
    if not isinstance(out["window"], int) or out["window"] < 1:
        raise ConfigError(f"{where}.switch.window must be a positive integer, got {out['window']!r}")
    if out["min_steps"] is None:
        out["min_steps"] = out["window"]
    if rule == "sparsity" and not 0.0 < float(out["threshold"]) <= 1.0:
        raise ConfigError(f"{where}.switch.threshold must be in (0, 1], got {out['threshold']!r}")
    return out


def component_spread(batch: RolloutBatch) -> dict[str, float]:
    """Mean within-group population std of each reward component, over groups where it is not all 0."""
    spreads = {name: batch.group_spread(values.tolist()) for name, values in batch.reward_components.items()}
    return {name: v for name, v in spreads.items() if v is not None}


@register_plugin("curriculum")
class Curriculum(Callback):
    """The staged curriculum described in the module docstring."""

    SETTINGS = SETTINGS

    def __init__(self, ctx: Any, **settings: Any):
        super().__init__(ctx, **settings)
        stages = settings.get("stages")
        if not isinstance(stages, list) or not stages:
            raise ConfigError("plugins.curriculum.stages: a list of stages is needed (each {name, select, "
                              "rewards, grpo, replay, reset_reference, switch})")
        self.stages: list[dict[str, Any]] = []
        names: set[str] = set()
        for i, raw in enumerate(stages):
            where = f"plugins.curriculum.stages[{i}]"
            if not isinstance(raw, Mapping):
                raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
            unknown = [k for k in raw if k not in STAGE_KEYS]
            if unknown:
                raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(STAGE_KEYS)}")
            name = str(raw.get("name") or f"stage{i}")
            if name in names:
                raise ConfigError(f"{where}: stage name {name!r} is used twice")
            names.add(name)
            replay = float(raw.get("replay", 0.0))
            if not 0.0 <= replay < 1.0:
                raise ConfigError(f"{where}.replay must be in [0, 1), got {raw.get('replay')!r}")
            if replay and i == 0:
                raise ConfigError(f"{where}.replay: the first stage has no earlier stage to replay")
            rewards = raw.get("rewards")
            if rewards is not None:
                from rewards import CombinedReward

                CombinedReward(rewards, where=f"{where}.rewards")  # names and kwargs checked before training
            grpo = raw.get("grpo")
            if grpo is not None and not isinstance(grpo, Mapping):
                raise ConfigError(f"{where}.grpo: expected a mapping of GRPO settings, got {grpo!r}")
            lr = raw.get("lr")
            if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0):
                raise ConfigError(f"{where}.lr: a positive learning rate is needed, got {lr!r}")
            if i == 0 and (lr is not None or raw.get("reset_optimizer") or raw.get("restart_schedule")):
                raise ConfigError(f"{where}: the first stage starts with the run's optimizer, train.lr and its "
                                  "schedule; reset_optimizer, restart_schedule and lr belong to a later stage")
            restart = raw.get("restart_schedule", raw.get("reset_optimizer", False))
            if not isinstance(restart, bool):
                raise ConfigError(f"{where}.restart_schedule: true or false, got {restart!r}")
            self.stages.append({
                "name": name, "keep": _selector(raw.get("select"), where), "rewards": rewards,
                "grpo": dict(grpo) if grpo else None, "replay": replay,
                "reset_reference": bool(raw.get("reset_reference", i > 0)),
                "reset_optimizer": bool(raw.get("reset_optimizer", False)), "restart_schedule": restart,
                "lr": None if lr is None else float(lr),
                "switch": _switch(raw.get("switch"), where) if i < len(stages) - 1 else None,
            })
            if not any(self.stages[-1]["keep"](s) for s in ctx.train_samples):
                raise ConfigError(f"{where}: select {raw.get('select')!r} keeps no training sample")
        self.current = -1  # no stage entered yet
        self.stage_step = 0
        self.metric_window: deque[float] = deque()
        self.sparsity_window: deque[float] = deque()
        self.best = -math.inf
        self.since_best = 0
        self.stage_rewards: list[float] = []
        self.replay_share = 0.0
        self.history: list[dict[str, Any]] = []

    # ----------------------------------------------------------------------------------------- stages
    def _pool(self, k: int) -> tuple[list[str], float]:
        stage = self.stages[k]
        samples = self.ctx.train_samples
        own = [s.id for s in samples if stage["keep"](s)]
        if not stage["replay"]:
            return own, 0.0
        mine = set(own)
        earlier = sorted({s.id for s in samples for e in self.stages[:k] if e["keep"](s)} - mine)
        want = round(len(own) * stage["replay"] / (1 - stage["replay"]))
        rng = random.Random(self.ctx.cfg.train.seed * 7919 + k)
        picked = rng.sample(earlier, min(want, len(earlier)))
        if len(picked) < want:
            tqdm.write(f"curriculum: stage {stage['name']!r} asks for {want} replayed samples, the earlier stages "
                       f"have {len(earlier)}; replaying all of them")
        return own + picked, len(picked) / max(1, len(own) + len(picked))

    def _enter(self, k: int, reason: str) -> None:
        stage = self.stages[k]
        pool, share = self._pool(k)
        self.ctx.set_stage(stage["name"], pool=pool, rewards=stage["rewards"], grpo=stage["grpo"],
                           reset_reference=stage["reset_reference"] and k > 0,  # carries reward state
                           reset_optimizer=stage["reset_optimizer"], lr=stage["lr"],
                           restart_schedule=stage["restart_schedule"] and k > 0,
                           schedule_steps=(stage["switch"] or {}).get("steps"))
        if self.current >= 0:
            self.history[-1].update(end_step=self.ctx.step, steps=self.stage_step, **self._stats())
        self.current, self.stage_step, self.replay_share = k, 0, share
        self.metric_window.clear()
        self.sparsity_window.clear()
        self.best, self.since_best = -math.inf, 0
        self.stage_rewards = []
        self.history.append({"stage": stage["name"], "index": k, "start_step": self.ctx.step, "reason": reason,
                             "pool": len(pool), "replayed": round(share * len(pool)),
                             "reference_reset": bool(stage["reset_reference"] and k > 0),
                             "optimizer_reset": stage["reset_optimizer"],
                             "schedule_restart": bool(stage["restart_schedule"] and k > 0), "lr": stage["lr"]})
        self._write()

    def _stats(self) -> dict[str, Any]:
        r = self.stage_rewards
        m, z = self.metric_window, self.sparsity_window
        return {"mean_reward": sum(r) / len(r) if r else None,
                "last_moving_metric": sum(m) / len(m) if m else None,
                "last_zero_variance_share": sum(z) / len(z) if z else None}

    def _write(self) -> None:
        run_dir = self.ctx.run_dir
        if run_dir is None:
            return
        doc = {"stages": [s["name"] for s in self.stages], "current": self.stages[self.current]["name"],
               "stage_step": self.stage_step, "history": self.history}
        (run_dir / "curriculum.json").write_text(json.dumps(doc, indent=1, default=float))

    def _due(self) -> str | None:
        """Why the current stage ends now (None: it goes on)."""
        sw = self.stages[self.current]["switch"]
        if sw is None:
            return None
        n = self.stage_step
        if sw["rule"] == "steps":
            return f"{n} steps" if n >= sw["steps"] else None
        if sw.get("max_steps") and n >= sw["max_steps"]:
            return f"max_steps {sw['max_steps']} reached"
        if n < sw["min_steps"]:
            return None
        if sw["rule"] == "plateau":
            if len(self.metric_window) >= sw["window"] and self.since_best >= sw["patience"]:
                return (f"plateau: moving {sw['metric']} {self.best:.4f} not beaten by {sw['min_delta']} "
                        f"for {self.since_best} steps")
            return None
        if len(self.sparsity_window) >= sw["window"]:
            share = sum(self.sparsity_window) / len(self.sparsity_window)
            if share >= float(sw["threshold"]):
                return f"sparsity: {share:.3f} of groups with zero reward variance >= {sw['threshold']}"
        return None

    # ----------------------------------------------------------------------------------------- hooks
    def on_train_start(self) -> None:
        if self.current < 0:
            self._enter(0, "start")

    def after_rewards(self, batch: RolloutBatch) -> None:
        spread = component_spread(batch)
        acc = getattr(self, "_spread", None) or {}
        for k, v in spread.items():
            acc.setdefault(k, []).append(v)
        self._spread = acc

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        self.stage_step += 1
        sw = self.stages[self.current]["switch"] or {}
        value = stats.get(sw.get("metric", "reward"))
        if isinstance(value, (int, float)) and math.isfinite(value):
            window = int(sw.get("window", 1))
            self.metric_window.append(float(value))
            while len(self.metric_window) > window:
                self.metric_window.popleft()
            moving = sum(self.metric_window) / len(self.metric_window)
            if len(self.metric_window) >= window and moving > self.best + float(sw.get("min_delta", 0.0)):
                self.best, self.since_best = moving, 0
            else:
                self.since_best += 1
        if isinstance(stats.get("reward"), (int, float)):
            self.stage_rewards.append(float(stats["reward"]))
        if isinstance(stats.get("informative_groups"), (int, float)):
            self.sparsity_window.append(1.0 - float(stats["informative_groups"]))
            while len(self.sparsity_window) > int(sw.get("window", 1)):
                self.sparsity_window.popleft()
        for k, vals in (getattr(self, "_spread", None) or {}).items():
            stats[f"reward_spread/{k}"] = sum(vals) / len(vals)
        self._spread = {}
        stats["curriculum/stage_index"] = self.current
        stats["curriculum/stage_step"] = self.stage_step
        if self.metric_window:
            stats["curriculum/moving_metric"] = sum(self.metric_window) / len(self.metric_window)
        if self.sparsity_window:
            stats["curriculum/zero_variance_share"] = sum(self.sparsity_window) / len(self.sparsity_window)
        stats["curriculum/replay_share"] = self.replay_share
        reason = self._due()
        switched = reason is not None and self.current + 1 < len(self.stages) and step < self.ctx.cfg.train.steps
        if switched:
            self._enter(self.current + 1, reason)
        stats["curriculum/switched"] = int(switched)
        if not switched and step >= self.ctx.cfg.train.steps:
            self.history[-1].update(end_step=step, steps=self.stage_step, **self._stats())
            self._write()

    # ----------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current, "stage_step": self.stage_step, "metric_window": list(self.metric_window),
                "sparsity_window": list(self.sparsity_window), "best": self.best if math.isfinite(self.best) else None,
                "since_best": self.since_best, "stage_rewards": list(self.stage_rewards),
                "replay_share": self.replay_share, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if int(state["current"]) >= len(self.stages):
            raise ConfigError(f"plugins.curriculum: the checkpoint is in stage {state['current']}, but only "
                              f"{len(self.stages)} stages are configured")
        self.current, self.stage_step = int(state["current"]), int(state["stage_step"])
        self.metric_window = deque(state.get("metric_window", []))
        self.sparsity_window = deque(state.get("sparsity_window", []))
        self.best = -math.inf if state.get("best") is None else float(state["best"])
        self.since_best = int(state.get("since_best", 0))
        self.stage_rewards = list(state.get("stage_rewards", []))
        self.replay_share = float(state.get("replay_share", 0.0))
        self.history = list(state.get("history", []))
