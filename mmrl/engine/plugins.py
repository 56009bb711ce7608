"""Method plug-ins: hooks into the training loop without edits to the engine.

A plug-in subclasses :class:`Callback`, registers under a name with :func:`register_plugin`, and is turned
on by the run config (``plugins: {name: {settings}}``). The trainer calls every hook at a fixed point of
the step, so curricula (``ctx.set_stage``: switch the data pool, the rewards, the reference), reward
shapers that need the whole group (temporal contrast, length bonuses) and loggers all plug in here. Rewards,
samplers, environments, advantage estimators, losses and token shapers have registries of their own.

Plug-ins and samplers see the run through a :class:`StepContext`, not the trainer: the configuration, the
step, the samples, the rollout service (for extra gradient-free passes), rolling out and re-scoring prompts,
and switching the curriculum stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mmrl_common.errors import ConfigError
from mmrl_common.registry import Registry, did_you_mean

if TYPE_CHECKING:
    from mmrl.config import RunConfig
    from mmrl.engine.batch import RolloutBatch
    from mmrl.engine.service import RolloutService


class Run(Protocol):
    """What a :class:`StepContext` reads and calls of the run (:class:`mmrl.engine.trainer.GRPOTrainer` is the one
    implementation; named here so that this module needs nothing of the trainer's)."""

    cfg: RunConfig
    step: int
    stage: dict[str, Any]
    run_dir: Any
    train_samples: list[Any]
    eval_samples: list[Any]
    rewards: Any  # rewards.CombinedReward: .labels, .specs
    service: RolloutService
    policy: Any  # mmrl.model.Policy

    def rollout_prompts(self, indices: Sequence[int], *, n: int | None, hooks: bool) -> RolloutBatch: ...

    def use_rollout_strategy(self, strategy: Callable[..., Any]) -> None: ...

    def update_plan(self, batch: RolloutBatch) -> list[list[list[int]]]: ...

    def set_stage(self, name: str, **changes: Any) -> None: ...


class StepContext:
    """What a plug-in or a sampler may use of the run (built by the trainer; one per run).

    * ``cfg`` (the run configuration; a curriculum stage's GRPO settings included), ``step`` (steps done),
      ``stage`` (the curriculum stage's name), ``run_dir``, ``train_samples``, ``eval_samples``,
      ``reward_labels`` and ``reward_specs`` (the stage's rewards);
    * ``service``: the rollout service (gradient-free generation with the run's prompt, media and backend;
      ``service.policy`` for the tokenizer and the like);
    * :meth:`rollout`: roll out and score prompts of the training pool (no plug-in sees those rollouts);
    * :meth:`rescore`: the same over a pool, a chunk at a time, each chunk's media freed after it;
    * :meth:`set_stage`: switch the curriculum stage (pool, rewards, GRPO settings, reference).
    * :meth:`set_rollout_strategy`: how the training prompts are rolled out (default: ``run_episodes``);
    * :meth:`update_plan`: the optimizer steps and micro-batches the update of a batch runs.
    """

    def __init__(self, trainer: Run):
        self._trainer = trainer

    @property
    def cfg(self) -> RunConfig:
        return self._trainer.cfg

    @property
    def step(self) -> int:
        return self._trainer.step

    @property
    def stage(self) -> str:
        return str(self._trainer.stage["name"])

    @property
    def run_dir(self) -> Path:
        return Path(self._trainer.run_dir)

    @property
    def train_samples(self) -> list[Any]:
        return self._trainer.train_samples

    @property
    def eval_samples(self) -> list[Any]:
        return self._trainer.eval_samples

    @property
    def reward_labels(self) -> list[str]:
        return list(self._trainer.rewards.labels)

    @property
    def reward_specs(self) -> list[Any]:
        """The stage's reward entries (:class:`rewards.registry.RewardSpec`)."""
        return list(self._trainer.rewards.specs)

    @property
    def service(self) -> RolloutService:
        return self._trainer.service

    def rollout(self, indices: Sequence[int], *, n: int | None = None) -> RolloutBatch:
        """``n`` (default: the group size) rollouts of each of the sampler's prompts ``indices`` with the current
        policy, scored with the stage's rewards; no plug-in sees them."""
        return self._trainer.rollout_prompts(indices, n=n, hooks=False)

    def rescore(self, indices: Sequence[int], *, n: int, chunk: int) -> Iterator[RolloutBatch]:
        """:meth:`rollout` over ``indices``, ``chunk`` prompts at a time; each chunk's encoded media are freed
        once the caller moves on (the step's own media are encoded afterwards)."""
        indices = list(indices)
        for start in range(0, len(indices), max(1, int(chunk))):
            yield self.rollout(indices[start:start + chunk], n=n)
            self._trainer.policy.media.clear()

    def set_rollout_strategy(self, strategy: Callable[..., Any]) -> None:
        """Roll out the training prompts with ``strategy`` instead of :func:`mmrl.engine.rollout.run_episodes` (same
        signature and contract: :class:`mmrl.engine.rollout.RolloutStrategy`), e.g. rollouts that branch from
        prefixes of earlier ones. Every training rollout goes through it; evaluation does not."""
        self._trainer.use_rollout_strategy(strategy)

    def update_plan(self, batch: RolloutBatch) -> list[list[list[int]]]:
        """The update of ``batch``, in order: per optimizer step (every PPO epoch's mini-batches), the rows of its
        micro-batches, by the trainer's own rule (``train.micro_batch_size`` or ``train.micro_batch_tokens``;
        :func:`mmrl.engine.batch.update_plan`)."""
        return self._trainer.update_plan(batch)

    def set_stage(self, name: str, **changes: Any) -> None:
        """Switch the curriculum stage at a step boundary (:meth:`mmrl.engine.trainer.GRPOTrainer.set_stage`)."""
        self._trainer.set_stage(name, **changes)


class Callback:
    """Hooks at fixed points of every step, in this order (``batch`` is the step's
    :class:`~mmrl.engine.batch.RolloutBatch`; hooks may change it in place):

    1. ``after_rollout(batch)`` -- completions, turns, environment info; no rewards yet;
    2. ``after_rewards(batch)`` -- ``batch.rewards`` (total) and ``batch.reward_components``; change the totals
       here for group-level shaping (they feed dynamic sampling and the advantages);
    3. ``after_advantages(batch)`` -- ``batch.advantages``; set ``batch.seq_kl_weights``/``seq_loss_weights``
       or ``extra`` fields here;
    4. ``after_update(batch, stats)`` -- after the optimizer step(s);
    5. ``on_step_end(step, stats)`` -- the step is counted; switch a curriculum stage here
       (``trainer.set_stage``), entries added to ``stats`` are logged.

    Hooks 1-2 run once per generation round (dynamic sampling may draw several rounds per step), 3-4 once
    on the batch that trains. ``self.ctx`` is the run's :class:`StepContext`; ``ctx.service`` the rollout
    service for extra gradient-free passes.
    ``state_dict`` must return plain data (numbers, strings, lists, dicts, tensors): it is saved with
    every checkpoint and loaded without unpickling arbitrary objects.
    """

    SETTINGS: tuple[str, ...] | None = None
    """The setting names the plug-in takes; when given, any other name is refused with a
    :class:`ConfigError` that suggests the nearest one (None: the plug-in checks its settings itself)."""
    plugin_name: str = ""
    """The name it is registered under (set by :func:`register_plugin`)."""

    def __init__(self, ctx: StepContext, **settings: Any):
        known = type(self).SETTINGS
        if known is not None:
            where = f"plugins.{self.plugin_name or type(self).__name__}"
            for key in settings:
                if key not in known:
                    raise ConfigError(f"{where}.{key}: unknown setting; {did_you_mean(key, known)}"
                                      f"its settings: {', '.join(known) or '(none)'}")
        self.ctx = ctx
        self.settings = settings

    def on_train_start(self) -> None:
        """Before the first step (also after a resume)."""

    def after_rollout(self, batch: RolloutBatch) -> None:
        """The round's rollouts, before rewards."""

    def after_rewards(self, batch: RolloutBatch) -> None:
        """The round's rewards are in ``batch.rewards`` / ``batch.reward_components``."""

    def after_advantages(self, batch: RolloutBatch) -> None:
        """``batch.advantages`` are set; token shaping and the update follow."""

    def after_update(self, batch: RolloutBatch, stats: dict[str, Any]) -> None:
        """After the optimizer step(s) of this batch."""

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        """After the step; may add entries to ``stats`` (they are logged) or switch the stage."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


PLUGINS: Registry[Callable[..., Callback]] = Registry("plug-in", "plugins")


def register_plugin(name: str, **kwargs: Any) -> Callable[[type[Callback]], type[Callback]]:
    """Class decorator: register a :class:`Callback` subclass under ``name`` (``plugins: {name: {...}}``)."""
    def deco(cls: type[Callback]) -> type[Callback]:
        cls.plugin_name = name
        return PLUGINS.register(name, **kwargs)(cls)
    return deco


def build_plugins(settings: dict[str, dict[str, Any]], ctx: StepContext) -> dict[str, Callback]:
    return {name: PLUGINS.get(name)(ctx, **(kwargs or {})) for name, kwargs in settings.items()}
