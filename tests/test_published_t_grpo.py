"""configs/t-grpo.yaml is T-GRPO as published (Video-R1, arXiv 2503.21776): its values equal the table below,
written from the paper, its README and its released training code (tulerfeng/Video-R1: src/scripts/
run_grpo_video.sh, run_grpo_vllm_qwen25vl.sh, src/r1-v/src/open_r1/grpo.py and trainer/, src/qwen-vl-utils), not
from the recipe."""

from __future__ import annotations

import pytest
from published import assert_published

from mmrl.config import load_run_config

# (config path, value, source)
PUBLISHED = [
    ("plugins.t_grpo.alpha", 0.3, "paper section 3.2: the temporal reward alpha = 0.3"),
    ("plugins.t_grpo.mu", 0.8, "vllm_grpo_trainer_modified.py: bonus when p >= 0.8 p~"),
    ("plugins.t_grpo.correct_threshold", 0.1, "grpo trainer: ordered rollouts with accuracy > 0.1"),
    ("plugins.t_grpo.exclude_identity", False, "grpo trainer: torch.randperm over the frames"),
    ("prompt.template", "video-r1", "grpo.py: QUESTION_TEMPLATE + TYPE_TEMPLATE, no system prompt"),
    ("rollout.group_size", 8, "scripts: --num_generations 8"),
    ("rollout.temperature", 1.0, "run_grpo_vllm_qwen25vl.sh: --temperature 1.0"),
    ("rollout.max_new_tokens", 768, "scripts: --max_completion_length 768"),
    ("data.media.max_frames", 16, "README: at most 16 frames in training; vision_process.py: FPS_MAX_FRAMES 16"),
    # grpo.py's media items carry no pixels, fps or frames: the constants of Video-R1's own qwen-vl-utils copy
    # (src/qwen-vl-utils/src/qwen_vl_utils/vision_process.py) size them; the processor's larger --max_pixels keeps them
    ("data.media.fps", 2.0, "vision_process.py: FPS 2.0"),
    ("data.media.min_frames", 4, "vision_process.py: FPS_MIN_FRAMES 4"),
    ("data.media.video_min_pixels", 128 * 28 * 28, "vision_process.py: VIDEO_MIN_PIXELS 128 * 28 * 28"),
    ("data.media.video_max_pixels", int(128 * 28 * 28 * 1.05),
     "vision_process.py fetch_video: max(min(VIDEO_MAX_PIXELS 128*28*28, total/nframes*2), int(VIDEO_MIN_PIXELS*1.05))"),
    ("data.media.image_min_pixels", 4 * 28 * 28, "vision_process.py fetch_image: MIN_PIXELS 4 * 28 * 28"),
    ("data.media.image_max_pixels", 256 * 28 * 28, "vision_process.py fetch_image: MAX_PIXELS 256 * 28 * 28"),
    ("grpo.kl_coef", 0.04, "scripts: --beta 0.04"),
    ("grpo.kl_estimator", "k3", "grpo trainer: per-token KL exp(x) - x - 1"),
    ("grpo.loss_agg", "seq-mean-token-mean", "grpo trainer: token mean per sequence, then mean over sequences"),
    ("rollout.top_p", 0.95, "vllm_grpo_trainer_modified.py: SamplingParams(temperature=1.0, top_p=0.95)"),
    ("train.lr", 1e-6, "scripts: --learning_rate 1e-6"),
    ("train.lr_schedule", "constant", "scripts: cosine over ~65k steps, 1.2k trained (README): >= 0.9992 x peak"),
    ("train.weight_decay", 0.01, "scripts: --weight_decay 0.01"),
    ("train.max_grad_norm", 5.0, "scripts: --max_grad_norm 5"),
    ("train.prompts_per_step", 4, "scripts: 4 processes x per-device batch 1 x accumulation 1"),
    ("train.steps", 1200, "README: about 1.2k RL steps"),
    ("grpo.adv_eps", 1e-4, "trainer/vllm_grpo_trainer_modified.py: (std_grouped_rewards + 1e-4)"),
]

# the rewards, summed unweighted (grpo.py: accuracy, format; the trainer's len_control length bonus)
PUBLISHED_REWARDS = {
    # grpo.py accuracy_reward: no <answer>...</answer> block scores 0; numbers by its numerical/regression rules
    "accuracy": (1.0, {"strict_tags": True, "numeric_scoring": "video-r1", "choice_scoring": "exact"}),
    "format": (1.0, {"mode": "think_answer"}),
    "length_bonus": (1.0, {"min_tokens": 320, "max_tokens": 512, "bonus": 0.2, "correct_threshold": 0.1,
                           "min_correct": 2}),
}


@pytest.mark.parametrize(("path", "value", "source"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_value_is_the_published_one(path: str, value: object, source: str) -> None:
    assert_published("t-grpo", path, value, source)


def test_shuffled_group_is_half_the_group() -> None:
    cfg = load_run_config("t-grpo")
    # grpo trainer: G/2 = 4 rollouts from the shuffled frames (null: the plug-in's group_size // 2)
    assert cfg.plugins["t_grpo"]["shuffled_size"] in (None, cfg.rollout.group_size // 2)


def test_rewards_are_video_r1s() -> None:
    cfg = load_run_config("t-grpo")
    got = {r.name: (r.weight, {k: r.kwargs[k] for k in PUBLISHED_REWARDS[r.name][1]}) for r in cfg.rewards}
    assert got == PUBLISHED_REWARDS


def _source_multiple_choice(content: str, solution: str) -> float:
    """Video-R1's multiple-choice reward, written from tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py
    (``accuracy_reward``): the text of the first <answer> block (``\\s*(.*?)\\s*``, else ""), stripped, equal to the
    solution's."""
    import re

    def extract(text: str) -> str:
        m = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.DOTALL)
        return m.group(1).strip() if m else ""

    return 1.0 if extract(content).strip() == extract(solution).strip() else 0.0


def test_multiple_choice_scores_as_video_r1_on_random_answers() -> None:
    """The recipe's accuracy reward against the source's rule on random answers, the forms the source scores 0
    ("B.", "b", "(B)", "B. blue", an answer outside the tags, tags in capitals) among them."""
    import random

    from rewards import CombinedReward

    cfg = load_run_config("t-grpo")
    accuracy = CombinedReward([r for r in cfg.rewards if r.name == "accuracy"])
    rng = random.Random(0)
    options = ["A. red", "B. blue", "C. green", "D. black"]
    forms = ["{L}", " {L} ", "{L}.", "{l}", "({L})", "{L}. {text}", "{text}", "Answer: {L}", "{L}\n"]
    completions, golds = [], []
    for _ in range(600):
        letter = rng.choice("ABCD")
        said = rng.choice("ABCD") if rng.random() < 0.3 else letter
        body = rng.choice(forms).format(L=said, l=said.lower(), text=options["ABCD".index(said)][3:])
        wrap = rng.choice(["<think>x</think><answer>{}</answer>", "<answer>{}</answer> trailing", "{}",
                           "<think>x</think><ANSWER>{}</ANSWER>", "<Answer>{}</Answer>"])  # re.search: case counts
        completions.append(wrap.format(body))
        golds.append(letter)
    n = len(completions)
    got = accuracy.compute(completions, {"id": list(range(n)), "problem_type": ["multiple_choice"] * n,
                                          "question": ["q"] * n, "options": [options] * n, "answer": golds}
                           ).components["accuracy"]
    want = [_source_multiple_choice(c, f"<answer>{g}</answer>") for c, g in zip(completions, golds)]
    assert got == want
    assert 0 < sum(want) < n and any(w == 0 and c.startswith("<think>x</think><answer>" + g + ".")
                                     for c, g, w in zip(completions, golds, want))  # "B." is among the zeros
