"""Run by ``test_update_syncs.py`` in a process of its own (DeepSpeed in one process, a world of one):
``python deepspeed_nan_probe.py STAGE OUT_JSON`` with MMRL_CACHE set. Two trainers from the same weights train
on the same scored batch: A first takes an update whose second micro-batch's loss is NaN (after a finite first
micro-batch), then a clean update; B takes the clean update only. Writes both updates' statistics and whether
A's and B's weights are equal after the clean update (the NaN step left nothing in ZeRO's partitions)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from probe_exit import leave
from tiny_runs import TINY_RUN

from mmrl.config import load_run_config
from mmrl.engine.trainer import GRPOTrainer
from mmrl.model import load_policy
from mmrl.run import load_split, resolve_model


def main(stage: str, out: str) -> None:
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"train.deepspeed={stage}", "train.lr=1e-3",
                                                 "grpo.kl_coef=0.01"])
    samples, _ = load_split(cfg, "train", show_progress=False)

    def trainer(name: str) -> GRPOTrainer:
        policy = load_policy(resolve_model(cfg), device="cpu")
        return GRPOTrainer(cfg, policy, samples, run_dir=Path(out).parent / name, show_progress=False)

    a = trainer("a")
    batch = a.rollout_round(2)
    a.reference_pass(batch)
    a.compute_advantages(batch)
    a.shape_tokens(batch)
    clean = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    poisoned = clean.clone()
    poisoned[3] = float("nan")  # rows [0, 1, 2], [3, 4, 5], [6, 7]: the second micro-batch
    batch.advantages = poisoned
    nan_stats = a.update(batch)
    batch.advantages = clean
    after_stats = a.update(batch)
    b = trainer("b")
    b.prepare(sorted(set(batch.prompt_index)))
    b_stats = b.update(batch)

    def weights(t: GRPOTrainer) -> dict[str, torch.Tensor]:
        with t.updater.full_weights():
            return {k: v.detach().clone() for k, v in t.policy.model.state_dict().items()}

    wa, wb = weights(a), weights(b)
    start = load_policy(resolve_model(cfg), device="cpu").model.state_dict()
    Path(out).write_text(json.dumps({
        "chunks": a._chunks(range(len(batch)), batch),
        "nan": {k: nan_stats[k] for k in ("skipped_updates", "optimizer_steps")},
        "after": {k: after_stats[k] for k in ("skipped_updates", "optimizer_steps", "grad_norm")},
        "b": {k: b_stats[k] for k in ("skipped_updates", "optimizer_steps", "grad_norm")},
        "equal": all(torch.equal(wa[k], wb[k]) for k in wb),
        "moved": any(not torch.equal(wb[k], start[k]) for k in start),
        "finite": all(bool(torch.isfinite(v).all()) for v in wa.values()),
    }))
    leave()  # the one-process group DeepSpeed needs, left


if __name__ == "__main__":
    main(*sys.argv[1:])
