"""Run outputs that grow during training: ``metrics.jsonl``, ``rollouts.jsonl``, and the trackers the run
asks for (``train.report_to``: TensorBoard event files in ``<run>/tensorboard``, a wandb run in ``<run>/wandb``).

Every line of ``metrics.jsonl`` is one event: ``{"stage": ..., "step": ..., <metric>: value, ...}``. On
resume, lines from steps after the checkpoint are dropped first so the file reads as one clean run: the kept lines
are streamed to a new file that replaces the log in one rename (:func:`trim_log`); a log is only ever appended to
or replaced whole, never rewritten in place.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from mmrl.config.preflight import check_trackers

ROLLOUT_COLUMNS = ("id", "prompt", "completion", "answer", "reward", "advantage", "response_length")


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _scalars(rec: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in rec.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "stage")}


def rollout_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """The logged rollouts as table rows (:data:`ROLLOUT_COLUMNS`): the completion is the text of its turns,
    the reward the sum of its components (as logged)."""
    rows = []
    for r in records:
        turns = r.get("turns")
        completion = "\n".join(map(str, turns)) if isinstance(turns, list) else str(turns or r.get("completion", ""))
        rewards = r.get("rewards") or {}
        reward = r.get("reward", sum(v for v in rewards.values() if isinstance(v, (int, float))))
        rows.append([str(r.get("id", "")), str(r.get("prompt", "")), completion, str(r.get("answer", "")),
                     reward, r.get("advantage"), r.get("response_length")])
    return rows


class TensorBoardTracker:
    """Scalars as ``<stage>/<metric>`` at the stage's step; the rollouts as a markdown table (text plugin)."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def metrics(self, stage: str, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(f"{stage}/{k}", v, step)
        self.writer.flush()

    def rollouts(self, stage: str, step: int, records: list[dict[str, Any]]) -> None:
        def cell(v: Any) -> str:
            return str(v).replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(ROLLOUT_COLUMNS) + " |", "|" + " --- |" * len(ROLLOUT_COLUMNS)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rollout_rows(records)]
        self.writer.add_text(f"{stage}/rollouts", "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode() -> tuple[str, str]:
    """``(mode, why)``: WANDB_MODE when set; else online only with an API key and wandb's server reachable,
    otherwise offline (the run syncs later with ``wandb sync``)."""
    mode = os.environ.get("WANDB_MODE", "").strip()
    if mode:
        return mode, "WANDB_MODE"
    import netrc
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    key = os.environ.get("WANDB_API_KEY")
    if not key:
        try:
            key = (netrc.netrc().authenticators(host) or (None, None, None))[2]
        except (OSError, netrc.NetrcParseError):
            key = None
    if not key:
        return "offline", "no wandb API key (wandb login)"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        return "offline", f"{host} cannot be reached"
    return "online", "API key and network"


class WandbTracker:
    """One wandb run per run folder (``<run>/wandb``; a resumed run continues it): each stage's metrics against
    that stage's own step (``<stage>/step``, wandb's ``define_metric``), the rollouts as a ``wandb.Table``."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None, show: bool):
        import wandb

        self.wandb = wandb
        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        mode, why = wandb_mode()
        self.run = wandb.init(dir=str(run_dir), id=run_id, resume="allow", mode=mode, name=run_dir.name,
                              project=os.environ.get("WANDB_PROJECT", "mmrl"), config=config,
                              settings=wandb.Settings(silent=True, console="off"))
        self.stages: set[str] = set()
        if show:
            print(f"wandb: {mode} ({why}); {self.run.dir}"
                  + (f" — upload later with `wandb sync {Path(self.run.dir).parent}`" if mode == "offline" else ""),
                  flush=True)

    def _stage(self, stage: str) -> None:
        if stage not in self.stages:
            self.run.define_metric(f"{stage}/step")
            self.run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
            self.stages.add(stage)

    def metrics(self, stage: str, step: int, values: dict[str, float]) -> None:
        self._stage(stage)
        self.run.log({f"{stage}/step": step, **{f"{stage}/{k}": v for k, v in values.items()}})

    def rollouts(self, stage: str, step: int, records: list[dict[str, Any]]) -> None:
        self._stage(stage)
        table = self.wandb.Table(columns=list(ROLLOUT_COLUMNS), data=rollout_rows(records))
        self.run.log({f"{stage}/step": step, f"{stage}/rollouts": table})

    def close(self) -> None:
        self.run.finish()


class RunLog:
    """The run's growing logs. Under data parallelism only rank 0 writes (``enabled`` is False on the
    others, and every call is a no-op there). ``report_to`` names the trackers that get the same metrics and
    rollouts (``train.report_to``); ``config`` is the run's configuration, which wandb records."""

    def __init__(self, run_dir: Path, *, report_to: list[str] | tuple[str, ...] = (), config: dict[str, Any] | None = None,
                 enabled: bool | None = None, show: bool = False):
        from mmrl.engine.distributed import world

        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        self.enabled = world().is_main if enabled is None else enabled
        self.trackers: list[Any] = []
        if self.enabled and report_to:
            check_trackers(list(report_to))
            run_dir.mkdir(parents=True, exist_ok=True)
            for name in dict.fromkeys(report_to):
                self.trackers.append(TensorBoardTracker(run_dir) if name == "tensorboard"
                                     else WandbTracker(run_dir, config, show))

    def last_step(self, stage: str) -> int:
        """The last step of ``stage`` in ``metrics.jsonl`` (0: none)."""
        if not self.enabled or not self.metrics_path.exists():
            return 0
        last = 0
        with self.metrics_path.open("rb") as f:
            for line in f:  # a line at a time
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("stage") == stage:
                    last = max(last, int(rec.get("step", 0)))
        return last

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop events of ``stage`` after ``step`` (and everything logged after them) before a resume
        (:func:`trim_log`: the log is never rewritten in place)."""
        if not self.enabled:
            return
        for path in (self.metrics_path, self.rollouts_path):
            trim_log(path, stage, step)

    def metrics(self, stage: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = {"stage": stage, "step": step, **{k: _clean(v) for k, v in values.items()}}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        scalars = _scalars(rec)
        for tracker in self.trackers:
            tracker.metrics(stage, step, scalars)

    def rollouts(self, stage: str, step: int, records: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self.rollouts_path.open("a") as f:
            for r in records:
                f.write(json.dumps({"stage": stage, "step": step, **r}, default=str) + "\n")
        for tracker in self.trackers:
            tracker.rollouts(stage, step, records)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def _kept(path: Path, stage: str, step: int) -> Any:
    """``(line, whole)`` for each line of the log up to the first event of ``stage`` after ``step``, read a
    line at a time; ``whole``: a JSON record ending in a newline (else a line cut by a kill, dropped)."""
    with path.open("rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by the kill (JSON or UTF-8)
                yield line, False
                continue
            if isinstance(rec, dict) and rec.get("stage") == stage and rec.get("step", 0) > step:
                return
            yield line, line.endswith(b"\n")


def trim_log(path: Path, stage: str, step: int) -> bool:
    """Drop the events of ``stage`` after ``step`` from the JSON-lines log ``path``, and everything logged after
    the first of them, and lines cut by a kill; True when the file changed. Streamed (the log may be far larger
    than memory): the kept lines go to a new file beside it, flushed to the disk, which then replaces the log in
    one rename, so a process killed at any moment leaves the old log or the trimmed one, whole. A log that
    loses nothing is left as it is."""
    if not path.is_file():
        return False
    size, kept_bytes, whole = path.stat().st_size, 0, True
    for line, ok in _kept(path, stage, step):
        kept_bytes += len(line)
        whole = whole and ok
    if whole and kept_bytes == size:
        return False
    tmp = path.with_name(f".{path.name}.trim")
    with tmp.open("wb") as out:
        for line, ok in _kept(path, stage, step):
            if ok:
                out.write(line)
            elif not line.endswith(b"\n"):  # the last line: whole but for its newline, or cut
                try:
                    json.loads(line)
                    out.write(line + b"\n")
                except ValueError:
                    pass
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


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
