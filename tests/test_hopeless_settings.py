"""Settings that cannot train are refused when the configuration loads; a NaN never reaches the weights; a run
whose updates are mostly skipped as non-finite stops with a report that says why (issue 46)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 (module_cache is a fixture)

from mmrl import cli
from mmrl.config import load_run_config
from mmrl_common.errors import ConfigError

pytestmark = pytest.mark.usefixtures("module_cache")


@pytest.mark.parametrize("setting", [
    "train.lr=inf", "train.lr=nan", "train.lr=-1", "train.lr=0", "sft.lr=nan", "sft.lr=-1e-4",
    "grpo.kl_coef=nan", "grpo.kl_coef=-0.1", "grpo.entropy_coef=inf", "grpo.entropy_coef=nan",
    "grpo.clip_low=nan", "grpo.clip_high=inf", "grpo.tis_cap=nan", "grpo.adv_eps=nan", "grpo.dual_clip_c=nan",
    "grpo.kl_clamp=inf", "grpo.loss_norm_const=nan", "grpo.overlong_penalty_factor=nan",
    "train.max_grad_norm=nan", "train.max_grad_norm=inf", "train.max_grad_norm=0", "train.weight_decay=-0.1",
    "train.weight_decay=nan", "train.min_lr_ratio=nan", "train.min_lr_ratio=2", "train.adam_betas=[0.9, 1.0]",
    "train.adam_betas=[nan, 0.999]", "train.max_skipped_updates_frac=0", "train.max_skipped_updates_frac=nan",
    "train.dist_timeout_minutes=nan", "rollout.temperature=nan", "rollout.temperature=inf", "rollout.top_p=nan",
])
def test_a_setting_that_cannot_train_is_refused_with_the_key_value_and_range(setting: str) -> None:
    key, value = setting.split("=")
    with pytest.raises(ConfigError) as err:
        load_run_config("video-qa", overrides=[setting])
    text = str(err.value)
    assert text.startswith(key.split("[")[0]) and "must be" in text, text
    if "[" not in value:
        assert f"={float(value)!r}" in text or f"={value}" in text, text


def test_the_edges_of_the_ranges_are_accepted() -> None:
    cfg = load_run_config("video-qa", overrides=[
        "grpo.kl_coef=0", "grpo.entropy_coef=-0.01", "grpo.tis_cap=0", "train.min_lr_ratio=1", "train.weight_decay=0",
        "train.max_skipped_updates_frac=1", "train.adam_betas=[0, 0.5]", "train.lr=3e-4"])
    assert cfg.train.max_skipped_updates_frac == 1 and cfg.grpo.entropy_coef == -0.01


def test_an_infinite_learning_rate_stops_the_command_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--quiet", "--out", str(out), "train.lr=inf"]) == 2
    err = capsys.readouterr().err
    assert "train.lr=inf: must be a finite number > 0" in err and "Traceback" not in err
    assert not out.exists()


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def make_trainer(tmp_path: Path, *overrides: str):
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, "grpo.entropy_coef=0.01", "train.warmup_steps=0",
                                                 *overrides])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), device="cpu")
    (tmp_path / "run").mkdir()
    return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path / "run", show_progress=False)


def test_a_learning_rate_that_slips_past_the_settings_never_reaches_the_weights(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    for group in trainer.optimizer.param_groups:  # as a plug-in that set the learning rate itself might
        group["lr"] = float("inf")
    before = _weights(trainer)
    stats = trainer.train_step()
    assert stats["skipped_updates"] == 1 and stats["optimizer_steps"] == 0
    after = _weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_update_that_makes_weights_infinite_stops_the_run_before_a_rollout_or_checkpoint(tmp_path: Path) -> None:
    from mmrl.engine.trainer import Diverged

    # a finite learning rate, yet the first step's weight decay (p *= 1 - lr * wd) overflows every weight
    trainer = make_trainer(tmp_path, "train.lr=3e38", "train.weight_decay=100", "train.steps=3",
                           "train.save_every=1")
    with pytest.raises(Diverged, match="made weights NaN or infinite"):
        trainer.train()
    assert trainer.step == 0 and not list((tmp_path / "run").glob("checkpoint-*"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_one_bad_element_in_one_weight_stops_the_run(tmp_path: Path, bad: float) -> None:
    """The check after an optimizer step (a few fused max-magnitude calls over every weight) finds a single
    non-finite element in the middle of one weight, and passes the finite weights it was given."""
    from mmrl.engine.trainer import Diverged

    trainer = make_trainer(tmp_path)
    trainer._check_weights([1e-3])  # every weight finite: no stop
    weight = [p for p in trainer.policy.model.parameters() if p.requires_grad][7]
    with torch.no_grad():
        flat = weight.view(-1)
        flat[flat.numel() // 2] = bad
    with pytest.raises(Diverged, match="made weights NaN or infinite"):
        trainer._check_weights([1e-3])


@pytest.mark.slow
def test_a_run_whose_updates_are_mostly_skipped_stops_and_the_report_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    code = cli.main(["train", "--quiet", "--out", str(out), *TINY_RUN, "train.steps=8", "train.save_every=1",
                     "grpo.entropy_coef=0.01", "train.lr=1e3"])
    assert code != 0
    err = capsys.readouterr().err
    assert "optimizer steps were skipped because the loss or the gradient was not finite" in err, err[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    last = rl[-1]
    assert last["step"] < 8 and last["skipped_updates"] >= 3  # stopped early, after the skips
    assert not (out / "final").exists()
    # the checkpoints hold only steps whose update left the weights finite
    for ckpt in out.glob("checkpoint-*"):
        from safetensors.torch import load_file

        assert all(torch.isfinite(v).all() for v in load_file(ckpt / "model.safetensors").values())
    report = (out / "report.md").read_text()
    assert "## Stopped early" in report and f"stopped at step {last['step']} of 8" in report
    assert f"{last['skipped_updates']} of " in report and "optimizer steps were skipped" in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"]["rl"]["skipped_updates"] == last["skipped_updates"]
