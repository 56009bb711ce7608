"""Training data shaped as users' data is, for the multi-rank tests: images, videos of different lengths (2 s
and 24 s), two questions on one video, text-only questions, and a corrupt video that only fails when a rank
decodes it mid-run (the media check is off). Plus the reward module the runs use and the overrides of a
seconds-long run on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

REWARD = '''
from rewards import register_reward


@register_reward("mixed_length")
def mixed_length(completions, id, **_):
    """Text-only questions score 1 whatever the answer (never informative: dynamic sampling drops their
    groups, so some rounds leave a rank nothing to train); the others score longer completions higher."""
    return [1.0 if i.startswith("text-") else len(c if isinstance(c, str) else c[-1]["content"]) / 10
            for c, i in zip(completions, id)]
'''


def make_mixed(root: Path) -> tuple[Path, Path]:
    """``(data file, reward module)`` under ``root``."""
    from data_pipelines.toy import make_toy

    toy = make_toy(root / "toy", 0, size={"train": 2, "val": 1, "test": 1},
                   tasks=["color", "needle", "color_image"], progress=False)
    by_task: dict[str, list[dict]] = {}
    for line in (toy / "train.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_task.setdefault(rec["meta"]["task"], []).append(rec)
    video = by_task["color"][0]
    records = [
        video, dict(video, id="video-again", question="Which colour is the ball, once more?"),
        by_task["needle"][0], by_task["color_image"][0], by_task["color_image"][1],
        {"id": "text-1", "problem_type": "open", "question": "Say a word.", "answer": "word", "media": []},
        {"id": "text-2", "problem_type": "open", "question": "Name a colour.", "answer": "red", "media": []},
        {"id": "bad-1", "problem_type": "open", "question": "What happens?", "answer": "x",
         "media": [{"type": "video", "path": "broken.mp4"}]},
    ]
    (toy / "broken.mp4").write_bytes(os.urandom(4000))
    data = toy / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    reward = root / "mixed_length.py"
    reward.write_text(REWARD)
    return data, reward


def mixed_run(data: Path, reward: Path) -> list[str]:
    """3 prompts a step on 2 ranks (one rank rolls out 2, the other 1), optimizer mini-batches of one group,
    dynamic sampling with top-up rounds, the corrupt video skipped on whichever rank draws it, a KL term."""
    return [
        "model.tiny_family=qwen2_5_vl", "model.init=random", f"data.train={data}", "data.check_media=none",
        "data.on_bad_sample=skip", "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
        "data.media.image_min_pixels=3136", "data.media.image_max_pixels=6272", "data.media.min_frames=2",
        "data.media.max_frames=8", "rollout.group_size=4", "rollout.max_new_tokens=4",
        "rollout.seed_per_prompt=true", "train.prompts_per_step=3", "train.micro_batch_size=3", "train.steps=4",
        "train.save_every=2", "train.log_every=0", "train.cpu_threads=1", "train.lr=1e-3", "sft.steps=0",
        "eval.before_rl=false", "eval.after_rl=false", "rewards=[{name: mixed_length}]", "grpo.kl_coef=0.01",
        "grpo.ppo_mini_batch_size=4", "grpo.dynamic_sampling=true", "grpo.max_draws=2", f"imports=[{reward}]",
    ]
