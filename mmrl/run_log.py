"""Run outputs that grow during training: ``metrics.jsonl``, ``rollouts.jsonl``, TensorBoard (if installed).

Every line of ``metrics.jsonl`` is one event: ``{"stage": ..., "step": ..., <metric>: value, ...}``. On
resume, lines from steps after the checkpoint are dropped first so the file reads as one clean run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLog:
    """The run's growing logs. Under data parallelism only rank 0 writes (``enabled`` is False on the
    others, and every call is a no-op there)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, enabled: bool | None = None):
        from mmrl.distributed import world

        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        self.enabled = world().is_main if enabled is None else enabled
        self._tb = None
        if tensorboard and self.enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self._tb = None

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop events of ``stage`` after ``step`` (and everything logged after them) before a resume."""
        if not self.enabled:
            return
        for path in (self.metrics_path, self.rollouts_path):
            if not path.exists():
                continue
            kept = []
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by the kill
                if rec.get("stage") == stage and rec.get("step", 0) > step:
                    break
                kept.append(line)
            path.write_text("".join(k + "\n" for k in kept))

    def metrics(self, stage: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = {"stage": stage, "step": step, **{k: _clean(v) for k, v in values.items()}}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(f"{stage}/{k}", v, step)

    def rollouts(self, stage: str, step: int, records: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self.rollouts_path.open("a") as f:
            for r in records:
                f.write(json.dumps({"stage": stage, "step": step, **r}, default=str) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
