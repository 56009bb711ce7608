"""The update reads the device once per optimizer step, not per micro-batch (issue 58): its statistics stay on the
device until the update ends and the non-finite-loss check is one flag per optimizer step.

* the logged statistics (loss terms, clip fractions, KL, entropy, the rollout/training log-prob gap) are, to the
  last bit, the per-micro-batch host sums the update made before: each micro-batch's values read as Python
  floats, weighted by its share of the mini-batch's tokens, summed in order;
* a micro-step's own code (the model's forward aside) reads nothing back to the host (no ``.item()``,
  ``float()``, ``bool()`` of a tensor: no ``aten._local_scalar_dense``), the loss statistics' ``masked_max`` too;
* a NaN loss in one micro-batch skips that optimizer step: the weights stay as they were, no gradient is left
  behind, and the next optimizer step trains from clean gradients; under DeepSpeed (ZeRO-2 and ZeRO-3, one
  process) too, where the gradients live in ZeRO's partitions: the step after a skipped one equals, bit for bit,
  that of a trainer that never saw the NaN (before, the skipped step's earlier micro-batches leaked into it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl.run import load_split

pytestmark = pytest.mark.usefixtures("module_cache")


def make_trainer(tmp_path: Path, *overrides: str):
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import resolve_model

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, *overrides])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), dtype=cfg.model.dtype, device="cpu")
    return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path / "run", show_progress=False)


def scored_batch(trainer):
    batch = trainer.rollout_round(2)
    trainer.reference_pass(batch)
    trainer.compute_advantages(batch)
    trainer.shape_tokens(batch)
    return batch


def test_update_statistics_equal_the_per_micro_batch_host_sums(tmp_path: Path, monkeypatch) -> None:
    import mmrl.engine.trainer as trainer_module

    # two optimizer steps (mini-batches of 4 rows, off-policy: clip fractions move), micro-batches of 3 rows,
    # a KL term and an entropy bonus, the rollout's own log-probs (the gap)
    trainer = make_trainer(tmp_path, "grpo.kl_coef=0.05", "grpo.entropy_coef=0.01", "grpo.ppo_mini_batch_size=4",
                           "rollout.record_logprobs=true", "train.lr=1e-3", "rollout.temperature=1.5",
                           "grpo.clip_low=0.0001", "grpo.clip_high=0.0001")  # a narrow clip: the fractions move
    batch = scored_batch(trainer)
    assert batch.rollout_logprobs is not None and batch.old_logprobs is not None
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)  # the random model's rewards may all be equal
    # what each micro-step saw: its rows, whether the weights were still the rollout's, and the loss's inputs
    seen: list[dict] = []
    micro_step, policy_loss = trainer._micro_step, trainer_module.compute_policy_loss

    def record_micro_step(batch, idx, *args, **kwargs):
        seen.append({"idx": list(idx), "fresh": trainer._fresh, "dummy": kwargs.get("dummy", False)})
        return micro_step(batch, idx, *args, **kwargs)

    def record_loss(logp, *args, **kwargs):
        loss, st = policy_loss(logp, *args, **kwargs)
        seen[-1].update(logp=logp.detach().clone(), mask=args[2].detach().clone(), tokens=kwargs["global_tokens"],
                        stats={k: v.detach().clone() for k, v in st.items()})
        return loss, st

    monkeypatch.setattr(trainer, "_micro_step", record_micro_step)
    monkeypatch.setattr(trainer_module, "compute_policy_loss", record_loss)
    stats = trainer.update(batch)
    assert stats["optimizer_steps"] == 2 and len(seen) == 4  # 2 mini-batches x ([3 rows], [1 row])

    # the update's former arithmetic: each value read to the host, summed in micro-batch order
    n_updates, sums, gap = 2, {}, [0.0, 0.0]
    for s in seen:
        mask, logp = s["mask"], s["logp"]
        share = float(mask.sum()) / max(1.0, s["tokens"])
        if s["fresh"]:
            rollout = batch.tokens("rollout_logprobs", s["idx"], logp.shape[1])
            diff = (logp - rollout).masked_fill(mask == 0, 0.0)
            gap[0] += float(diff.abs().sum() / mask.sum().clamp(min=1)) * float(mask.sum())
            gap[1] += float(mask.sum())
        for k, v in s["stats"].items():
            if k != "n_tokens":
                part = float(v) if k in trainer_module.LOSS_TERMS else float(v) * share
                sums[k] = sums.get(k, 0.0) + part / n_updates
    assert {"loss", "pg_loss", "kl_loss", "kl", "entropy"} <= set(sums)
    assert any(k.startswith("pg/clip") for k in sums), sorted(sums)
    assert any(k.startswith("pg/clip") and sums[k] > 0 for k in sums)  # the second step's ratios moved
    assert {k: stats[k] for k in sums} == sums  # bit for bit
    assert gap[1] > 0 and stats["rollout_logprob_gap"] == gap[0] / gap[1]


def test_a_micro_step_reads_nothing_back_to_the_host(tmp_path: Path) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    trainer = make_trainer(tmp_path, "grpo.kl_coef=0.05", "grpo.entropy_coef=0.01", "rollout.record_logprobs=true",
                           "train.micro_batch_size=2", "grpo.tis_cap=2", "grpo.ppo_mini_batch_size=4")
    batch = scored_batch(trainer)
    where, reads = ["update"], {"micro_step": 0, "model": 0, "update": 0}

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads[where[-1]] += 1
            return func(*args, **(kwargs or {}))

    def inside(name, fn):
        def wrapped(*args, **kwargs):
            where.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                where.pop()
        return wrapped

    trainer._micro_step = inside("micro_step", trainer._micro_step)
    trainer.policy.forward_logprobs = inside("model", trainer.policy.forward_logprobs)
    with Reads():
        stats = trainer.update(batch)
    assert stats["optimizer_steps"] == 2 and "pg/ratio_max" in stats and "rollout_logprob_gap" in stats
    assert reads["micro_step"] == 0, reads
    assert reads["update"] > 0  # the counter counts: the optimizer steps' checks and the update's statistics


def test_masked_max_is_the_max_over_the_mask() -> None:
    from mmrl.grpo._util import masked_max

    g = torch.Generator().manual_seed(0)
    for i in range(500):
        x = torch.randn(3, 5, generator=g) * 10
        x[0, i % 5] = float("nan") if i % 7 == 0 else x[0, i % 5]
        m = torch.rand(3, 5, generator=g) < (0.0 if i % 5 == 0 else 0.4)
        want = x[m].max() if m.any() else torch.tensor(0.0)
        got = masked_max(x, m.float())
        assert torch.equal(got, want) or (got.isnan() and want.isnan())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_nan_in_one_micro_batch_skips_the_step_and_leaves_nothing_behind(tmp_path: Path, dtype: str) -> None:
    trainer = make_trainer(tmp_path, f"model.dtype={dtype}", "train.lr=1e-3", "grpo.kl_coef=0.01")
    batch = scored_batch(trainer)
    assert trainer._chunks(range(len(batch)), batch) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    good = batch.advantages.clone()
    batch.advantages = good.clone()
    batch.advantages[3] = float("nan")  # the second micro-batch's loss is NaN (a reward gave NaN, say)
    batch.advantages[0] = 1.0  # a first micro-batch with a gradient, which the skipped step must drop
    model = trainer.policy.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    passes = []
    micro_step = trainer._micro_step
    trainer._micro_step = lambda *a, **k: passes.append(a[1]) or micro_step(*a, **k)
    stats = trainer.update(batch)
    assert stats["skipped_updates"] == 1 and stats["optimizer_steps"] == 0
    assert len(passes) == 3  # the check is once per optimizer step: every micro-batch ran
    assert math.isfinite(stats["loss"])  # the statistics stop before the NaN micro-batch, as the loop did
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    masters = getattr(trainer.updater, "master", None)
    assert (masters is not None) == (dtype == "bf16")
    assert all(m.grad is None and torch.isfinite(m).all() for m in masters or [])

    # the next optimizer step trains from clean gradients: finite, and the weights move
    batch.advantages = good
    batch.advantages[0] = 1.0
    stats = trainer.update(batch)
    assert stats["skipped_updates"] == 1 and stats["optimizer_steps"] == 1 and math.isfinite(stats["grad_norm"])
    after = model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow  # DeepSpeed's start and two trainers: ~15 s a stage
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_a_nan_micro_batch_leaves_nothing_in_zeros_partitions(tmp_path: Path, stage: str) -> None:
    out = tmp_path / "probe.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("deepspeed_nan_probe.py")), stage, str(out)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    seen = json.loads(out.read_text())
    assert seen["chunks"] == [[0, 1, 2], [3, 4, 5], [6, 7]]  # the NaN (row 3) is in the second micro-batch
    assert seen["nan"] == {"skipped_updates": 1, "optimizer_steps": 0}
    assert seen["after"]["optimizer_steps"] == 1 and seen["b"]["optimizer_steps"] == 1
    assert seen["after"]["grad_norm"] == seen["b"]["grad_norm"]
    assert seen["equal"] and seen["moved"] and seen["finite"]
