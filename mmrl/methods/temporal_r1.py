"""Temporal-R1 (arXiv 2506.01908): its dual reward (``temporal_r1``, a pure formula in :mod:`rewards.temporal`,
registered by importing this module) and its variance-aware data selection before RL, ``mmrl data
select-variance`` and the ``variance_filter`` sampler (here).

``mmrl data select-variance``:

Every training record is answered ``K`` times (sampled, the run's temperature) by the **starting model**
through the rollout service, each answer is scored with the run's rewards (their weighted total), and the
record is kept when the variance of its ``K`` rewards is above ``tau``: records the model always gets right or
always gets wrong give GRPO no signal. The paper's K and threshold are not public; the defaults are ours:
``K`` = the recipe's group size (8), ``tau`` = 0.01 (for a binary reward any disagreement among 8 answers has
variance >= 0.109; for tIoU it drops answers that differ by a few hundredths only).

Written to ``--out``: ``selected.jsonl`` (the kept records, media paths absolute, ready for ``mmrl train
--data``), ``variance.jsonl`` (one line per record: id, task, the K rewards, mean, variance, kept) and
``report.json`` / ``report.md`` (per task: records, kept, kept share, mean reward, mean variance).

The same selection inside a run is the ``variance_filter`` sampler (``data.sampler: variance_filter``,
:class:`VarianceFilterSampler`): before the first RL step -- after the cold start, so "the starting model" is
the one RL starts from -- it scores every training prompt ``k`` times through the trainer's rollouts and from
then on draws only the kept prompts, in shuffled passes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_pipelines.samplers import UniformSampler, register_sampler
from mmrl_common.errors import ConfigError, MmrlError
from rewards import temporal  # noqa: F401  (registers the temporal_r1 reward: the recipe's one import)


def reward_variance(values: Sequence[float]) -> float:
    """Population variance of one record's rewards."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def score_records(service: Any, rewards: Any, samples: Sequence[Any], *, k: int, temperature: float,
                  max_new_tokens: int, batch_size: int = 8, show_progress: bool = True) -> list[list[float]]:
    """The ``k`` reward totals of each sample (sampled answers through ``service``, scored by ``rewards``)."""
    from tqdm import tqdm

    from mmrl.engine.evaluate import dataset_columns, reward_columns

    out: list[list[float]] = []
    bar = tqdm(total=len(samples), desc="select-variance", unit="record", disable=not show_progress, leave=False)
    for start in range(0, len(samples), batch_size):
        chunk = list(samples[start:start + batch_size])
        answers = service.generate(chunk, n=k, greedy=False, temperature=temperature, max_new_tokens=max_new_tokens)
        flat = [s for s in chunk for _ in range(k)]
        texts = [a.text for group in answers for a in group]
        columns = reward_columns(flat)
        columns["completion_ids"] = [list(a.token_ids) for group in answers for a in group]
        totals = rewards.compute(texts, columns, dataset_columns=dataset_columns(flat)).total
        out.extend(totals[i * k:(i + 1) * k] for i in range(len(chunk)))
        bar.update(len(chunk))
    bar.close()
    return out


@register_sampler("variance_filter")
class VarianceFilterSampler(UniformSampler):
    """Temporal-R1's selection in the run (module docstring). Settings (``data.sampler_kwargs``): ``k``
    rollouts per prompt (default 8), ``tau`` (keep variance > tau; default 0.01), ``chunk_prompts`` (prompts
    per scoring call, default 16). The kept set is part of the state, so a resumed run does not re-score."""

    def __init__(self, samples: Sequence[Any], *, seed: int = 0, k: int = 8, tau: float = 0.01,
                 chunk_prompts: int = 16):
        if not isinstance(k, int) or k < 2:
            raise ConfigError(f"data.sampler_kwargs.k={k!r}: the variance of fewer than 2 answers is always 0; "
                              "use 2 or more")
        if tau < 0:
            raise ConfigError(f"data.sampler_kwargs.tau={tau!r}: a variance is never negative; use 0 or more")
        super().__init__(samples, seed=seed)
        self.k, self.tau, self.chunk_prompts = k, float(tau), max(1, int(chunk_prompts))
        self.kept: list[int] | None = None
        self.scores: list[list[float]] = []
        """The ``k`` reward totals of every prompt from the selection (in the state: what was kept, and why)."""
        self.ctx: Any = None
        self._step: dict[str, float] = {}

    def attach(self, ctx: Any) -> None:
        self.ctx = ctx

    def select(self) -> None:
        """Score every prompt ``k`` times with the current policy and keep those whose variance is above tau."""
        if self.ctx is None:
            raise MmrlError("the variance_filter sampler scores prompts with the trainer's rollouts; it runs "
                            "inside `mmrl train` only (use `mmrl data select-variance` outside a run)")
        t0 = time.perf_counter()
        scores: list[list[float]] = [[] for _ in self.samples]
        indices = list(range(len(self.samples)))
        for batch in self.ctx.rescore(indices, n=self.k, chunk=self.chunk_prompts):
            totals = [float(x) for x in batch.rewards]
            for rows in batch.groups():
                scores[batch.prompt_index[rows[0]]] = [round(totals[r], 6) for r in rows]
        variances = [reward_variance(v) for v in scores]
        kept = [i for i, v in enumerate(variances) if v > self.tau]
        if not kept:
            raise MmrlError(f"variance_filter: no training prompt has reward variance above tau={self.tau} "
                            f"(largest {max(variances):.4f} over {len(variances)} prompts, {self.k} rollouts each); "
                            "lower data.sampler_kwargs.tau, or check that the starting model answers at all")
        self.kept, self.scores = kept, scores
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)
        self._step = {"variance_filter/kept": float(len(kept)), "variance_filter/kept_share": len(kept) / len(variances),
                      "variance_filter/mean_variance": sum(variances) / len(variances),
                      "variance_filter/select_s": time.perf_counter() - t0}

    def _permutation(self, epoch: int) -> list[int]:
        kept = getattr(self, "kept", None)
        if kept is None:
            return super()._permutation(epoch)
        rng = np.random.default_rng([self.seed, epoch])
        return [kept[int(j)] for j in rng.permutation(len(kept))]

    def draw(self, n: int) -> list[int]:
        if self.kept is None:
            self.select()
        return super().draw(n)

    def metrics(self) -> dict[str, float]:
        out, self._step = self._step, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "kept": self.kept, "scores": self.scores}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kept = state.get("kept")
        if kept is not None and any(not 0 <= int(i) < len(self.samples) for i in kept):
            raise MmrlError(f"the checkpoint's variance_filter state keeps prompt indices up to {max(kept)} but the "
                            f"training pool has {len(self.samples)}; resume with the data the run started with")
        self.kept = None if kept is None else [int(i) for i in kept]
        self.scores = [[float(x) for x in v] for v in state.get("scores", [])]
        super().load_state_dict(state)


def task_report(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task (``meta.task``, else the problem type): records, kept, kept share, mean reward, mean variance."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[str(r["task"])].append(r)
    by["all"] = list(rows)
    return {t: {"records": len(rs), "kept": sum(r["kept"] for r in rs),
                "kept_share": sum(r["kept"] for r in rs) / len(rs) if rs else 0.0,
                "mean_reward": sum(r["mean"] for r in rs) / len(rs) if rs else None,
                "mean_variance": sum(r["variance"] for r in rs) / len(rs) if rs else None}
            for t, rs in by.items()}


def select_variance(cfg: Any, out: Path, *, k: int | None = None, tau: float = 0.01, split: str = "train",
                    limit: int | None = None, batch_size: int = 8, show_progress: bool = True) -> dict[str, Any]:
    """Score, select and write (see the module docstring); returns the report."""
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads
    from rewards import CombinedReward

    k = k or cfg.rollout.group_size
    if k < 2:
        raise ConfigError(f"select-variance: -k {k}: the variance of fewer than 2 answers is always 0; use 2 or more")
    if tau < 0:
        raise ConfigError(f"select-variance: --tau {tau}: a variance is never negative; use 0 (any disagreement) "
                          "or more")
    from mmrl.engine.checkpoint import seed_everything

    set_cpu_threads(cfg.train.cpu_threads, show=show_progress)
    seed_everything(cfg.train.seed)  # the same answers on a re-run
    samples, _ = load_split(cfg, split, show_progress=show_progress)
    if limit:
        samples = samples[:limit]
    if not samples:
        raise MmrlError(f"select-variance: no records in the {split} split (check --data / data.toy_tasks)")
    rewards = CombinedReward(cfg.rewards)
    policy = load_policy(resolve_model(cfg), dtype=cfg.model.dtype, device=cfg.model.device)
    service = RolloutService.from_config(policy, cfg)
    t0 = time.perf_counter()
    scores = score_records(service, rewards, samples, k=k, temperature=cfg.rollout.temperature,
                           max_new_tokens=cfg.rollout.max_new_tokens, batch_size=batch_size,
                           show_progress=show_progress)
    rows = []
    for s, values in zip(samples, scores):
        var = reward_variance(values)
        rows.append({"id": s.id, "task": s.meta.get("task") or s.problem_type, "rewards": [round(v, 6) for v in values],
                     "mean": sum(values) / len(values), "variance": var, "kept": var > tau})
    out.mkdir(parents=True, exist_ok=True)
    with (out / "selected.jsonl").open("w") as f:
        for s, r in zip(samples, rows):
            if r["kept"]:
                f.write(json.dumps(s.to_dict(), default=str) + "\n")
    with (out / "variance.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    report = {"k": k, "tau": tau, "split": split, "model": str(resolve_model(cfg)),
              "rewards": rewards.labels, "seconds": round(time.perf_counter() - t0, 1), "tasks": task_report(rows)}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    return report


def report_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Variance-aware selection (K={report['k']}, tau={report['tau']})", "",
             f"Model: `{report['model']}`; rewards: {', '.join(report['rewards'])}; split: {report['split']}.", "",
             "| task | records | kept | kept share | mean reward | mean variance |", "|---|---|---|---|---|---|"]
    for task, t in report["tasks"].items():
        lines.append(f"| {task} | {t['records']} | {t['kept']} | {t['kept_share']:.2f} | {t['mean_reward']:.3f} | "
                     f"{t['mean_variance']:.4f} |")
    return "\n".join(lines) + "\n"


def add_select_variance_parser(sub: argparse._SubParsersAction) -> None:
    from mmrl.run.recipe import OVERRIDE_HELP

    p = sub.add_parser(
        "select-variance", help="keep the training records whose K answers by the starting model disagree",
        description="Temporal-R1's variance-aware data selection: answer every training record K times with the "
                    "starting model, score the answers with the recipe's rewards, keep the records whose reward "
                    "variance is above --tau. Writes selected.jsonl (for mmrl train --data), variance.jsonl and a "
                    "per-task report (report.md, report.json) into --out.")
    p.add_argument("--task", default=None, help="built-in recipe (default video-qa)")
    p.add_argument("--config", default=None, metavar="YAML", help="a YAML file merged over the task recipe")
    p.add_argument("--model", default=None, metavar="DIR", help="the starting model (default: the recipe's)")
    p.add_argument("--data", default=None, metavar="FILE", help="the records to select from (default: the toy world)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for selected.jsonl and the report")
    p.add_argument("-k", type=int, default=None, help="answers per record (default: rollout.group_size)")
    p.add_argument("--tau", type=float, default=0.01, help="keep records whose reward variance is above this "
                                                           "(default 0.01)")
    p.add_argument("--split", choices=["train", "val", "test"], default="train", help="the split (default train)")
    p.add_argument("--limit", type=int, default=None, help="at most this many records")
    p.add_argument("--batch-size", type=int, default=8, help="records per generate call (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDE_HELP)
    p.set_defaults(func=cmd_select_variance)


def cmd_select_variance(args: argparse.Namespace) -> int:
    from mmrl.config import load_run_config
    from mmrl.run.recipe import recipe_args

    extra: dict[str, Any] = {}
    if args.model:
        extra.setdefault("model", {})["path"] = args.model
    if args.data:
        extra.setdefault("data", {})["train" if args.split == "train" else args.split] = args.data
    task, config, recipe = recipe_args(args)  # --config configs/NAME.yaml is --task NAME
    cfg = load_run_config(task=task, config_file=config, overrides=args.overrides, extra=extra, recipe_file=recipe)
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    out = Path(args.out)
    report = select_variance(cfg, out, k=args.k, tau=args.tau, split=args.split, limit=args.limit,
                             batch_size=args.batch_size, show_progress=not args.quiet)
    print(report_markdown(report), end="")
    print(f"kept set: {out / 'selected.jsonl'} ({report['tasks']['all']['kept']} of "
          f"{report['tasks']['all']['records']} records); train on it with --data {out / 'selected.jsonl'}")
    return 0
