"""The rollout/training log-prob gap and truncated importance sampling (grpo.tis_cap)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from mmrl_common.errors import ConfigError

REWARD = """
from rewards import register_reward


@register_reward("t_text_length")
def t_text_length(completions, **_):
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
"""


@pytest.mark.usefixtures("module_cache")
@pytest.mark.slow
def test_hf_rollouts_have_no_gap_and_tis_scales_the_policy_gradient(tmp_path: Path) -> None:
    (tmp_path / "reward.py").write_text(REWARD)
    signal = ["rollout.record_logprobs=true", "train.steps=1", f"imports=[{tmp_path / 'reward.py'}]",
              "rewards=[{name: t_text_length}]"]  # rollouts of different lengths: advantages are not zero
    plain = run_rl(tmp_path / "a", *signal)[0]
    # HF generate's log-probs are the training pass's own (the same positions, the same model)
    assert plain["rollout_logprob_gap"] < 1e-5
    # p_train / p_rollout is 1 here: a cap of 1e-3 weights every token's policy-gradient term by 1e-3, and the
    # policy gradient is the whole gradient (no KL, no entropy term)
    capped = run_rl(tmp_path / "b", *signal, "grpo.tis_cap=0.001")[0]
    assert plain["reward"] == capped["reward"] and plain["reward_std"] > 0  # the same rollouts, a signal
    assert plain["grad_norm"] > 0
    assert capped["grad_norm"] == pytest.approx(1e-3 * plain["grad_norm"], rel=1e-3)


@pytest.mark.usefixtures("module_cache")
def test_tis_needs_the_rollout_log_probs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="record_logprobs"):
        run_rl(tmp_path, "grpo.tis_cap=2.0", "train.steps=1")
