"""configs/ares.yaml is ARES as released: its values equal the published settings below.

The table is written from the released code (the method that produced the published checkpoints) and the paper:
"code" = shawn0728/ARES experiments/AEPO/config.yaml, verl/workers/actor/config.py (ActorConfig defaults),
verl/workers/actor/dp_actor.py (the per-bucket KL controller), verl/trainer/ray_trainer.py (the threshold),
verl/workers/rollout/{config,vllm_rollout_spmd}.py and examples/reward_function/aepo.py; "paper" = the ARES
README and the paper's summaries (arXiv 2510.08457). The paper's additions (configs/ares-paper.yaml):
tests/test_ares_recipes.py.
"""

from __future__ import annotations

import pytest
from published import assert_published

PUBLISHED = [
    # (setting, value, source)
    ("rollout.group_size", 8, "code: experiments/AEPO/config.yaml rollout.n"),
    ("rollout.temperature", 1.0, "code: config.yaml rollout.temperature"),
    ("rollout.top_p", 0.99, "code: config.yaml rollout.top_p"),
    ("rollout.max_new_tokens", 8192, "code: config.yaml data.max_response_length"),
    ("rollout.stop", [], "code: vllm_rollout_spmd.py SamplingParams without stop strings"),
    ("prompt.template", "ares-math", "code: config.yaml data.format_prompt examples/format_prompt/math.jinja"),
    ("rewards[0].kwargs.answer_from", "boxed", "code: aepo.py accuracy_reward(extract_boxed_content(response))"),
    ("rewards[0].kwargs.grader", "mathruler", "code: aepo.py accuracy_reward: mathruler.grader.grade_answer"),
    ("rewards[1].weight", 0.0, "code: aepo.py overall = accuracy + entropy_score (format logged only)"),
    ("train.prompts_per_step", 512, "code: config.yaml data.rollout_batch_size"),
    ("grpo.ppo_mini_batch_size", 128 * 8, "code: config.yaml actor.global_batch_size 128 prompts x n 8"),
    ("grpo.ppo_epochs", 1, "code: ActorConfig ppo_epochs"),
    ("train.lr", 1e-6, "code: config.yaml actor.optim.lr"),
    ("train.weight_decay", 0.01, "code: config.yaml actor.optim.weight_decay"),
    ("train.warmup_steps", 0, "code: config.yaml (no warm-up)"),
    ("train.lr_schedule", "constant", "code: verl/workers/fsdp_workers.py (get_constant_schedule_with_warmup only)"),
    ("train.max_grad_norm", 1.0, "code: ActorConfig max_grad_norm"),
    ("grpo.advantage_estimator", "grpo", "code: config.yaml algorithm.adv_estimator"),
    ("grpo.clip_low", 0.2, "code: ActorConfig clip_ratio_low"),
    ("grpo.clip_high", 0.3, "code: ActorConfig clip_ratio_high"),
    ("grpo.dual_clip_c", 3.0, "code: ActorConfig clip_ratio_dual"),
    ("grpo.loss_agg", "token-mean", "code: ActorConfig loss_avg_mode token"),
    ("grpo.kl_estimator", "k3", "code: config.yaml kl_penalty low_var_kl"),
    ("grpo.kl_coef", 0.01, "code: config.yaml kl_coef"),
    ("grpo.dynamic_sampling", True, "code: config.yaml online_filtering true"),
    ("grpo.max_draws", 20 - 1, "code: config.yaml max_try_make_batch 20 (the first draw + 19)"),
    ("plugins.ares.window", 4, "code: rollout window_size 4"),
    ("plugins.ares.quantile", 0.95, "paper and code: per-rollout 95th percentile of window entropies"),
    ("plugins.ares.threshold_aggregate", "median", "code: ray_trainer.py np.median(batch_thresholds)"),
    ("plugins.ares.threshold_ema", 0.99, "code: ray_trainer.py 0.99 * ema + 0.01 * median"),
    ("plugins.ares.count_mode", "triggers", "code: vllm_rollout_spmd.py a trigger word followed by a window >= tau"),
    ("plugins.ares.shaping", "code", "code: aepo.py (the paper's formula is not public)"),
    ("plugins.ares.shaping_weight", 1.0, "code: aepo.py overall = accuracy + entropy_score"),
    ("plugins.ares.dynamic_kl", True, "paper (dynamic KL) and code: dynamic_kl_loss true"),
    ("plugins.ares.kl_target", {"easy": 0.01, "medium": 0.01, "hard": 0.01}, "code: dp_actor kl_target_default"),
    ("plugins.ares.kl_ema", 0.97, "code: dp_actor kl_ema_decay"),
    ("plugins.ares.kl_err_ema", 0.97, "code: dp_actor error EMA uses kl_ema_decay"),
    ("plugins.ares.kl_update_every", 100, "code: dp_actor kl_update_interval (micro-batch calls)"),
    ("plugins.ares.kl_call_rows", 8, ("code: dp_actor.py one controller call per micro-batch on each rank; "
                                      "experiments/AEPO/train.sh micro_batch_size_per_device_for_update=1 on "
                                      "n_gpus_per_node=8")),
    ("plugins.ares.kl_deadzone", 0.02, "code: dp_actor kl_deadzone"),
    ("plugins.ares.kl_step", 0.05, "code: dp_actor kl_beta_lr"),
    ("plugins.ares.kl_err_clip", 0.2, "code: dp_actor kl_beta_clip"),
    ("plugins.ares.hwe_kl_rho", 1.0, "code: dp_actor.py weights the KL per bucket only (no HWE relaxation)"),
    ("plugins.ares.branching", False, "code: vllm_rollout_spmd.py samples rollout.n plain rollouts per prompt"),
    ("sft.target", "adaptive_reasoning", "paper: AdaCS, trace length by difficulty"),
]


@pytest.mark.parametrize(("key", "value", "source"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_equals_the_published_setting(key, value, source):
    assert_published("ares", key, value, source)

