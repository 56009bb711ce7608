"""The n-gram repetition penalty (reward ``repetition_penalty``), as MMR1's released reward adds it to every
completion's score (LengSicong/MMR1, ``verl/utils/reward_score/openr1_rewards_batch.py``,
``get_repetition_penalty_reward``: the penalty of Yeo et al., arXiv 2502.03373, Appendix C.2).

A completion is cut into words by ``str.split`` (any whitespace) and lower-cased; its word ``ngram_size``-grams
are counted, and the penalty is ``max_penalty * (1 - distinct / total)``: 0 when no n-gram repeats, approaching
``max_penalty`` as one n-gram fills the whole completion. A completion of fewer than ``ngram_size`` words (an
empty one included) gets 0. Settings (``rewards[].kwargs``): ``ngram_size`` (default 40) and ``max_penalty``
(default -0.5, never positive), the released code's values (it calls the factory without arguments).
"""

from __future__ import annotations

from typing import Any

from mmrl_common.errors import ConfigError
from rewards.registry import normalize_completions, register_reward

__all__ = ["repetition_penalty", "repetition_penalty_reward"]


def repetition_penalty(text: str, *, ngram_size: int = 40, max_penalty: float = -0.5) -> float:
    """The penalty of one completion (see the module docstring)."""
    if len(text.split()) < ngram_size:  # the code counts the words before lower-casing
        return 0.0
    words = text.lower().split()
    total = len(words) - ngram_size + 1
    if total < 1:  # lower-casing that merged words (the code would divide by zero here)
        return 0.0
    distinct = len({tuple(words[i:i + ngram_size]) for i in range(total)})
    return (1.0 - distinct / total) * max_penalty


def _setting(columns: dict[str, Any], key: str, default: Any, n: int) -> Any:
    """A reward setting from the kwargs; a list as long as the batch is a dataset column of that name, not it."""
    value = columns.get(key, default)
    return default if value is None or (isinstance(value, (list, tuple)) and len(value) == n) else value


@register_reward("repetition_penalty")
def repetition_penalty_reward(completions: list[Any], **columns: Any) -> list[float]:
    """MMR1's n-gram repetition penalty of each completion (module docstring)."""
    texts = normalize_completions(completions)
    size = _setting(columns, "ngram_size", 40, len(texts))
    cap = _setting(columns, "max_penalty", -0.5, len(texts))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"rewards[].kwargs.ngram_size of repetition_penalty must be a whole number >= 1 "
                          f"(MMR1's is 40), got {size!r}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap <= 0:
        raise ConfigError(f"rewards[].kwargs.max_penalty of repetition_penalty must be a number <= 0 "
                          f"(MMR1's is -0.5), got {cap!r}")
    return [repetition_penalty(t, ngram_size=size, max_penalty=float(cap)) for t in texts]
