"""configs/vas.yaml is VAS as published (MMR1, arXiv 2509.21268): its values equal the table below, written
from the paper (section 6.1, Algorithm 1, Appendix C Table 6), not from the recipe. Where the paper and the
released code (LengSicong/MMR1) differ the recipe takes the paper and ``released_code`` / ``weighting:
minmax`` selects the code."""

from __future__ import annotations

import pytest
from published import assert_published

from mmrl.config import load_run_config

# (config path, value, source)
PUBLISHED = [
    ("data.sampler", "vas", "Algorithm 1: the variance-aware sampler"),
    ("prompt.template", "mmr1", "code (LengSicong/MMR1): examples/mmr1/train_qwen2_5_vl_7b.sh SYSTEM_PROMPT"),
    ("data.sampler_kwargs.alpha", 0.8, "section 6.1: alpha (OVS) 0.8"),
    ("data.sampler_kwargs.beta", 0.2, "section 6.1: beta (TDS) 0.2"),
    ("data.sampler_kwargs.mix", 0.5, "section 6.1: lambda 0.5"),
    ("data.sampler_kwargs.weighting", "proportional", "Algorithm 1: drawn with probability proportional to VPS"),
    ("data.sampler_kwargs.update_every", 35, "section 6.1: T_update 35"),
    ("data.sampler_kwargs.score_rollouts", 32, "section 6.1: N 32 rollouts per prompt for the scores"),
    ("data.sampler_kwargs.diversity", "self_bleu", "section 3.1: TDS e.g. inverse self-BLEU"),
    ("data.sampler_kwargs.released_code", False, "the paper's method, not the released code's variant"),
    ("rollout.group_size", 8, "Table 6: n = 8 samples per prompt"),
    ("rollout.temperature", 0.6, "Table 6: temperature 0.6"),
    ("rollout.max_new_tokens", 4096, "Table 6: max response length 4096"),
    ("grpo.advantage_estimator", "grpo", "Table 6: adv_estimator grpo"),
    ("grpo.kl_estimator", "k3", "Table 6: KL loss, low_var_kl"),
    ("grpo.kl_coef", 0.01, "Table 6: KL coefficient 0.01"),
    ("grpo.clip_low", 0.2, "Table 6: clip 0.2"),
    ("grpo.clip_high", 0.2, "Table 6: clip 0.2"),
    ("train.lr", 1e-6, "Table 6: AdamW lr 1e-6"),
    ("train.weight_decay", 0.01, "Table 6: weight decay 0.01"),
    ("train.warmup_steps", 0, "Table 6: no warm-up"),
    ("train.lr_schedule", "constant", "code: verl/workers/fsdp_workers.py get_constant_schedule_with_warmup"),
    ("train.max_grad_norm", 1.0, "Table 6: max grad norm 1.0"),
    ("train.prompts_per_step", 512, "Table 6: global batch 512"),
    # the released reward (LengSicong/MMR1 verl/utils/reward_score/openr1_rewards_batch.py,
    # openr1_compute_score_batch_wo_LMM: accuracy + format + cosine length (0 in examples/mmr1.yaml) + repetition)
    ("rewards[1].kwargs.mode", "mmr1", "code: format_reward_batch, a <think> line start and an <answer> line end"),
    ("rewards[2].weight", 1.0, "code: overall = accuracy + format + cosine length + repetition penalty"),
    ("rewards[2].kwargs.ngram_size", 40, "code: get_repetition_penalty_reward(ngram_size=40)"),
    ("rewards[2].kwargs.max_penalty", -0.5, "code: get_repetition_penalty_reward(max_penalty=-0.5)"),
]


@pytest.mark.parametrize(("path", "value", "source"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_value_is_the_published_one(path: str, value: object, source: str) -> None:
    assert_published("vas", path, value, source)


def test_the_sampler_built_from_the_recipe_draws_in_proportion_to_vps() -> None:
    from data_pipelines.samplers import make_sampler
    from mmrl.methods import vas  # noqa: F401  (registers the sampler)

    s = make_sampler("vas", list(range(3)), seed=0, **load_run_config("vas").data.sampler_kwargs)
    for i, p in enumerate([0.5, 0.25, 1.0]):
        s.set_scores(i, p, 0.0, step=0)
    vps = [0.8 * 0.25, 0.8 * 0.1875, 0.0]
    assert s.probabilities().tolist() == pytest.approx([v / sum(vps) for v in vps])
