"""GRPO building blocks: advantages, policy losses, aggregation, KL, DAPO filters, token shaping, config.

Every family has a registry (``register_xxx(name)`` decorator, ``get_xxx(name)`` raising
:class:`mmrl_common.errors.ConfigError` that lists the valid names), so methods add estimators, losses,
aggregations, KL estimators and token shapers from their own modules. The registries and the built-in names
live in :mod:`mmrl.grpo.names`, without torch.

A lazy front: importing the package (or its torch-free modules :mod:`mmrl.grpo.config` and
:mod:`mmrl.grpo.names`) imports no torch; a name below is imported from its module on first use
(``from mmrl.grpo import compute_advantages`` imports :mod:`mmrl.grpo.advantages`).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from mmrl_common.lazy_front import lazy_front
from mmrl_common.registry import Registry

# the module of the package that defines each name
_HOMES: dict[str, tuple[str, ...]] = {
    "advantages": ("GroupStats", "broadcast_to_tokens", "compute_advantages", "get_advantage", "group_inverse",
                   "register_advantage"),
    "aggregate": ("Denominators", "GlobalCounts", "aggregate", "count_tokens_and_seqs", "get_aggregation",
                  "global_counts", "register_aggregation"),
    "config": ("GRPOConfig",),
    "filters": ("GroupAccumulator", "accumulate_groups", "dynamic_sampling_mask", "informative_groups",
                "overlong_keep_mask", "soft_overlong_penalty"),
    "kl": ("get_kl", "kl_in_reward", "kl_penalty", "register_kl"),
    "losses": ("PolicyLossOutput", "get_policy_loss", "gspo_loss", "ppo_clip_loss", "register_policy_loss",
               "sequence_log_ratio"),
    "policy_loss": ("compute_policy_loss",),
    "shaping": ("ShapingInput", "ShapingOutput", "TokenShaper", "build_shaper", "get_shaper", "register_shaper"),
}

__all__ = [
    "Denominators", "GRPOConfig", "GlobalCounts", "GroupAccumulator", "GroupStats", "PolicyLossOutput",
    "Registry", "ShapingInput", "ShapingOutput", "TokenShaper", "accumulate_groups", "aggregate",
    "broadcast_to_tokens", "build_shaper", "compute_advantages", "compute_policy_loss",
    "count_tokens_and_seqs", "dynamic_sampling_mask", "get_advantage", "get_aggregation", "get_kl",
    "get_policy_loss", "get_shaper", "global_counts", "group_inverse", "gspo_loss", "informative_groups",
    "kl_in_reward", "kl_penalty", "overlong_keep_mask", "ppo_clip_loss", "register_advantage",
    "register_aggregation", "register_kl", "register_policy_loss", "register_shaper", "sequence_log_ratio",
    "soft_overlong_penalty",
]


def _load(home: str) -> dict[str, Any]:
    """The names of the package's module ``home`` (import statements: ``tests/test_layers.py`` reads them)."""
    if home == "advantages":
        from .advantages import (  # noqa: F401  (the names are returned by locals())
            GroupStats,
            broadcast_to_tokens,
            compute_advantages,
            get_advantage,
            group_inverse,
            register_advantage,
        )
    elif home == "aggregate":
        from .aggregate import (  # noqa: F401  (the names are returned by locals())
            Denominators,
            GlobalCounts,
            aggregate,
            count_tokens_and_seqs,
            get_aggregation,
            global_counts,
            register_aggregation,
        )
    elif home == "config":
        from .config import GRPOConfig  # noqa: F401
    elif home == "filters":
        from .filters import (  # noqa: F401  (the names are returned by locals())
            GroupAccumulator,
            accumulate_groups,
            dynamic_sampling_mask,
            informative_groups,
            overlong_keep_mask,
            soft_overlong_penalty,
        )
    elif home == "kl":
        from .kl import get_kl, kl_in_reward, kl_penalty, register_kl  # noqa: F401
    elif home == "losses":
        from .losses import (  # noqa: F401  (the names are returned by locals())
            PolicyLossOutput,
            get_policy_loss,
            gspo_loss,
            ppo_clip_loss,
            register_policy_loss,
            sequence_log_ratio,
        )
    elif home == "policy_loss":
        from .policy_loss import compute_policy_loss  # noqa: F401
    elif home == "shaping":
        from .shaping import (  # noqa: F401  (the names are returned by locals())
            ShapingInput,
            ShapingOutput,
            TokenShaper,
            build_shaper,
            get_shaper,
            register_shaper,
        )
    return {k: v for k, v in locals().items() if k != "home"}


__getattr__, __dir__ = lazy_front(globals(), _HOMES, _load)


class _Front(ModuleType):
    """This package's module type. ``aggregate`` is both a module of the package and the function it exports
    (:func:`mmrl.grpo.aggregate.aggregate`): the import system binds a submodule on its package when it first
    imports it, which would shadow the function, so the package's ``aggregate`` is always the function."""

    @property
    def aggregate(self) -> Any:
        from .aggregate import aggregate

        return aggregate

    @aggregate.setter
    def aggregate(self, value: Any) -> None:  # the submodule, bound by the import system: the name stays the function
        pass


sys.modules[__name__].__class__ = _Front
