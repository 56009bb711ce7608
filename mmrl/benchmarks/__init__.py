"""Evaluation on public benchmarks (MVBench, Video-MME, LongVideoBench, MMVU, VQA-RAD, SLAKE, PathVQA, toy).

``mmrl eval --benchmark NAME --data-root DIR --model DIR`` runs :func:`run_benchmark`; see
:mod:`mmrl.benchmarks.runner` for the outputs and :mod:`mmrl.benchmarks.protocols` for the protocols.
What is particular to a benchmark (reader, protocol settings and prompts, frame rule, headline and breakdowns,
lmms-eval task names) is its :class:`~data_pipelines.benchmarks.Benchmark` spec, read here and nowhere else.
"""

from __future__ import annotations

import argparse
from typing import Any

from mmrl.benchmarks.protocols import Protocol, build_prompt, make_protocol
from mmrl.benchmarks.runner import headline, read_predictions, run_benchmark
from mmrl.benchmarks.scoring import score_item, summarize

__all__ = ["Protocol", "build_prompt", "cli_run", "headline", "make_protocol", "read_predictions",
           "run_benchmark", "score_item", "summarize"]


def cli_run(args: argparse.Namespace, cfg: Any, checks: dict[str, dict[str, Any]] | None = None) -> int:
    """``mmrl eval --benchmark ...``: ``cfg`` is the run config (model path, dtype, eval.* overrides);
    ``checks``: the evaluation checks to run too (``--check NAME``, loaded)."""
    from pathlib import Path

    from mmrl.benchmarks.judged import judge_flag
    from mmrl.engine.backends.vllm import settings_from_config
    from mmrl.engine.distributed import device_for, world
    from mmrl.run.helpers import resolve_model
    from mmrl_common.errors import MmrlError

    if not args.data_root:
        raise MmrlError("--benchmark needs --data-root DIR (the folder the benchmark was downloaded to)")
    if cfg.model.path and not Path(cfg.model.path).exists():
        raise MmrlError(f"--model: folder not found: {cfg.model.path}")
    with world().node_first():  # each node's local rank 0 builds a cached model (the tiny one) first
        model = resolve_model(cfg)
    if getattr(args, "lmms_eval", False):
        from mmrl.benchmarks.lmms_bridge import run_lmms_eval

        return run_lmms_eval(model, args.benchmark, out=args.out, frames=args.frames, max_pixels=args.max_pixels,
                             batch_size=args.batch_size or 1, limit=args.limit, subtitles=args.subtitles)
    metrics = run_benchmark(
        args.benchmark, args.data_root, model, out=args.out, protocol=args.protocol, frames=args.frames,
        max_pixels=args.max_pixels, prompt_template=args.prompt_template,
        max_new_tokens=cfg.eval.max_new_tokens, batch_size=args.batch_size or cfg.eval.batch_size,
        limit=args.limit, workers=args.workers, split=args.split, subtitles=args.subtitles, dtype=cfg.model.dtype,
        show_progress=not args.quiet, backend=cfg.rollout.backend, vllm=settings_from_config(cfg),
        on_bad_sample=cfg.data.on_bad_sample, seed=cfg.train.seed, device=device_for(cfg.model.device),
        checks=checks, judge=judge_flag(getattr(args, "judge", None), getattr(args, "judge_key_env", None)))
    if world().is_main:
        print(headline(metrics))
        for lines in (metrics.get("checks") or {}).values():
            print("\n".join(lines))
        out = metrics.get("out")
        if out:
            print(f"results: {out}")
    return 0
