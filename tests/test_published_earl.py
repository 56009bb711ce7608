"""configs/earl.yaml is EARL as published: its values against a table of the paper's settings.

The table is written from the paper ("Select Less, Reason More: Prioritizing Evidence Purity for Video
Reasoning", Li et al., arXiv 2510.15440 / CVPR 2026), as two third-party summaries report it
(docs/methods/earl.md, Sources; their section names are the paper's); it is not copied from the recipe. Values
the paper does not give are not in it.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmrl.config import load_run_config

PAPER = "arXiv 2510.15440"

# (setting, published value, source)
PUBLISHED: list[tuple[str, Any, str]] = [
    ("model.path", "Qwen2.5-VL-7B-Instruct", f"{PAPER}, Loss & Training: the backbone is Qwen2.5-VL-7B-Instruct"),
    ("data.media.nframes", 32, (f"{PAPER}, Overall Architecture: the video is sampled uniformly into at most 32 "
                               "frames; main results: '7B / 32 frames'")),
    ("data.media.max_frames", 32, f"{PAPER}, Overall Architecture: at most 32 frames in the visual context"),
    ("prompt.answer_format", "think_answer", (f"{PAPER}, Method: the trajectory alternates text reasoning and frame "
                                             "selection before the answer (figure: 'Think + Frames Selection')")),
    ("rollout.environment", "select_frames", (f"{PAPER}, Method: a frame-selection action on the current frames, "
                                             "followed by key-frame based localized re-sampling")),
    ("rollout.environment_kwargs.max_rounds", 2, (f"{PAPER}, Overall Architecture: at most 2 dynamic selections "
                                                 "per prompt")),
    ("rollout.environment_kwargs.max_new_frames", 16, (f"{PAPER}, Overall Architecture: up to N_max = 16 frames "
                                                      "re-sampled around the selected ones")),
    ("rollout.group_size", 8, f"{PAPER}, Loss & Training: 8 rollouts per prompt"),
    ("train.prompts_per_step", 256, f"{PAPER}, Loss & Training: 256 prompts per RL batch"),
    ("sft.lr", 1e-6, f"{PAPER}, Loss & Training: action-aware SFT at lr 1e-6"),
    ("sft.batch_size", 128, f"{PAPER}, Loss & Training: action-aware SFT at batch size 128"),
    ("reward.iou_threshold", 0.5, f"{PAPER}, Multi-component Reward: correctness gated at IoU 0.5"),
    ("reward.correct_reward", 1.0, f"{PAPER}, Multi-component Reward: correct answer and IoU >= 0.5 -> 1"),
    ("reward.partial_reward", 0.5, f"{PAPER}, Multi-component Reward: correct answer and IoU < 0.5 -> 0.5"),
    ("reward.wrong_reward", -1.0, f"{PAPER}, Multi-component Reward: wrong answer -> -1"),
    ("reward.schedule", "step", (f"{PAPER}, Dynamic Reward Adjustment: early weights while t/T <= P, late ones "
                                "after")),
]

REWARD_TERMS = [  # r_total = r_correct + alpha(t) r_action + beta(t) r_relevance, each term once, weight 1
    ("evidence_correct", f"{PAPER}, Multi-component Reward: r_correct (gated by IoU)"),
    ("evidence_action", f"{PAPER}, Multi-component Reward: r_action = 1 if any selection, times alpha(t)"),
    ("evidence_relevance", f"{PAPER}, Multi-component Reward: r_relevance = IoU(selected, gold), times beta(t)"),
]


@pytest.fixture(scope="module")
def recipe():
    return load_run_config("earl")


def _value(cfg: Any, key: str) -> Any:
    if key.startswith("reward."):
        (spec,) = [r for r in cfg.rewards if r.name == "evidence_correct"]
        return spec.kwargs[key.split(".", 1)[1]]
    value = cfg
    for part in key.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


@pytest.mark.parametrize("key, published, source", PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_value_is_the_published_one(recipe, key: str, published: Any, source: str) -> None:
    assert _value(recipe, key) == published, f"{key}: the paper gives {published!r} ({source})"


def test_reward_is_the_published_sum_of_three_terms(recipe) -> None:
    assert [(r.name, r.weight) for r in recipe.rewards] == [(name, 1.0) for name, _ in REWARD_TERMS], REWARD_TERMS
    settings = [r.kwargs for r in recipe.rewards]
    assert settings[0] == settings[1] == settings[2]  # one alpha(t), beta(t) and gate for the whole sum


def test_dynamic_adjustment_goes_from_exploration_to_purity(recipe) -> None:
    # Dynamic Reward Adjustment: early, alpha large and beta small (explore); late, alpha decreased and beta
    # increased (purity). The paper gives the direction, not the values.
    w = _value(recipe, "reward.alpha_early"), _value(recipe, "reward.alpha_late")
    b = _value(recipe, "reward.beta_early"), _value(recipe, "reward.beta_late")
    assert w[0] > w[1] >= 0 and 0 <= b[0] < b[1]
    assert 0 < _value(recipe, "reward.switch_at") < 1


def test_sft_warms_up_for_a_tenth_of_its_steps(recipe) -> None:
    # Loss & Training (one of the two summaries only, docs/methods/earl.md): 10 % warmup
    assert recipe.sft.warmup_steps == pytest.approx(0.1 * recipe.sft.steps)


def test_the_trajectory_writer_defaults_to_the_recipe(recipe) -> None:
    from mmrl.methods.earl.trajectories import DEFAULTS

    kw = recipe.rollout.environment_kwargs
    assert DEFAULTS["frames"] == recipe.data.media.nframes
    assert DEFAULTS["answer_format"] == recipe.prompt.answer_format
    assert (DEFAULTS["max_new_frames"], DEFAULTS["max_select"], DEFAULTS["max_rounds"]) == (
        kw["max_new_frames"], kw["max_select"], kw["max_rounds"])


def test_the_system_prompt_asks_for_reasoning_before_each_action(recipe) -> None:
    from mmrl.methods.earl.environment import instructions

    kw = recipe.rollout.environment_kwargs
    assert recipe.prompt.system == instructions(kw["max_rounds"], kw["max_select"], think=True)
