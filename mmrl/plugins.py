"""Method plug-ins: hooks into the training loop without edits to the engine.

A plug-in subclasses :class:`Callback`, registers under a name with :func:`register_plugin`, and is turned
on by the run config (``plugins: {name: {settings}}``). The trainer calls every hook at a fixed point of
the step, so curricula (switch data stage, reset the KL reference), reward shapers that need the whole
group (temporal contrast, length bonuses), samplers' statistics and loggers all plug in here. Rewards,
samplers, environments, advantage estimators, losses and token shapers have registries of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from mmrl_common.registry import Registry

if TYPE_CHECKING:
    from mmrl.rollout import Episode
    from mmrl.trainer import GRPOTrainer


class Callback:
    def __init__(self, trainer: GRPOTrainer, **settings: Any):
        self.trainer = trainer
        self.settings = settings

    def on_train_start(self) -> None:
        """Before the first step (also after a resume)."""

    def on_rewards(self, episodes: list[Episode], rewards: torch.Tensor, components: dict[str, list[float]]
                   ) -> torch.Tensor:
        """Change the step's total rewards (one per episode, grouped by prompt); return them."""
        return rewards

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        """After the optimizer step; may add entries to ``stats`` (they are logged)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


PLUGINS: Registry[Callable[..., Callback]] = Registry("plug-in", "plugins")
register_plugin = PLUGINS.register


def build_plugins(settings: dict[str, dict[str, Any]], trainer: GRPOTrainer) -> dict[str, Callback]:
    return {name: PLUGINS.get(name)(trainer, **(kwargs or {})) for name, kwargs in settings.items()}
