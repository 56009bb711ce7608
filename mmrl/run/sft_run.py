"""``mmrl sft``: a cold start on its own run folder (held by its lock; a folder holding a run needs
``--overwrite``, which moves it aside), its metrics logged and ``final/`` written with the settings the model
was trained with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.config import RunConfig
from mmrl_common.errors import MmrlError


def sft_run(cfg: RunConfig, run_dir: Path, *, overwrite: bool, show: bool) -> dict[str, Any]:
    """Supervised fine-tuning of ``cfg``'s model on its training split into ``run_dir``; the SFT result."""
    from mmrl.run import lock as run_lock

    lock = run_lock.acquire(run_dir)  # one writer per folder, for as long as this command writes it
    try:
        found = run_lock.run_contents(run_dir)
        if found and not overwrite:
            raise MmrlError(f"{run_dir} already holds a run; pass --overwrite to start afresh (its contents are "
                            f"moved aside into {run_dir.name}.replaced-<time>), or choose another --out (found: "
                            f"{', '.join(found[:6])}{' ...' if len(found) > 6 else ''})")
        if found:
            aside = run_lock.move_aside(run_dir)
            print(f"--overwrite: the earlier run in {run_dir} moved aside into {aside}", flush=True)
        else:
            run_lock.clear_failed_start(run_dir, show=show)
        return _train(cfg, run_dir, show=show)
    finally:
        lock.release()


def _train(cfg: RunConfig, run_dir: Path, *, show: bool) -> dict[str, Any]:
    from mmrl.config.io import to_dict
    from mmrl.engine.checkpoint import eval_settings, save_model, seed_everything
    from mmrl.engine.run_log import RunLog
    from mmrl.engine.sft import run_sft
    from mmrl.model import load_policy
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads

    set_cpu_threads(cfg.train.cpu_threads, show=show)
    seed_everything(cfg.train.seed)
    samples, _ = load_split(cfg, "train", show_progress=show)
    policy = load_policy(resolve_model(cfg), dtype=cfg.model.dtype, device=cfg.model.device)
    policy.set_trainable(vision=not cfg.model.freeze_vision, merger=not cfg.model.freeze_merger,
                         llm=not cfg.model.freeze_llm)
    log = RunLog(run_dir, report_to=cfg.train.report_to, config=to_dict(cfg), show=show)
    try:
        result = run_sft(cfg, policy, samples, log=log, show_progress=show)
    finally:
        log.close()
    save_model(run_dir / "final", policy.model, policy.processor, eval_settings(cfg))
    return result
