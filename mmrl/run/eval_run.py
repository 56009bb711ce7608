"""``mmrl eval`` on a held-out split: the questions loaded (each rank checks its share of the media files),
the model loaded, every question answered (each rank its share), and ``metrics.json`` and
``predictions.jsonl`` written by rank 0 into the output folder: each whole or not at all (a temporary file
renamed), with the folder's lock (:mod:`mmrl.run.lock`) held from the start, so a second ``mmrl eval`` (or a
run) into the same ``--out`` is refused instead of both writing there. A model folder mmrl wrote is checked
against its digest before it loads (:func:`mmrl.run.helpers.resolve_model`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.config import RunConfig


def eval_run(cfg: RunConfig, w: Any, *, checks: dict[str, dict[str, Any]], show: bool,
             no_split: Callable[[], None]) -> tuple[dict[str, Any], Path] | None:
    """Evaluate ``cfg``'s model on ``cfg.eval.split`` with the rank group ``w``; rank 0 gets the metrics and
    the output folder, the others None. ``no_split``: raises the command's error when the run names training
    data but no split to evaluate (every rank alike)."""
    from mmrl.run.lock import acquire_on_main

    out = Path(cfg.out) if cfg.out else Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    existed = out.exists()
    lock = acquire_on_main(out, w, show=show)  # one writer per folder: a second eval into --out is refused
    try:
        result = _evaluate(cfg, w, checks=checks, show=show, no_split=no_split)
        if result is None:
            return None
        write_outputs(out, *result)
        return result[0], out
    except BaseException:
        if lock is not None and not existed:  # a folder this command made and wrote nothing into: not left behind
            _remove_if_empty(out)
        raise
    finally:
        if lock is not None:
            lock.release()


def _evaluate(cfg: RunConfig, w: Any, *, checks: dict[str, dict[str, Any]], show: bool,
              no_split: Callable[[], None]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    from mmrl.engine.distributed import device_for
    from mmrl.engine.evaluate import evaluate, require_questions
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads, split_path

    set_cpu_threads(cfg.train.cpu_threads, show=show)
    with w.node_first():  # each node's local rank 0 builds the node's cache (toy world) first
        held_out = split_path(cfg, cfg.eval.split, show_progress=show)
    if held_out is None:
        no_split()
    with w.spread_media_checks():  # every rank checks its share of the media files
        samples, info = load_split(cfg, cfg.eval.split, show_progress=show)
    require_questions(samples, info)  # an empty file, or one the settings filter to nothing: said, not 0 of 0
    with w.node_first():  # ... and the tiny model, once the questions are known; a damaged final/ named here
        model_dir = resolve_model(cfg)
    if cfg.eval.limit:
        samples = samples[:cfg.eval.limit]
    policy = load_policy(model_dir, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                         device=device_for(cfg.model.device))
    metrics, preds = evaluate(  # unreadable media: stop naming the file, or with data.on_bad_sample=skip leave out
        RolloutService.from_config(policy, cfg), samples,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, batch_size=cfg.eval.batch_size,
        min_options=cfg.eval.min_options, show_progress=show, checks=checks,
        skip_bad=cfg.data.on_bad_sample == "skip")
    if not w.is_main:
        return None
    return metrics, preds


def write_outputs(out: Path, metrics: dict[str, Any], preds: list[dict[str, Any]]) -> None:
    """``metrics.json`` and ``predictions.jsonl``, each written whole (a temporary file renamed); the predictions
    first, so a ``metrics.json`` is never beside another evaluation's predictions."""
    from mmrl_common.file_digest import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "predictions.jsonl", "".join(json.dumps(p, default=str) + "\n" for p in preds))
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")


def _remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing but the lock file (an evaluation that failed before writing)."""
    from mmrl.run.lock import LOCK_NAME

    try:
        if {p.name for p in folder.iterdir()} <= {LOCK_NAME}:
            (folder / LOCK_NAME).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:
        pass
