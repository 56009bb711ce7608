"""Reward functions and their registry.

Importing the package registers the built-in rewards: ``format``, ``accuracy``, ``token_f1``, ``rouge_l``,
``temporal_iou``. Reward functions have TRL's signature ``fn(completions, **columns) -> list[float | None]``.
"""

from rewards import accuracy as _accuracy  # noqa: F401 - registers the built-in rewards
from rewards import format as _format  # noqa: F401
from rewards import judge as _judge  # noqa: F401 - judge (a judge model behind an OpenAI-compatible endpoint)
from rewards import remote as _remote  # noqa: F401 - http (the user's reward server)
from rewards.accuracy import available_scorers, get_scorer, register_scorer, score_answer
from rewards.answers import (
    extract_answer,
    extract_choice,
    extract_yes_no,
    normalize_text,
    parse_number,
    parse_span,
)
from rewards.format import check_format
from rewards.metrics import rouge_l, temporal_iou, token_f1
from rewards.registry import (
    CombinedReward,
    RewardBreakdown,
    RewardError,
    RewardSpec,
    available_rewards,
    completion_to_text,
    compute_rewards,
    get_reward,
    normalize_completions,
    register_reward,
    unregister_reward,
)

__all__ = [
    "CombinedReward",
    "RewardBreakdown",
    "RewardError",
    "RewardSpec",
    "available_rewards",
    "available_scorers",
    "check_format",
    "completion_to_text",
    "compute_rewards",
    "extract_answer",
    "extract_choice",
    "extract_yes_no",
    "get_reward",
    "get_scorer",
    "normalize_completions",
    "normalize_text",
    "parse_number",
    "parse_span",
    "register_reward",
    "register_scorer",
    "rouge_l",
    "score_answer",
    "temporal_iou",
    "token_f1",
    "unregister_reward",
]
