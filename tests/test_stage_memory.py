"""Peak memory by stage of a training step (:class:`mmrl.engine.memory.StagePeaks`): ``memory/<stage>_gb`` in
``metrics.jsonl`` for the rollout, the reference pass, the update, the optimizer step and each checkpoint.

* a stage's reading covers an allocation made inside it; a stage measured twice keeps its larger peak;
  ``memory/peak_gb`` is the largest stage's;
* a bf16 run with fp32 master weights, in a fresh process: every step logs its stages, every checkpoint its
  ``memory/save_gb``, and a checkpoint needs no more memory than the optimizer step before it. The trainer
  state holds the masters themselves, streamed to the file one at a time; a checkpoint that cloned every
  master first (what it did before) peaks 4 bytes a parameter above the weights, masters and moments it
  starts from, about 2 bytes a parameter above the optimizer step (whose peak is those plus the bf16
  gradients, 2, and one chunk of fp32 gradients).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 (module_cache is a fixture)

from mmrl.engine.memory import StagePeaks, measure_in_subprocess

# about 30M parameters (the size perf/update_memory.py measures), so that the 2 bytes a parameter that tell
# the two checkpoints apart (60 MB) stand well above the resident set's noise
SIZE = "{hidden_size: 512, layers: 8, heads: 8, kv_heads: 4, intermediate_size: 2048, vision_depth: 2, " \
       "vision_hidden_size: 128, vision_heads: 4, vision_intermediate_size: 256}"
# fp32 gradients cast a small share of the model at a time, as in a real model (4M elements of 3.75B)
CHUNK = 1 << 18


def test_stage_peaks_cover_each_stage_and_keep_the_largest() -> None:
    size = 200 * 2**20
    peaks = StagePeaks("cpu")
    with peaks.stage("big"):
        block = torch.ones(size // 4)  # written: its pages are resident
        del block
    peaks.start("small")
    peaks.stop("small")
    assert peaks.call("big", lambda: 7) == 7  # a second, smaller window of the same stage
    m = peaks.metrics()
    assert set(m) == {"memory/big_gb", "memory/small_gb", "memory/peak_gb"}  # no CUDA variants on the CPU
    assert m["memory/big_gb"] >= m["memory/small_gb"] + 0.95 * size / 1e9
    assert m["memory/peak_gb"] == m["memory/big_gb"]
    assert "memory/peak_gb" not in peaks.metrics(overall=False)


def _bf16_run(run_dir: str, overrides: list[str]) -> Callable[[], None]:
    """Setup in the measuring process: the master chunk, the run's config. ``work``: the run."""
    from mmrl.config import load_run_config
    from mmrl.engine import optim
    from mmrl.run import train

    optim.MASTER_CHUNK_ELEMENTS = CHUNK
    cfg = load_run_config("video-qa", overrides=overrides)

    def work() -> None:
        train(cfg, run_dir=Path(run_dir), show_progress=False)

    return work


@pytest.mark.usefixtures("module_cache")
@pytest.mark.slow
def test_checkpoint_needs_no_more_memory_than_the_optimizer_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = [*TINY_RUN, f"model.tiny_size={SIZE}", "model.dtype=bf16", "grpo.entropy_coef=0.01",
                 "train.steps=2", "train.save_every=1"]  # step 2: the first steady-state checkpoint
    # a fresh process whose C allocator returns every freed block of 1 MB or more to the system at once: its
    # resident set follows the live tensors (mmrl.engine.memory)
    measure_in_subprocess(_bf16_run, str(run), overrides)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if r["stage"] == "rl"}
    saves = {r["step"]: r for r in rows if r["stage"] == "checkpoint"}
    assert sorted(steps) == sorted(saves) == [1, 2]
    stages = ("rollout", "reference", "update", "optimizer_step")
    for r in steps.values():
        assert r["optimizer_steps"] >= 1
        assert all(r[f"memory/{s}_gb"] > 0 for s in stages)
        assert r["memory/peak_gb"] == max(r[f"memory/{s}_gb"] for s in stages)
    for step, s in saves.items():
        assert s["memory/save_gb"] > 0 and s["time/save_s"] > 0 and "memory/peak_gb" not in s
        if step == 1:
            continue  # the first optimizer step builds the Adam moments as it goes: not the steady state
        assert s["memory/save_gb"] <= steps[step]["memory/optimizer_step_gb"], (step, s, steps[step])
