"""``mmrl sft``: a cold start on its own run folder (held by its lock; a folder holding a run needs
``--overwrite``, which moves it aside, or ``--resume``, which continues it), its metrics logged and ``final/``
written with the settings the model was trained with.

The folder holds ``config.yaml`` (the settings, sealed with their sha256 as ``mmrl train`` writes it) and
``inputs.json`` (the data files' content and the model's identity) from the start. SIGTERM or SIGINT
(:func:`mmrl.run.pipeline.stop_requests`) lets the optimizer step in flight finish, writes ``checkpoint-<step>/``
(the weights, the optimizer, the scheduler, the data position and every random state:
:class:`mmrl.engine.sft.SftCheckpoints`), says where the run stopped and the command that continues it, and
ends the process with 128 + the signal (143 for SIGTERM). ``mmrl sft --out DIR --resume`` continues from that
checkpoint with the settings in ``config.yaml``: its steps, logged losses and final weights are those of a run
never stopped. ``final/`` appears only when every step is done (written whole: a temporary folder renamed, with
its digest); the stop's checkpoint is removed then (it only served the resume)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from mmrl.config import RunConfig
from mmrl_common.errors import MmrlError


def sft_run(cfg: RunConfig, run_dir: Path, *, overwrite: bool, show: bool, resume: bool = False) -> dict[str, Any]:
    """Supervised fine-tuning of ``cfg``'s model on its training split into ``run_dir`` (``resume``: continue the
    SFT run there from its checkpoint); the SFT result. Stopped by a signal: :class:`mmrl.run.pipeline.Stopped`."""
    from mmrl.run import lock as run_lock
    from mmrl.run.inputs import absolute_paths

    lock = run_lock.acquire(run_dir)  # one writer per folder, for as long as this command writes it
    try:
        if resume:
            _check_resume(run_dir, cfg, overwrite=overwrite)
        else:
            cfg = absolute_paths(cfg)  # config.yaml finds the model and data from any working folder
            _check_fresh(run_dir, overwrite=overwrite, show=show)
        return _train(cfg, run_dir, show=show, resume=resume)
    finally:
        lock.release()


def _check_fresh(run_dir: Path, *, overwrite: bool, show: bool) -> None:
    """A new SFT run in ``run_dir``: a folder holding a run needs ``--overwrite`` (its contents moved aside) or,
    for an SFT run a signal stopped, ``--resume``."""
    from mmrl.run import lock as run_lock

    found = run_lock.run_contents(run_dir)
    if found and not overwrite:
        stopped = not (run_dir / "final").exists() and any(n.startswith("checkpoint-") for n in found)
        how = "pass --resume to continue it, or --overwrite" if stopped else "pass --overwrite"
        raise MmrlError(f"{run_dir} already holds a run; {how} to start afresh (its contents are moved aside into "
                        f"{run_dir.name}.replaced-<time>), or choose another --out (found: "
                        f"{', '.join(found[:6])}{' ...' if len(found) > 6 else ''})")
    if found:
        aside = run_lock.move_aside(run_dir)
        print(f"--overwrite: the earlier run in {run_dir} moved aside into {aside}", flush=True)
    else:
        run_lock.clear_failed_start(run_dir, show=show)


def _check_resume(run_dir: Path, cfg: RunConfig, *, overwrite: bool) -> None:
    """``--resume`` continues an unfinished SFT run with the settings, data and model it started with."""
    from mmrl.run.folder import check_saved_config
    from mmrl.run.inputs import input_changes

    if overwrite:
        raise MmrlError("--resume continues the run in the folder, --overwrite starts a new one there: pass one")
    if not (run_dir / "config.yaml").is_file():
        raise MmrlError(f"--resume: {run_dir} holds no run (no config.yaml)")
    check_saved_config(run_dir / "config.yaml")
    if (run_dir / "final").exists():
        raise MmrlError(f"--resume: the SFT run in {run_dir} finished: its model is {run_dir / 'final'}; nothing to "
                        "continue (--overwrite starts it afresh)")
    changes = input_changes(run_dir, cfg)
    if changes:
        raise MmrlError(f"--resume: the SFT run in {run_dir} would continue on other data or another model than it "
                        f"started with: {'; '.join(changes)}. Put back what it started with (inputs.json in the run "
                        "folder holds each file's size and sha256), or start afresh (--overwrite, or another --out)")


def _train(cfg: RunConfig, run_dir: Path, *, show: bool, resume: bool) -> dict[str, Any]:
    from mmrl.config.io import to_dict
    from mmrl.engine.checkpoint import eval_settings, list_checkpoints, save_model, seed_everything
    from mmrl.engine.run_log import RunLog
    from mmrl.engine.sft import SftCheckpoints, run_sft
    from mmrl.model import load_policy
    from mmrl.run.folder import config_text, write_config
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads
    from mmrl.run.inputs import record_inputs
    from mmrl.run.pipeline import Stopped, stop_requests

    with stop_requests("stopping after the step in flight, with a checkpoint", show=True) as asked:
        if not resume:
            write_config(run_dir, config_text(cfg))
        set_cpu_threads(cfg.train.cpu_threads, show=show)
        seed_everything(cfg.train.seed)
        samples, _ = load_split(cfg, "train", show_progress=show)
        model_dir = resolve_model(cfg)
        if not resume:
            record_inputs(run_dir, cfg, model_dir)
        policy = load_policy(model_dir, dtype=cfg.model.dtype, device=cfg.model.device)
        policy.set_trainable(vision=not cfg.model.freeze_vision, merger=not cfg.model.freeze_merger,
                             llm=not cfg.model.freeze_llm)
        log = RunLog(run_dir, report_to=cfg.train.report_to, config=to_dict(cfg), show=show)
        ckpt = SftCheckpoints(run_dir, stop_requested=asked, resume=resume)
        try:
            result = run_sft(cfg, policy, samples, log=log, show_progress=show, checkpoints=ckpt)
        finally:
            log.close()
        if not ckpt.stopped_by:  # every step done (a signal during the last one let it finish): the model
            save_model(run_dir / "final", policy.model, policy.processor, eval_settings(cfg))
    if ckpt.stopped_by:
        import signal

        kept = (f"checkpoint-{ckpt.step} written" if ckpt.saved is not None else
                f"checkpoint-{ckpt.step} kept" if ckpt.step else "no step was done")
        print(f"stopped by {signal.Signals(ckpt.stopped_by).name} at SFT step {ckpt.step} of {cfg.sft.steps}; "
              f"{kept}. Continue with: mmrl sft --out {run_dir} --resume", file=sys.stderr, flush=True)
        raise Stopped(ckpt.stopped_by)
    for folder in list_checkpoints(run_dir):  # a stop's checkpoint served the resume; final/ holds the model now
        shutil.rmtree(folder, ignore_errors=True)
    (run_dir / "latest").unlink(missing_ok=True)
    return result
