"""``mmrl train``: one run folder, stages in order, each resumable.

Stages: cold-start SFT (optional) -> evaluation before RL -> GRPO -> evaluation after RL -> report. The
run folder holds ``config.yaml`` and ``run_state.json`` (finished stages and their results). A run
restarted with ``--resume`` skips finished stages and continues RL from its latest checkpoint, so a
killed run ends with the same weights as one that was never interrupted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import RunConfig
from mmrl.config_io import to_dict
from mmrl.run_log import RunLog
from mmrl_common.errors import ConfigError, MmrlError


def resolve_model(cfg: RunConfig) -> Path:
    if cfg.model.path:
        return Path(cfg.model.path)
    from mmrl.tiny_models import ensure_tiny

    return Path(ensure_tiny(cfg.model.tiny_family, seed=cfg.model.tiny_seed, **cfg.model.tiny_size))


def load_split(cfg: RunConfig, split: str, *, show_progress: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """The samples of a split (``train``, ``val``, ``test``), filtered by the run's task and type settings."""
    from data_pipelines.loaders import load_samples

    path = getattr(cfg.data, split)
    if path is None:
        if cfg.data.train is not None:
            if split == "train":
                raise ConfigError("data.train is required")
            return [], {}
        from data_pipelines.toy import ensure_toy

        toy = ensure_toy(seed=cfg.data.toy_seed, size=cfg.data.toy_size or "default",
                         tasks=cfg.data.toy_tasks or None, progress=show_progress)
        path = str(Path(toy) / f"{split}.jsonl")
    if not Path(path).exists():
        raise ConfigError(f"data.{split}: file not found: {path}")
    result = load_samples(path, fmt=cfg.data.format, columns=cfg.data.columns or None,
                          media_root=cfg.data.media_root, on_bad_sample=cfg.data.on_bad_sample)
    samples = list(result.samples)
    if cfg.data.toy_tasks and getattr(cfg.data, split) is None:  # toy-world settings never filter user data
        samples = [s for s in samples if s.meta.get("task") in cfg.data.toy_tasks]
    if cfg.data.problem_types:
        samples = [s for s in samples if s.problem_type in cfg.data.problem_types]
    info = {"path": str(path), "loaded": len(result.samples), "used": len(samples), "skipped": result.skipped}
    return samples, info


class RunState:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "run_state.json"
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {"stages": {}}

    def done(self, stage: str) -> bool:
        return stage in self.data["stages"]

    def get(self, stage: str) -> Any:
        return self.data["stages"].get(stage)

    def finish(self, stage: str, result: Any) -> None:
        self.data["stages"][stage] = result
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / f"{cfg.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(cfg: RunConfig, *, run_dir: Path, resume: bool = False, show_progress: bool = True) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    from mmrl.checkpoint import latest_checkpoint, load_weights, seed_everything
    from mmrl.policy import checkpointing_switch, load_policy
    from mmrl.report import write_report
    from mmrl.sft import run_sft
    from mmrl.trainer import GRPOTrainer

    hf_logging.disable_progress_bar()  # weight-loading/saving bars would drown the run's own progress
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    if resume and not cfg_path.exists():
        raise MmrlError(f"--resume: {run_dir} holds no run (no config.yaml)")
    if not resume and (run_dir / "run_state.json").exists():
        raise MmrlError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    cfg_path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    state = RunState(run_dir)
    log = RunLog(run_dir)
    t_start = time.perf_counter()

    seed_everything(cfg.train.seed)
    model_dir = resolve_model(cfg)
    train_samples, train_info = load_split(cfg, "train", show_progress=show_progress)
    eval_samples, eval_info = load_split(cfg, cfg.eval.split, show_progress=show_progress)
    if cfg.eval.limit:
        eval_samples = eval_samples[:cfg.eval.limit]
    if not train_samples:
        raise MmrlError("no training samples left after filtering (check data.toy_tasks / data.problem_types)")
    policy = load_policy(model_dir, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                         device=cfg.model.device)
    policy.set_trainable(vision=not cfg.model.freeze_vision, merger=not cfg.model.freeze_merger,
                         llm=not cfg.model.freeze_llm)
    if cfg.model.gradient_checkpointing:
        checkpointing_switch(policy.model, True)
    stages: dict[str, Any] = {"data": {"train": train_info, "eval": eval_info}}
    if show_progress:
        print(f"run folder: {run_dir}\nmodel: {model_dir} ({policy.family}, "
              f"{sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f}M parameters)\n"
              f"data: {len(train_samples)} train, {len(eval_samples)} {cfg.eval.split} samples", flush=True)

    # Stage 1: cold start.
    sft_dir = run_dir / "sft-model"
    if cfg.sft.steps > 0:
        if state.done("sft") and (sft_dir / "config.json").exists():
            load_weights(policy.model, sft_dir)
        else:
            t0 = time.perf_counter()
            seed_everything(cfg.train.seed + 1)
            result = run_sft(cfg, policy, train_samples, log=log, show_progress=show_progress)
            policy.model.save_pretrained(sft_dir, safe_serialization=True)
            policy.processor.save_pretrained(sft_dir)
            state.finish("sft", {**result, "steps": cfg.sft.steps, "target": cfg.sft.target,
                                 "seconds": round(time.perf_counter() - t0, 1)})
        stages["sft"] = state.get("sft")

    trainer = GRPOTrainer(cfg, policy, train_samples, run_dir=run_dir, eval_samples=eval_samples, log=log,
                          show_progress=show_progress)

    # Stage 2: evaluation before RL (on the weights RL starts from).
    if cfg.eval.before_rl and eval_samples:
        if not state.done("eval_before_rl"):
            if latest_checkpoint(run_dir) is not None:
                raise MmrlError(f"{run_dir}: checkpoints exist but no pre-RL evaluation; start a new run")
            state.finish("eval_before_rl", trainer.run_eval("eval before RL"))
        _print_eval("before RL", state.get("eval_before_rl"), show_progress)

    # Stage 3: RL.
    if not state.done("rl"):
        seed_everything(cfg.train.seed + 2)
        trainer.resume()
        t0 = time.perf_counter()
        trainer.train()
        final = run_dir / "final"
        policy.model.save_pretrained(final, safe_serialization=True)
        policy.processor.save_pretrained(final)
        state.finish("rl", {"steps": trainer.step, "seconds": round(time.perf_counter() - t0, 1),
                            "skipped_samples": trainer.skipped_samples})
    else:
        load_weights(policy.model, run_dir / "final")
    stages["rl"] = state.get("rl")

    # Stage 4: evaluation after RL.
    if cfg.eval.after_rl and eval_samples:
        if not state.done("eval_after_rl"):
            state.finish("eval_after_rl", trainer.run_eval("eval after RL"))
        _print_eval("after RL", state.get("eval_after_rl"), show_progress)

    summary = {
        "task": cfg.task, "run_dir": str(run_dir), "model": str(model_dir), "eval_split": cfg.eval.split,
        "eval_min_options": cfg.eval.min_options,
        "eval_before_rl": state.get("eval_before_rl"), "eval_after_rl": state.get("eval_after_rl"),
        "stages": stages, "wall_seconds": round(time.perf_counter() - t_start, 1),
        "torch_threads": torch.get_num_threads(),
    }
    report = write_report(run_dir, summary)
    log.close()
    if show_progress:
        print(f"report: {report}")
    return summary


def _print_eval(tag: str, metrics: dict[str, Any] | None, show: bool) -> None:
    if not show or not metrics:
        return
    acc = metrics.get("accuracy")
    acc_s = f"{acc:.3f}" if isinstance(acc, float) else "n/a"
    print(f"eval {tag}: accuracy {acc_s} on {metrics.get('n')} questions", flush=True)
