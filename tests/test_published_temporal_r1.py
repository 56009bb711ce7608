"""configs/temporal-grounding.yaml is Temporal-R1 as released (arXiv 2506.01908, appletea233/Temporal-R1): its
values equal the table below, written from the released TVG code (examples/run_qwen2_5_vl_3b_tvg.sh over
examples/grpo_example.yaml, verl/utils/reward_score/tvg.py, verl/workers/actor/config.py), not from the
recipe. The paper's own training settings are not public; the README's results came from this code."""

from __future__ import annotations

import pytest
from published import assert_published

from mmrl.config import load_run_config

# (config path, value, source)
PUBLISHED = [
    ("rollout.group_size", 8, "run_qwen2_5_vl_3b_tvg.sh: worker.rollout.n=8"),
    ("rollout.temperature", 1.0, "grpo_example.yaml: worker.rollout.temperature 1.0"),
    ("rollout.max_new_tokens", 2048, "run_qwen2_5_vl_3b_tvg.sh: data.max_response_length=2048"),
    ("grpo.kl_coef", 1e-2, "run_qwen2_5_vl_3b_tvg.sh: worker.actor.kl_loss_coef=1e-2"),
    ("grpo.kl_estimator", "k3", "grpo_example.yaml: kl_loss_type low_var_kl"),
    ("grpo.entropy_coef", 1e-3, "run_qwen2_5_vl_3b_tvg.sh: worker.actor.entropy_coeff=1e-3"),
    ("grpo.clip_low", 0.2, "verl/workers/actor/config.py: clip_ratio 0.2"),
    ("grpo.clip_high", 0.2, "verl/workers/actor/config.py: clip_ratio 0.2"),
    ("train.lr", 1e-6, "grpo_example.yaml: optim lr 1e-6"),
    ("train.weight_decay", 1e-2, "grpo_example.yaml: weight_decay 1e-2"),
    ("train.warmup_steps", 0, "grpo_example.yaml: lr_warmup_ratio 0"),
    ("train.lr_schedule", "constant", "verl/workers/fsdp_workers.py: get_constant_schedule_with_warmup"),
    ("train.max_grad_norm", 1.0, "grpo_example.yaml: max_grad_norm 1.0"),
    ("train.prompts_per_step", 16, "run_qwen2_5_vl_3b_tvg.sh: data.rollout_batch_size=16"),
    ("data.media.video_min_pixels", 3136, "run_qwen2_5_vl_3b_tvg.sh: data.min_pixels=3136"),
    ("data.media.video_total_pixels", 1605632,
     ("run_qwen2_5_vl_3b_tvg.sh: data.max_pixels=1605632, passed to qwen-vl-utils as the video's total_pixels "
      "(verl/utils/dataset_video.py)")),
    ("data.media.video_max_pixels", 768 * 28 * 28, "dataset_video.py gives no max_pixels: qwen-vl-utils' VIDEO_MAX_PIXELS"),
    ("data.media.fps", 2.0, "dataset_video.py gives no fps: qwen-vl-utils' FPS 2.0"),
    ("data.media.min_frames", 4, "dataset_video.py gives no frame count: qwen-vl-utils' FPS_MIN_FRAMES 4"),
    ("data.media.max_frames", 768, "dataset_video.py gives no frame count: qwen-vl-utils' FPS_MAX_FRAMES 768"),
    ("sft.steps", 0, "the TVG script runs RL from Qwen2.5-VL-3B-Instruct"),
    ("prompt.template", "temporal-r1", "verl/utils/dataset_video.py: the video, then the problem text alone"),
    ("prompt.system", ("You FIRST think about the reasoning process as an internal monologue and then provide the "
                       "final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final "
                       "answer MUST BE put in <answer> </answer> tags. Output the final answer in JSON format."),
     "run_qwen2_5_vl_3b_tvg.sh SYSTEM_PROMPT as data.system_prompt (OmegaConf.from_cli folds its line break)"),
]

# tvg.py at HEAD: 0.5 tIoU + 0.5 format (think, then answer), tIoU on the span as predicted
PUBLISHED_REWARD = {"format_weight": 0.5, "iou_weight": 0.5, "format_mode": "think_answer", "clip_to_shown": False,
                    "strict_tags": True}  # tvg.py: the first <answer> block or 0


@pytest.mark.parametrize(("path", "value", "source"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_value_is_the_published_one(path: str, value: object, source: str) -> None:
    assert_published("temporal-grounding", path, value, source)


def test_dual_reward_is_the_released_one() -> None:
    cfg = load_run_config("temporal-grounding")
    (spec,) = [r for r in cfg.rewards if r.name == "temporal_r1"]
    assert {k: spec.kwargs[k] for k in PUBLISHED_REWARD} == PUBLISHED_REWARD
