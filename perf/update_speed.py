"""The GRPO update at a real model's depth, what a GPU will feel, measured on the CPU (``make bench``, section
``update``; ``python -m perf --only update``).

A GPU runs mmrl's update host-bound when a micro-batch is small (the 3B profile on an H200: ~47k aten ops a
micro-batch, the kernels busy ~20% of the pass): its time is set by the count of operations the host issues, and
that count is set by the model's *depth* (decoder layers, vision blocks, vision windows), not its width. So this
section builds the published Qwen2.5-VL-3B geometry at tiny width (36 decoder layers, 32 vision blocks, 112-pixel
windows, full attention in blocks 7/15/23/31; hidden 64) and a video prompt of 8 frames at 448x448 (1,024 vision
tokens: the CPU is op-bound there as the GPU is; at 4,096 the CPU is bound by the quadratic full-attention blocks
instead), rolls out one prompt x G=8 answers once, and times the trainer's own ``update`` of that batch under two
settings, alternating after a warm-up, in one process:

* **before**: the real-model preset as it was before the update was made to fill the GPU: sdpa (one attention
  call per vision window), ``train.micro_batch_size=2`` (a group in four micro-batches);
* **after**: the preset as it is (``configs/presets/real-model.yaml``): its attention implementation and its
  token-budget micro-batches (a whole group in one).

Both update the same batch from the same weights (fp32 on the CPU; activation checkpointing on, as the preset
sets). Reported: median seconds an update, seconds per trained token (the batch's prompt and answer tokens, the
same for both: so their ratio is the speed-up), the tokens the passes compute (a shared prompt once per
micro-batch), aten operations an update and attention calls (counted in one extra update of each, under a
dispatch mode), and the ratios.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

FAMILY = "qwen2_5_vl"
# Qwen2.5-VL-3B's depth and vision geometry (its config.json) at tiny width
DEPTH_3B = {"layers": 36, "vision_depth": 32, "hidden_size": 64, "heads": 4, "kv_heads": 2, "intermediate_size": 128,
            "vision_hidden_size": 32, "vision_heads": 2, "vision_intermediate_size": 64}
VISION_3B = {"vision_config": {"window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}}
SIDE, FRAMES, GROUP, TOKENS = 448, 8, 8, 32
PRESET = Path(__file__).resolve().parent.parent / "configs" / "presets" / "real-model.yaml"
BEFORE = {"model.attn_implementation": "sdpa", "train.micro_batch_size": 2, "train.micro_batch_tokens": 0}
ATTENTION_OPS = ("scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")


def preset_settings() -> dict[str, Any]:
    """The real-model preset's update settings (the "after" arm)."""
    import yaml

    preset = yaml.safe_load(PRESET.read_text())
    return {"model.attn_implementation": preset["model"].get("attn_implementation", "sdpa"),
            "train.micro_batch_size": preset["train"].get("micro_batch_size", 16),
            "train.micro_batch_tokens": preset["train"].get("micro_batch_tokens", 0)}


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """aten operations dispatched while active (all of them, and the attention kernels among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.attention = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops += 1
        if any(k in func.__name__ for k in ATTENTION_OPS):
            self.attention += 1
        return func(*args, **(kwargs or {}))


def _trainer(root: Path, model_dir: Path, data: Path, settings: dict[str, Any], name: str) -> Any:
    from mmrl.config import load_run_config
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import configure_policy
    from perf.trl_compare import register_bench_reward

    register_bench_reward()
    cfg = load_run_config("video-qa", overrides=[
        f"model.path={model_dir}", f"data.train={data}", "rewards=[{name: bench_length}]",
        f"rollout.group_size={GROUP}", f"rollout.max_new_tokens={TOKENS}", "train.prompts_per_step=1",
        "grpo.kl_coef=0", "train.log_rollouts=0", "train.save_every=0", "data.check_media=none",
        "train.health_window=0", f"data.media.max_frames={FRAMES}", f"data.media.min_frames={FRAMES}",
        f"data.media.video_max_pixels={SIDE * SIDE}", f"data.media.video_min_pixels={SIDE * SIDE}",
        "model.gradient_checkpointing=true", *(f"{k}={v}" for k, v in settings.items())])
    policy = load_policy(model_dir, attn_implementation=cfg.model.attn_implementation, device="cpu")
    configure_policy(policy, cfg)
    from data_pipelines.loaders import load_samples

    return GRPOTrainer(cfg, policy, load_samples(data).samples, run_dir=root / name, show_progress=False)


def computed_tokens(trainer: Any, batch: Any) -> int:
    """Tokens the update's passes compute: per micro-batch, a group's shared prompt once and each row's rest."""
    from mmrl.model.shared_prefix import prefix_plan

    total = 0
    for mini in trainer.update_plan(batch):
        for rows in mini:
            seqs = [batch.seqs[i] for i in rows]
            plan = prefix_plan(seqs) or [([i], 0) for i in range(len(seqs))]
            total += sum(n + sum(len(seqs[i]) - n for i in g) if n else sum(len(seqs[i]) for i in g)
                         for g, n in plan)
    return total


def measure(root: Path, *, reps: int = 2) -> dict[str, Any]:
    """Build, roll out once, then time ``update`` under both settings (``reps`` alternating repetitions after a
    warm-up of each) and count its operations once each."""
    import copy

    from mmrl.toy.tiny_models import make_sized
    from perf.toy_media import toy_video

    model_dir = root / "model-3b-depth"
    if not (model_dir / "config.json").exists():
        make_sized(FAMILY, model_dir, size={**DEPTH_3B, "video_min_pixels": SIDE * SIDE,
                                            "video_max_pixels": SIDE * SIDE}, config_overrides=VISION_3B)
    data = root / "train.jsonl"
    data.write_text(json.dumps({
        "id": "v0", "problem_type": "open", "question": "Which way does the square move?", "answer": "left",
        "media": [{"type": "video", "path": str(toy_video(root / "v0.mp4", 0, side=SIDE)),
                   "sampling": {"nframes": FRAMES}}]}) + "\n")
    arms = {"before": BEFORE, "after": preset_settings()}
    trainers = {name: _trainer(root, model_dir, data, s, name) for name, s in arms.items()}
    first = trainers["before"]
    with first.rollout_session():
        batch, _, _ = first.collect()
    first.reference_pass(batch)
    first.compute_advantages(batch)
    first.shape_tokens(batch)
    for tr in trainers.values():  # each policy encodes the prompt's media (its own media store)
        if tr is not first:
            tr.prepare([0])
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for rep in range(reps + 1):
        for name, tr in trainers.items():
            b = copy.deepcopy(batch)
            t0 = time.perf_counter()
            tr.update(b)
            if rep:
                times[name].append(time.perf_counter() - t0)
    out: dict[str, Any] = {"trained_tokens": int(sum(len(s) for s in batch.seqs)), "rows": len(batch),
                           "prompt_tokens": batch.seqs[0].loss_mask.index(1), "arms": {}}
    for name, tr in trainers.items():
        counter = OpCounter()
        with counter:
            tr.update(copy.deepcopy(batch))
        plan = tr.update_plan(batch)
        settings = {**arms[name], "train.micro_batch_tokens": tr.cfg.train.micro_batch_tokens}  # auto resolved
        out["arms"][name] = {"settings": settings, "update_s": statistics.median(times[name]),
                             "micro_batches": sum(len(m) for m in plan), "computed_tokens": computed_tokens(tr, batch),
                             "aten_ops": counter.ops, "attention_calls": counter.attention}
    for arm in out["arms"].values():
        arm["s_per_trained_token"] = arm["update_s"] / out["trained_tokens"]
        arm["s_per_computed_token"] = arm["update_s"] / arm["computed_tokens"]
    b, a = out["arms"]["before"], out["arms"]["after"]
    out["speedup_per_trained_token"] = b["s_per_trained_token"] / a["s_per_trained_token"]
    out["ops_ratio"] = b["aten_ops"] / max(1, a["aten_ops"])
    return out


def print_update(r: dict[str, Any]) -> None:
    print(f"GRPO update at Qwen2.5-VL-3B depth (36 decoder layers, 32 vision blocks, hidden 64), fp32 CPU, "
          f"activation checkpointing: 1 prompt x G={GROUP}, {FRAMES} frames at {SIDE}x{SIDE} "
          f"({r['prompt_tokens']}-token prompt), {r['rows']} rows, {r['trained_tokens']} trained tokens")
    print(f"  {'arm':<7} {'settings':<66} {'micro-batches':>13} {'computed tok':>12} {'aten ops':>9} "
          f"{'attn calls':>10} {'update s':>9} {'ms/trained tok':>14} {'ms/computed tok':>15}")
    for name, a in r["arms"].items():
        s = " ".join(f"{k.split('.')[-1]}={v}" for k, v in a["settings"].items())
        print(f"  {name:<7} {s:<66} {a['micro_batches']:>13} {a['computed_tokens']:>12} {a['aten_ops']:>9} "
              f"{a['attention_calls']:>10} {a['update_s']:>9.2f} {1e3 * a['s_per_trained_token']:>14.3f} "
              f"{1e3 * a['s_per_computed_token']:>15.3f}")
    print(f"  after is {r['speedup_per_trained_token']:.2f}x faster per trained token, with "
          f"{r['ops_ratio']:.1f}x fewer aten ops an update")
