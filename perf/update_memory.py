"""``python -m perf --only memory`` (also part of ``make bench``): the optimizer update's peak memory per
parameter, and a ZeRO-3 checkpoint's peak on rank 0 and on the other ranks.

* **Update** (:class:`mmrl.engine.optim.LocalUpdater`, bf16 model with fp32 master weights and fp32 Adam moments):
  the peak of building the masters and two updates (forward/backward and the optimizer step; the second is
  the steady state, where the moments exist), in a fresh process, per parameter, plus the bf16 weights already
  loaded (2 bytes). The floor is 16: weights 2, bf16 gradients 2,
  masters 4, moments 8. The masters' gradients are cast a chunk at a time
  (:data:`mmrl.engine.optim.MASTER_CHUNK_ELEMENTS`), each bf16 gradient freed once cast; the same update with one
  chunk of every tensor shows what casting every gradient before the step costs (the update before this
  change also kept every bf16 gradient alive meanwhile: 2 more, 20 in all).
* **ZeRO-3 checkpoint** (2 gloo ranks on the CPU, ``perf/checkpoint_probe.py``): each rank's peak while a
  checkpoint's weights are gathered and rank 0 writes them, as a multiple of the model's bytes: module by
  module to rank 0 (mmrl, :func:`mmrl.model.weights.stream_weights`) against the whole model gathered on every
  rank at once (``deepspeed.zero.GatheredParameters`` over every parameter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

FAMILY = "qwen2_5_vl"
# about 30M parameters, the largest tensor 3% of them (a real model's largest, its embedding, is ~7%)
SIZE = {"hidden_size": 512, "layers": 8, "heads": 8, "kv_heads": 4, "intermediate_size": 2048,
        "vision_depth": 2, "vision_hidden_size": 128, "vision_heads": 4, "vision_intermediate_size": 256}
TARGET = 18.0


def update_case(model_dir: str, chunk: int | None, threads: int) -> Callable[[], dict]:
    """Setup (not measured): the model in bf16 and one text micro-batch. ``work``: the update."""
    import numpy as np

    from mmrl.config import TrainConfig
    from mmrl.engine import optim
    from mmrl.engine.distributed import World
    from mmrl.model import TokenSeq, load_policy

    torch.set_num_threads(threads)
    if chunk is not None:
        optim.MASTER_CHUNK_ELEMENTS = chunk
    policy = load_policy(model_dir, dtype="bf16", device="cpu")
    policy.model.train()
    rng = np.random.default_rng(0)
    batch = [TokenSeq(ids=rng.integers(100, 1000, 48).tolist(), mm_types=[0] * 48, loss_mask=[0] * 16 + [1] * 32)]
    n = sum(p.numel() for p in policy.model.parameters())

    def work() -> dict:
        # two updates: the first creates the Adam moments as it steps (so they never meet a whole set of
        # gradients); from the second on, moments, masters and the new gradients coexist (the steady state)
        updater = optim.LocalUpdater(policy.model, TrainConfig(lr=1e-5), World())
        for _ in range(2):
            logp, _, mask = policy.forward_logprobs(batch)
            (-(logp * mask).sum() / mask.sum()).backward()
            norm = updater.step()
            updater.zero_grad()
        return {"params": n, "grad_norm": norm, "master": updater.master is not None}

    return work


def bench_update(root: Path) -> dict:
    from mmrl.engine.memory import measure_in_subprocess
    from mmrl.engine.optim import MASTER_CHUNK_ELEMENTS
    from mmrl.toy.tiny_models import make_tiny
    from perf.update_memory import update_case

    model_dir = make_tiny(FAMILY, root / "update-model", seed=0, **SIZE)
    out = {"chunk": MASTER_CHUNK_ELEMENTS, "rows": []}
    for label, chunk in (("mmrl: masters cast a chunk at a time", None),
                         ("every gradient cast before the step (one chunk)", 1 << 40)):
        peak, res = measure_in_subprocess(update_case, str(model_dir), chunk, torch.get_num_threads())
        out["params"] = res["params"]
        out["rows"].append((label, 2 + peak.extra_bytes / res["params"], peak.method))
    return out


def print_update(info: dict) -> None:
    print(f"memory: the optimizer update per parameter (LocalUpdater; bf16 model, fp32 masters and moments), tiny "
          f"{FAMILY} of {info['params'] / 1e6:.1f}M parameters, one 48-token sequence; masters cast "
          f"{info['chunk'] / 1e6:.1f}M elements at a time; two updates, each case in a fresh process; weights (2) + "
          "the updates' own peak (bf16 gradients, fp32 masters, moments, temporaries); floor 16\n")
    head = f"{'case':<46} {'bytes/param':>12}"
    print(head)
    print("-" * len(head))
    for label, per, _method in info["rows"]:
        print(f"{label:<46} {per:>12.2f}")
    mine = info["rows"][0][1]
    print(f"\nupdate peak per parameter: {mine:.2f} bytes (target <= {TARGET:.0f}: "
          f"{'met' if mine <= TARGET else 'NOT met'})\n")


def bench_zero3_checkpoint(root: Path) -> list[dict]:
    """Both ways of gathering a checkpoint, each in its own 2-rank torchrun (gloo, CPU)."""
    from mmrl.toy.tiny_models import make_tiny

    model_dir = make_tiny(FAMILY, root / "ckpt-model", seed=0, **SIZE)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    probe = Path(__file__).with_name("checkpoint_probe.py")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    rows = []
    for mode in ("modules", "whole"):
        out = root / f"ckpt-{mode}.json"
        done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(probe), str(model_dir), mode,
                               str(root / f"save-{mode}"), str(out)], env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"checkpoint probe ({mode}) failed:\n{(done.stdout + done.stderr)[-3000:]}")
        rows.append(json.loads(out.read_text()))
    return rows


def print_zero3_checkpoint(rows: list[dict]) -> None:
    model_gb = rows[0]["model_bytes"] / 1e9
    print(f"memory: a ZeRO-3 checkpoint's weights, 2 gloo ranks (CPU: resident set), tiny {FAMILY} of "
          f"{rows[0]['params'] / 1e6:.1f}M parameters ({model_gb:.3f} GB in fp32); each rank's peak while the "
          "weights are gathered and rank 0 writes model.safetensors, in model sizes\n")
    head = f"{'gathering':<52} {'rank 0':>8} {'rank 1':>8}"
    print(head)
    print("-" * len(head))
    labels = {"modules": "one module at a time, kept on rank 0 (mmrl)", "whole": "whole model on every rank at once"}
    for r in rows:
        print(f"{labels[r['mode']]:<52} {r['peak_bytes'][0] / r['model_bytes']:>7.2f}x "
              f"{r['peak_bytes'][1] / r['model_bytes']:>7.2f}x")
    print("\n(rank 0 must hold the whole weights once to write them; the other ranks only one module beside their "
          "shards)\n")
