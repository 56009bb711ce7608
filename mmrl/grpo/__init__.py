"""GRPO building blocks: advantages, policy losses, aggregation, KL, DAPO filters, token shaping, config.

Every family has a registry (``register_xxx(name)`` decorator, ``get_xxx(name)`` raising
:class:`mmrl_common.errors.ConfigError` that lists the valid names), so methods add estimators, losses,
aggregations, KL estimators and token shapers from their own modules.
"""

from mmrl_common.registry import Registry

from . import cov_losses  # noqa: F401  (registers the clip_cov and kl_cov policy losses)
from .advantages import (
    GroupStats,
    broadcast_to_tokens,
    compute_advantages,
    get_advantage,
    group_inverse,
    register_advantage,
)
from .aggregate import (
    Denominators,
    GlobalCounts,
    aggregate,
    count_tokens_and_seqs,
    get_aggregation,
    global_counts,
    register_aggregation,
)
from .config import GRPOConfig
from .filters import (
    GroupAccumulator,
    accumulate_groups,
    dynamic_sampling_mask,
    informative_groups,
    overlong_keep_mask,
    soft_overlong_penalty,
)
from .kl import get_kl, kl_in_reward, kl_penalty, register_kl
from .losses import (
    PolicyLossOutput,
    get_policy_loss,
    gspo_loss,
    ppo_clip_loss,
    register_policy_loss,
    sequence_log_ratio,
)
from .policy_loss import compute_policy_loss
from .shaping import (
    ShapingInput,
    ShapingOutput,
    TokenShaper,
    build_shaper,
    get_shaper,
    register_shaper,
)

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
