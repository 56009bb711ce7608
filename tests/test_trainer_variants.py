"""The GRPO trainer's configurable paths run for real on the tiny model: PPO epochs with stored old
log-probs, KL as a loss and in the reward, dynamic sampling, overlong shaping, GSPO / RLOO / other
aggregations, bf16, freeze switches, a multi-turn environment, and a plug-in callback that rewrites rewards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.run import train

pytestmark = pytest.mark.usefixtures("module_cache")


@pytest.mark.slow
def test_ppo_epochs_with_kl_loss(tmp_path: Path) -> None:
    # random-model rewards are all equal (zero advantages); the entropy bonus moves the policy anyway
    rows = run_rl(tmp_path, "grpo.ppo_epochs=2", "grpo.kl_coef=0.1", "grpo.kl_estimator=k3", "grpo.entropy_coef=0.05")
    assert [r["step"] for r in rows] == [1, 2]
    # the reference starts equal to the policy, so KL grows as the policy moves away from it
    assert 0 <= rows[0]["kl"] < rows[1]["kl"]
    assert "kl_loss" in rows[1]


@pytest.mark.slow
def test_kl_in_reward_dynamic_sampling_and_overlong(tmp_path: Path) -> None:
    rows = run_rl(tmp_path, "grpo.kl_coef=0.1", "grpo.kl_in_reward=true", "grpo.kl_estimator=k1",
               "grpo.dynamic_sampling=true", "grpo.max_draws=2",
               "grpo.overlong_filter=true", "grpo.overlong_penalty=true", "grpo.max_response_length=4",
               "grpo.overlong_cache=2")
    for r in rows:
        # every completion is cut at 4 tokens = max_response_length: full penalty, so every group's rewards
        # are equal, dynamic sampling drops them all and draws again, 1 + max_draws rounds in all
        assert r["reward/overlong_penalty"] == pytest.approx(-1.0)
        assert r["generation_rounds"] == 3 and r["groups_dropped"] == 6
        assert r.get("skipped_update") == 1


@pytest.mark.parametrize("overrides", [
    ["grpo.policy_loss=gspo", "grpo.advantage_estimator=rloo"],
    ["grpo.advantage_estimator=dr_grpo", "grpo.loss_agg=seq-mean-token-sum-norm", "grpo.loss_norm_const=8"],
    ["grpo.advantage_estimator=batch_std", "grpo.loss_agg=seq-mean-token-mean", "grpo.dual_clip_c=3.0"],
    ["model.dtype=bf16"],
])
@pytest.mark.slow
def test_loss_variants_run(tmp_path: Path, overrides: list[str]) -> None:
    rows = run_rl(tmp_path, *overrides)
    assert len(rows) == 2
    assert all(r["grad_norm"] == r["grad_norm"] for r in rows)  # finite (not NaN)


@pytest.mark.slow
def test_frozen_vision_tower_does_not_change(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from mmrl.toy.tiny_models import ensure_tiny

    run_rl(tmp_path, "model.freeze_vision=true", "model.freeze_merger=true", "grpo.entropy_coef=0.05")
    before = load_file(next(ensure_tiny("qwen2_5_vl").glob("*.safetensors")))
    after = load_file(tmp_path / "run" / "final" / "model.safetensors")
    visual = [k for k in before if "visual" in k]
    text = [k for k in before if "visual" not in k and "embed" not in k]
    assert visual and all(torch.equal(before[k], after[k]) for k in visual)
    assert any(not torch.equal(before[k], after[k]) for k in text)  # the language model did train


@pytest.mark.slow
def test_multi_turn_environment_in_training(tmp_path: Path) -> None:
    rows = run_rl(tmp_path, "data.toy_tasks=[scan]", "data.problem_types=[yes_no]", "rollout.environment=zoom",
               "rollout.max_turns=2", "rollout.max_new_tokens=6", task="image-qa")
    assert len(rows) == 2
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert any(len(r["turns"]) == 2 for r in rollouts)  # the environment answered and the policy took a 2nd turn


@register_plugin("test_reward_bonus")
class RewardBonus(Callback):
    """Adds a constant to every reward and records the hooks it saw."""

    calls: ClassVar[list[str]] = []

    def on_train_start(self) -> None:
        RewardBonus.calls.append("start")

    def after_rollout(self, batch) -> None:
        RewardBonus.calls.append("rollout")

    def after_rewards(self, batch) -> None:
        RewardBonus.calls.append("rewards")
        batch.rewards = batch.rewards + self.settings["bonus"]

    def after_advantages(self, batch) -> None:
        RewardBonus.calls.append("advantages")

    def after_update(self, batch, stats) -> None:
        RewardBonus.calls.append("update")

    def on_step_end(self, step, stats) -> None:
        stats["plugin_step"] = step


@pytest.mark.slow
def test_plugin_callback_hooks(tmp_path: Path) -> None:
    RewardBonus.calls.clear()
    rows = run_rl(tmp_path, "plugins={test_reward_bonus: {bonus: 10.0}}")
    assert RewardBonus.calls == ["start"] + ["rollout", "rewards", "advantages", "update"] * 2
    assert all(r["reward"] >= 10.0 for r in rows)
    assert [r["plugin_step"] for r in rows] == [1, 2]


def _corrupt_first_train_video(tmp_path: Path) -> Path:
    """A copy of a tiny toy set whose first training video is cut to a third of its bytes."""
    from data_pipelines.toy import make_toy

    toy = make_toy(tmp_path / "toy", 0, size={"train": 4, "val": 0, "test": 2}, tasks=["color"], progress=False)
    first = json.loads((toy / "train.jsonl").read_text().splitlines()[0])
    video = toy / first["media"][0]["path"]
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    return toy


@pytest.mark.slow
def test_corrupt_video_is_skipped_when_asked(tmp_path: Path) -> None:
    toy = _corrupt_first_train_video(tmp_path)
    cfg = load_run_config("video-qa", overrides=[
        *TINY_RUN, f"data.train={toy / 'train.jsonl'}", f"data.test={toy / 'test.jsonl'}",
        "data.on_bad_sample=skip", "train.prompts_per_step=4",  # step 1 draws all four samples
        "data.check_media=none"])  # the check at load would drop it first: this tests the step's own check
    summary = train(cfg, run_dir=tmp_path / "run", show_progress=False)
    assert summary["stages"]["rl"]["steps"] == 2
    assert summary["stages"]["rl"]["skipped_samples"] >= 1


def test_corrupt_video_names_sample_and_file_when_not_skipping(tmp_path: Path) -> None:
    from mmrl_common.errors import MmrlError

    toy = _corrupt_first_train_video(tmp_path)
    first = json.loads((toy / "train.jsonl").read_text().splitlines()[0])
    cfg = load_run_config("video-qa", overrides=[
        *TINY_RUN, f"data.train={toy / 'train.jsonl'}", f"data.test={toy / 'test.jsonl'}", "train.prompts_per_step=4",
        "data.check_media=none"])  # as above: the step's own check
    with pytest.raises(MmrlError, match=rf"sample {first['id']}: .*{first['media'][0]['path'].split('/')[-1]}.*skip"):
        train(cfg, run_dir=tmp_path / "run", show_progress=False)


@pytest.mark.slow
def test_rollout_log_steps_match_metrics_and_resume_keeps_the_run_config(tmp_path: Path) -> None:
    from mmrl import cli

    out = tmp_path / "r"
    overrides = [*TINY_RUN, "train.steps=3", "train.save_every=1", "train.log_rollouts=2", "grpo.entropy_coef=0.05"]
    assert cli.main(["train", "--quiet", "--out", str(out), *overrides]) == 0
    rollouts = [json.loads(line)["step"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    metrics = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
               if json.loads(line)["stage"] == "rl"]
    assert rollouts == [1, 1, 2, 2, 3, 3] and metrics == [1, 2, 3]
    # --resume without repeating the overrides continues with the run's own settings, not the recipe's
    assert cli.main(["train", "--quiet", "--out", str(out), "--resume"]) == 0
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["steps"] == 3 and saved["rollout"]["group_size"] == 4
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["stage"] == "rl"] == [1, 2, 3]


def test_evaluation_releases_media_after_each_batch(tmp_path: Path) -> None:
    from data_pipelines.loaders import load_samples
    from data_pipelines.toy import make_toy
    from mmrl.engine.evaluate import evaluate
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import ensure_tiny

    toy = make_toy(tmp_path / "toy", 0, size={"train": 0, "val": 0, "test": 4}, tasks=["color"], progress=False)
    samples = load_samples(toy / "test.jsonl").samples
    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    policy = load_policy(ensure_tiny("qwen2_5_vl"))
    seen: list[int] = []
    original = policy.generate

    def spy(*args, **kwargs):
        seen.append(len(policy.media))
        return original(*args, **kwargs)

    policy.generate = spy
    cfg.rollout.stop = ["</answer>"]
    metrics, _ = evaluate(RolloutService.from_config(policy, cfg), samples, max_new_tokens=4, batch_size=2,
                          show_progress=False)
    assert metrics["n_total"] == 4 and seen == [2, 2] and len(policy.media) == 0
