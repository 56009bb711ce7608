"""bf16 training keeps fp32 master weights: a learning rate of 1e-6, far below bf16's resolution, still
moves every trainable parameter; the run resumes exactly from its checkpoint's master weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synthetic_media import weights
from tiny_runs import TINY_RUN, module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from mmrl.engine.checkpoint import load_trainer_state

pytestmark = pytest.mark.slow  # real bf16 training runs

BF16 = ["model.dtype=bf16", "train.lr=1e-6", "grpo.entropy_coef=0.01"]


@pytest.mark.usefixtures("module_cache")
def test_bf16_master_weights_move_at_lr_1e6(tmp_path: Path) -> None:
    from mmrl.config import load_run_config
    from mmrl.model import load_policy
    from mmrl.run import resolve_model

    run_rl(tmp_path, *BF16, "train.steps=10", "train.save_every=5")
    run = tmp_path / "run"
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, *BF16])
    start = load_policy(resolve_model(cfg), dtype="bf16", device="cpu")
    start_master = {n: p.detach().float() for n, p in start.model.named_parameters()}

    master = load_trainer_state(run / "checkpoint-10")["optimizer"]["master"]
    assert set(master) == set(start_master)  # every parameter is trainable in this run
    assert all(t.dtype == torch.float32 for t in master.values())
    unchanged = [n for n, t in master.items() if torch.equal(t, start_master[n])]
    assert not unchanged, f"{len(unchanged)} of {len(master)} parameters never moved, e.g. {unchanged[:3]}"
    # an update of 1e-6 per step is below bf16's spacing near most weights: the masters differ from what the
    # bf16 model holds, which is their rounding
    saved = weights(run / "checkpoint-10")
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    model_state = dict(start.model.named_parameters())
    assert any(not torch.equal(master[n].to(torch.bfloat16).float(), master[n]) for n in model_state)

    # the fp32 masters are what a resume continues from: checkpoint-5 plus 5 steps gives checkpoint-10's
    mid = load_trainer_state(run / "checkpoint-5")["optimizer"]["master"]
    assert any(not torch.equal(mid[n], master[n]) for n in master)


@pytest.mark.usefixtures("module_cache")
def test_bf16_resume_is_exact(tmp_path: Path) -> None:
    import shutil

    from mmrl.config import load_run_config
    from mmrl.run import train

    straight = tmp_path / "a"
    run_rl(straight, *BF16, "train.steps=4", "train.save_every=2")
    resumed = tmp_path / "b"
    run_rl(resumed, *BF16, "train.steps=4", "train.save_every=2")
    # drop everything after checkpoint-2, as a run killed there would have left it
    run = resumed / "run"
    shutil.rmtree(run / "checkpoint-4")
    shutil.rmtree(run / "final")
    (run / "latest").write_text("checkpoint-2\n")
    import json

    state = json.loads((run / "run_state.json").read_text())
    state["stages"].pop("rl", None)
    (run / "run_state.json").write_text(json.dumps(state))
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, *BF16, "train.steps=4", "train.save_every=2"])
    train(cfg, run_dir=run, resume=True, show_progress=False)
    a = load_trainer_state(straight / "run" / "checkpoint-4")["optimizer"]["master"]
    b = load_trainer_state(run / "checkpoint-4")["optimizer"]["master"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    wa, wb = weights(straight / "run" / "final"), weights(run / "final")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
