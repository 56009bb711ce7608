"""Prompt samplers: which samples the next training step draws.

A sampler draws indices into the training set and may learn from the step's rollouts through
:meth:`Sampler.update`, which receives the step's whole rollout batch (rewards and their components,
completions, groups), which is how variance-aware sampling plugs in. Its
whole state (position, RNG, statistics) round-trips through ``state_dict`` so a resumed run draws exactly
the same prompts. Register new samplers with :func:`register_sampler`; the methods' own (``vas``,
``variance_filter``) register in their modules (:mod:`mmrl.methods`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mmrl_common.errors import ConfigError
from mmrl_common.registry import Registry, did_you_mean

SAMPLERS: Registry[Callable[..., Sampler]] = Registry("sampler", "data.sampler")
register_sampler = SAMPLERS.register


def make_sampler(name: str, samples: Sequence[Any], *, seed: int = 0, **kwargs: Any) -> Sampler:
    factory = SAMPLERS.get(name)
    if not samples:
        raise ConfigError("data.train: the training set is empty")
    check_settings(name, factory, kwargs)
    return factory(samples, seed=seed, **kwargs)


def check_settings(name: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """A :class:`ConfigError` for a ``data.sampler_kwargs`` key the sampler does not take (a factory that
    takes ``**kwargs`` accepts any)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "seed"]
    for key in kwargs:
        if key not in known:
            raise ConfigError(f"data.sampler_kwargs.{key}: sampler {name!r} has no such setting; "
                              f"{did_you_mean(key, known)}its settings: {', '.join(known) or '(none)'}")


class Sampler:
    def __init__(self, samples: Sequence[Any], *, seed: int = 0):
        self.samples = samples
        self.seed = seed

    def draw(self, n: int) -> list[int]:
        raise NotImplementedError

    def attach(self, ctx: Any) -> None:
        """Called once by the trainer after the sampler is built (and again after a curriculum stage
        builds a new one) with the run's :class:`mmrl.engine.plugins.StepContext`. Samplers that score their pool
        with the current policy keep it: ``ctx.rescore(indices, n=..., chunk=...)`` rolls out and scores the
        sampler's own prompt indices, a chunk at a time, as :class:`mmrl.engine.batch.RolloutBatch` objects."""

    def update(self, batch: Any) -> None:
        """Rollout feedback after every step: ``batch`` is the step's :class:`mmrl.engine.batch.RolloutBatch` with
        every drawn group (kept by dynamic sampling or not). ``batch.prompt_index`` holds the indices this
        sampler drew, ``batch.group_index`` the groups, ``batch.rewards`` the totals,
        ``batch.component("accuracy")`` one reward component, ``batch.completions`` the texts."""

    def metrics(self) -> dict[str, float]:
        """Numbers for this step's ``metrics.jsonl`` row (the trainer merges them into the step's stats
        right after :meth:`update`); name them ``<sampler>/<what>``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@register_sampler("uniform")
class UniformSampler(Sampler):
    """Shuffled passes over the data (a new permutation per epoch), without replacement within an epoch."""

    def __init__(self, samples: Sequence[Any], *, seed: int = 0):
        super().__init__(samples, seed=seed)
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(len(self.samples)).tolist()

    def draw(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
