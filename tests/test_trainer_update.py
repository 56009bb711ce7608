"""The GRPO trainer's update on the real tiny model: a NaN loss or gradient never reaches the weights, the LR
schedule follows skipped updates, trainer state is plain data, PPO mini-batches take several optimizer steps,
KL in the reward has its own estimator, the reference holds no second policy, and token shaping normalises by
the kept tokens."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import TINY_RUN, module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl.grpo import register_policy_loss
from mmrl.grpo.losses import PolicyLossOutput
from mmrl.run import load_split

pytestmark = pytest.mark.usefixtures("module_cache")


def make_trainer(tmp_path: Path, *overrides: str):
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import resolve_model

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, *overrides])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), device="cpu")
    return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path / "run", show_progress=False)


@register_policy_loss("t_nan_loss")
def _nan_loss(logp, old_logp, advantages, mask, cfg):
    return PolicyLossOutput(loss=logp * float("nan") * mask)


@register_policy_loss("t_nan_grad")
def _nan_grad(logp, old_logp, advantages, mask, cfg):
    # the value is 0 (finite) but d sqrt(|x|)/dx at 0 is not: the gradient norm is NaN
    return PolicyLossOutput(loss=(logp - logp.detach()).abs().sqrt() * mask)


@pytest.mark.parametrize("loss", ["t_nan_loss", "t_nan_grad"])
def test_non_finite_loss_or_gradient_skips_the_optimizer_step(tmp_path: Path, loss: str) -> None:
    from mmrl.toy.tiny_models import ensure_tiny

    rows = run_rl(tmp_path, f"grpo.policy_loss={loss}", "train.save_every=1")
    assert [r["skipped_updates"] for r in rows] == [1, 2]
    assert [r["optimizer_steps"] for r in rows] == [0, 0]
    start = load_file(next(ensure_tiny("qwen2_5_vl").glob("*.safetensors")))
    for folder in ("checkpoint-1", "final"):
        saved = load_file(tmp_path / "run" / folder / "model.safetensors")
        assert all(torch.isfinite(v).all() for v in saved.values())
        assert all(torch.equal(start[k], saved[k]) for k in start)  # nothing was written


def test_lr_schedule_steps_when_every_update_is_skipped(tmp_path: Path) -> None:
    # every completion hits the overlong penalty: all groups equal, dynamic sampling keeps none
    rows = run_rl(tmp_path, "train.steps=3", "train.warmup_steps=4", "grpo.dynamic_sampling=true", "grpo.max_draws=0",
               "grpo.overlong_penalty=true", "grpo.max_response_length=4", "grpo.overlong_cache=2")
    assert all(r.get("skipped_update") == 1 for r in rows)
    lrs = [r["lr"] for r in rows]
    assert lrs[0] < lrs[1] < lrs[2]  # the warm-up advanced although nothing was trained


def test_trainer_state_is_plain_data_and_the_start_reference_is_not_stored(tmp_path: Path) -> None:
    run_rl(tmp_path, "grpo.kl_coef=0.01", "train.save_every=1")
    state = torch.load(tmp_path / "run" / "checkpoint-2" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and state["reference"] == "start"
    assert not list((tmp_path / "run").glob("checkpoint-*/reference.safetensors"))


@pytest.mark.slow
def test_ppo_mini_batches_take_several_optimizer_steps(tmp_path: Path) -> None:
    rows = run_rl(tmp_path, "grpo.ppo_mini_batch_size=4", "grpo.ppo_epochs=2", "grpo.entropy_coef=0.05",
               "train.lr=1e-3")
    # 8 sequences in mini-batches of 4, two epochs: 4 optimizer steps per rollout batch
    assert [r["optimizer_steps"] for r in rows] == [4, 4]
    assert all(r["pg/ratio_max"] > 1.0 for r in rows)  # later mini-batches are off-policy: ratios move


def test_kl_in_the_reward_uses_its_own_estimator(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, "grpo.kl_coef=0.5", "grpo.kl_in_reward=true", "grpo.kl_estimator=k3")
    assert trainer.cfg.grpo.kl_reward_estimator == "k1"
    with torch.no_grad():
        for p in trainer.ref.model.lm_head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = trainer.rollout_round(2)
    before = batch.rewards.clone()
    trainer.reference_pass(batch)
    logp, _ = trainer._logprobs(trainer.policy, batch)
    k1 = ((logp - batch.ref_logprobs) * batch.loss_mask).sum(-1)
    torch.testing.assert_close(batch.reward_components["kl_penalty"], -0.5 * k1)
    torch.testing.assert_close(batch.rewards, before - 0.5 * k1)
    assert (k1 < 0).any() or (k1 > 0).all()  # k1 is signed (a k3 estimate would be >= 0 on every row)


def test_the_reference_holds_no_second_policy(tmp_path: Path) -> None:
    from mmrl.model import Policy

    trainer = make_trainer(tmp_path, "grpo.kl_coef=0.01")
    gc.collect()
    policies = [o for o in gc.get_objects() if type(o) is Policy]
    assert trainer.ref is not None
    assert {id(p) for p in policies} >= {id(trainer.policy), id(trainer.ref)}
    mine = [p for p in policies if p.model is trainer.ref.model or p.model is trainer.policy.model]
    assert len(mine) == 2  # a deep copy through the vision hook used to bring a third along
    seq = trainer.prepare([0])[0][0].seq
    before = trainer.policy.vision_calls
    with torch.no_grad():
        trainer.ref.forward_logprobs([seq])
    assert trainer.policy.vision_calls == before and trainer.ref.vision_calls == 1


def test_top_entropy_shaping_normalises_by_the_tokens_it_keeps(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, "grpo.shaper=top_entropy", "grpo.shaper_kwargs={rho: 0.25}",
                           "grpo.kl_coef=0", "train.micro_batch_size=3")
    batch = trainer.rollout_round(2)
    trainer.reference_pass(batch)
    batch.advantages = torch.ones(len(batch))  # on-policy, ratio 1: every kept token's loss is -1
    kept_before = float(batch.loss_mask.sum())
    trainer.shape_tokens(batch)
    assert float(batch.loss_mask.sum()) == pytest.approx(-(-kept_before * 0.25 // 1), abs=1)
    stats = trainer.update(batch)
    assert stats["pg_loss"] == pytest.approx(-1.0, abs=1e-5)  # not -0.25: the mean over the kept tokens
