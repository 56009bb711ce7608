"""``mmrl eval`` on a held-out split: the questions loaded (each rank checks its share of the media files),
the model loaded, every question answered (each rank its share), and ``metrics.json`` and
``predictions.jsonl`` written by rank 0 into the output folder."""

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
    with w.node_first():  # ... and the tiny model, once the questions are known
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
    out = Path(cfg.out) if cfg.out else Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    with (out / "predictions.jsonl").open("w") as f:
        for p in preds:
            f.write(json.dumps(p, default=str) + "\n")
    return metrics, out
