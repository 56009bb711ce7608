"""``mmrl compare SPEC.yaml``: a method against plain GRPO, arms x seeds, one table with intervals.

Every (arm, seed) is an ordinary run folder ``OUT/<arm>/seed-<s>/`` made by ``mmrl train`` in a subprocess
(its output goes to ``train.log`` there). A re-run skips finished runs, resumes interrupted ones
(``--resume``) and starts missing ones; a finished or interrupted run whose saved ``config.yaml`` differs from
what the spec now asks is refused with the differences named (``--force`` reuses it). ``OUT/compare.md`` holds one table (per metric and arm: mean, sample
standard deviation, 95% t-interval over seeds, difference to the base arm), the paired differences (per seed,
each arm minus the base arm on the seeds both finished: mean, sd, 95% t-interval, seeds higher / lower / tied;
:func:`paired_differences`) and the overlaid curves; ``OUT/compare.json`` holds the same numbers.

Metric names (``metrics:`` in the spec):

- ``eval_after_rl.accuracy``: a dotted path into the run's ``summary.json`` (``eval_before_rl.by_task.color``,
  ``eval_after_rl.by_problem_type.multiple_choice``, ``wall_seconds``, ...);
- ``gain``: ``eval_after_rl.accuracy - eval_before_rl.accuracy``; ``gain.by_task.color`` the same difference
  for another path of the two evaluations;
- ``last:KEY``, ``mean:KEY``, ``min:KEY``, ``max:KEY``: the last value (mean, ...) of a ``metrics.jsonl`` key
  over the RL steps, e.g. ``last:reward/accuracy``, ``mean:groups_with_variance``;
- ``reach:KEY>=VALUE`` (or ``<=``): the first RL step at which a ``metrics.jsonl`` key reaches VALUE, e.g.
  ``reach:eval/accuracy>=0.30`` (steps to a held-out score; a run that never reaches it counts as missing);
- a ``*`` as the last part of a path (``eval_after_rl.by_task.*``) or anywhere in a ``metrics.jsonl`` key
  (``mean:reward/*``) stands for every key found in the runs (one table row each).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.config.io import load_yaml
from mmrl_common.errors import ConfigError, MmrlError
from mmrl_common.registry import did_you_mean, nearest

SPEC_KEYS = ("arms", "seeds", "metrics", "curves", "base", "out", "parallel", "overrides")
ARM_KEYS = ("task", "config", "overrides")
DEFAULT_METRICS = ["eval_before_rl.accuracy", "eval_after_rl.accuracy", "gain"]
DEFAULT_CURVES = ["reward", "reward/accuracy"]
SET_BY_COMPARE = ("train.seed", "out")  # each run's seed and folder
SUMMARY_KEYS = ("eval_before_rl", "eval_after_rl", "stages", "wall_seconds", "task", "model", "eval_split",
                "eval_min_options", "torch_threads")  # a close misspelling of one of these is an error
LOG = "train.log"
EXIT_MARK = "[mmrl compare] exit status "
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def default_parallel() -> int:
    """Half the cores: each run keeps two for its torch threads and video decoding (1 on a 2-core machine)."""
    return max(1, (os.cpu_count() or 1) // 2)


# ----------------------------------------------------------------------------------------------- statistics

# t_{0.975, df} for df = 1..30; beyond 30 a Cornish-Fisher expansion around z_{0.975} (error < 1e-5).
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass
class Stats:
    n: int
    mean: float | None = None
    sd: float | None = None  # sample standard deviation (n - 1); None below two values
    lo: float | None = None  # 95% t-interval: mean -+ t975(n - 1) * sd / sqrt(n)
    hi: float | None = None


def summarize(values: list[float]) -> Stats:
    n = len(values)
    if n == 0:
        return Stats(0)
    mean = sum(values) / n
    if n == 1:
        return Stats(1, mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Stats(n, mean, sd, mean - half, mean + half)


def intervals_overlap(a: Stats, b: Stats) -> bool | None:
    """Whether the two 95% intervals overlap; None when either has fewer than two values or is degenerate
    (zero width: every seed gave the same value, e.g. the same share of a handful of questions)."""
    if a.lo is None or b.lo is None or not a.sd or not b.sd:
        return None
    return a.lo <= b.hi and b.lo <= a.hi


def clip_interval(s: Stats, bounds: tuple[float, float] | None) -> Stats:
    """``s`` with its interval clipped to the metric's range (an accuracy's is [0, 1], a gain's [-1, 1])."""
    if bounds is None or s.lo is None:
        return s
    return Stats(s.n, s.mean, s.sd, max(s.lo, bounds[0]), min(s.hi, bounds[1]))


def paired_differences(arm: dict[int, float], base: dict[int, float],
                       bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """The per-seed differences ``arm − base`` on the seeds both have (the arms share their seeds, so the
    seed's own luck cancels): their number, mean, sd and 95% t-interval (:func:`summarize`; clipped to the
    range a difference of a metric in ``bounds`` can take), the seeds the arm is higher / lower / tied on,
    and ``excludes_zero`` (None with fewer than two pairs or a zero-width interval)."""
    seeds = sorted(set(arm) & set(base))
    diffs = [arm[s] - base[s] for s in seeds]
    width = None if bounds is None else bounds[1] - bounds[0]
    d = clip_interval(summarize(diffs), None if width is None else (-width, width))
    return {"seeds": seeds, "n": d.n, "mean": d.mean, "sd": d.sd, "ci95": None if d.lo is None else [d.lo, d.hi],
            "higher": sum(x > 0 for x in diffs), "lower": sum(x < 0 for x in diffs),
            "tied": sum(x == 0 for x in diffs),
            "excludes_zero": None if d.lo is None or not d.sd else not d.lo <= 0 <= d.hi}


# ---------------------------------------------------------------------------------------------------- spec

@dataclass
class Arm:
    name: str
    task: str | None = None
    config: str | None = None  # resolved path
    overrides: list[str] = field(default_factory=list)  # the arm's own
    shared: list[str] = field(default_factory=list)  # the spec's overrides: for every arm, before its own

    @property
    def all_overrides(self) -> list[str]:
        return [*self.shared, *self.overrides]


@dataclass
class Spec:
    path: Path
    arms: dict[str, Arm]
    seeds: list[int]
    base: str
    out: Path
    parallel: int
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    curves: list[str] = field(default_factory=lambda: list(DEFAULT_CURVES))


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"compare spec {key}: {msg}")


def _str_list(value: Any, key: str, what: str = "strings") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _err(key, f"expected a list of {what}")
    return list(value)


def _overrides(value: Any, key: str) -> list[str]:
    items = _str_list(value or [], key, "key=value strings")
    for item in items:
        name = item.split("=", 1)[0].strip()
        if "=" not in item or not name:
            raise _err(key, f"expected a list of key=value strings, got {item!r}")
        if name in SET_BY_COMPARE:
            raise _err(key, f"{name} is set by mmrl compare (seeds: / out:), not by an override")
    return items


def parse_metric(name: str) -> tuple[str, str]:
    """``(kind, argument)``: ``("summary", path)``, ``("gain", path)`` or ``(aggregate, metrics.jsonl key)``."""
    if ":" in name:
        agg, key = name.split(":", 1)
        if agg == "reach":
            _reach_target(name, key)
            return agg, key
        if agg not in AGGREGATES:
            raise ValueError(f"unknown aggregate '{agg}:'; {did_you_mean(agg, [*AGGREGATES, 'reach'])}"
                             f"valid: {', '.join(a + ':' for a in AGGREGATES)}, reach:")
        if not key:
            raise ValueError(f"'{name}' names no metrics.jsonl key")
        return agg, key
    parts = name.split(".")
    if "" in parts or any("*" in p for p in parts[:-1]) or ("*" in parts[-1] and parts[-1] != "*"):
        raise ValueError(f"'{name}' is not a dotted path (a '*' may only stand for the whole last part)")
    if parts[0] == "gain":
        return "gain", ".".join(parts[1:]) or "accuracy"
    if parts[0] not in SUMMARY_KEYS and nearest(parts[0], SUMMARY_KEYS):
        raise ValueError(f"unknown summary.json key '{parts[0]}'; {did_you_mean(parts[0], SUMMARY_KEYS)}")
    return "summary", name


def _resolve_config(value: Any, spec_dir: Path, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _err(key, "expected a path to a YAML file")
    for path in (Path(value),) if Path(value).is_absolute() else (spec_dir / value, Path(value)):
        if path.is_file():
            return str(path.resolve())
    raise _err(key, f"file not found: {value} (relative paths are read from {spec_dir} or the working folder)")


def _arm(name: Any, value: Any, shared: list[str], spec_dir: Path) -> Arm:
    if not isinstance(name, str) or not ARM_NAME.match(name):
        raise _err(f"arms.{name}", "an arm name is a folder name: letters, digits, '_', '-', '.'")
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise _err(f"arms.{name}", "expected a mapping with task:, config:, overrides:")
    for key in value:
        if key not in ARM_KEYS:
            raise _err(f"arms.{name}", f"unknown key '{key}'; {did_you_mean(key, ARM_KEYS)}valid: "
                                        + ", ".join(ARM_KEYS))
    task = value.get("task")
    if task is not None and not isinstance(task, str):
        raise _err(f"arms.{name}.task", "expected a task name such as video-qa")
    config = value.get("config")
    if config is not None:
        config = _resolve_config(config, spec_dir, f"arms.{name}.config")
    return Arm(name, task, config, _overrides(value.get("overrides"), f"arms.{name}.overrides"), shared)


def check_arm(arm: Arm) -> None:
    """Load the arm's configuration as ``mmrl train`` will (this checks every key and value)."""
    from mmrl.cli.commands import train_config

    try:
        train_config(arm_argv(arm, 0))
    except MmrlError as exc:
        raise _err(f"arms.{arm.name}", str(exc)) from None


def load_spec(path: str | Path, *, check: bool = True, out: str | None = None) -> Spec:
    """Read and check a spec; with ``check`` every arm's configuration is loaded too."""
    path = Path(path)
    data = load_yaml(path, what="compare spec", expected=f"a mapping with {', '.join(SPEC_KEYS)}")
    for key in data:
        if key not in SPEC_KEYS:
            raise ConfigError(f"compare spec: unknown key '{key}'; {did_you_mean(str(key), SPEC_KEYS)}"
                              f"valid: {', '.join(SPEC_KEYS)}")
    arms_in = data.get("arms")
    if not isinstance(arms_in, dict) or not arms_in:
        raise _err("arms", "expected a mapping of arm name -> {task:, config:, overrides:}")
    shared = _overrides(data.get("overrides"), "overrides")
    arms = {name: _arm(name, value, shared, path.parent) for name, value in arms_in.items()}
    seeds = data.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) < len(seeds)):
        raise _err("seeds", "expected a list of different integers, e.g. [0, 1, 2]")
    metrics = _str_list(data.get("metrics", DEFAULT_METRICS), "metrics", "metric names")
    for i, name in enumerate(metrics):
        try:
            parse_metric(name)
        except ValueError as exc:
            raise _err(f"metrics[{i}]", str(exc)) from None
    curves = _str_list(data.get("curves", DEFAULT_CURVES), "curves", "metrics.jsonl keys")
    base = data.get("base", next(iter(arms)))
    if not isinstance(base, str) or base not in arms:
        raise _err("base", f"'{base}' is not an arm; {did_you_mean(str(base), arms)}arms: {', '.join(arms)}")
    parallel = data.get("parallel", default_parallel())
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise _err("parallel", f"expected a positive integer, got {parallel!r}")
    out = out or data.get("out") or f"runs/compare/{path.stem}"
    if not isinstance(out, str):
        raise _err("out", "expected a folder path")
    spec = Spec(path, arms, seeds, base, Path(out), parallel, metrics, curves)
    if check:
        for arm in arms.values():
            check_arm(arm)
    return spec


# ------------------------------------------------------------------------------------------- runs and plan

def run_dir(spec: Spec, arm: str, seed: int) -> Path:
    return spec.out / arm / f"seed-{seed}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_status(folder: Path) -> str:
    """``finished`` (summary.json, and run_state.json says RL finished), ``partial`` (config.yaml) or ``missing``."""
    state = _read_json(folder / "run_state.json")
    stages = state.get("stages") if isinstance(state, dict) else None
    if (folder / "summary.json").is_file() and isinstance(stages, dict) and "rl" in stages:
        return "finished"
    return "partial" if (folder / "config.yaml").is_file() else "missing"


@dataclass
class PlannedRun:
    arm: str
    seed: int
    dir: Path
    action: str  # skip (finished), resume (interrupted), start (missing)
    command: list[str]
    differences: list[str] = field(default_factory=list)  # saved config.yaml vs the spec (skip / resume)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(arm: Arm, seed: int, folder: Path) -> list[str]:
    """The settings in which the run's saved ``config.yaml`` differs from what the spec asks now, as
    ``key: run's value -> spec's value`` (keys the saved file lacks, added by a newer mmrl, are not compared)."""
    import yaml

    from mmrl.cli.commands import train_config
    from mmrl.config.io import to_dict
    from mmrl.run.inputs import absolute_flat

    try:
        saved = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(saved, dict):
        return []
    cfg = train_config(arm_argv(arm, seed), extra={"out": str(folder)})  # a real model's preset as train has it
    now = absolute_flat(_flat(yaml.safe_load(yaml.safe_dump(to_dict(cfg), sort_keys=False))))
    before = absolute_flat(_flat(saved))  # config.yaml records paths absolute (mmrl.run.inputs)

    def show(v: Any) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()

    return [f"{k}: {show(v)} -> {show(now[k])}" for k, v in before.items() if k in now and now[k] != v]


def arm_argv(arm: Arm, seed: int) -> list[str]:
    """The arguments after ``mmrl train`` that run ``arm`` with ``seed`` (the run folder's ``--out`` aside)."""
    argv = ["--task", arm.task] if arm.task else []
    if arm.config:
        argv += ["--config", arm.config]
    return [*argv, *arm.all_overrides, f"train.seed={seed}"]


def train_command(arm: Arm, seed: int, folder: Path, *, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "mmrl", "train", "--quiet", "--out", str(folder)]
    if resume:  # the run continues with the configuration saved in its config.yaml
        return [*cmd, "--resume"]
    return [*cmd, *arm_argv(arm, seed)]


def plan(spec: Spec) -> list[PlannedRun]:
    """What a run of the spec would do for every (arm, seed), from the run folders on disk."""
    action = {"finished": "skip", "partial": "resume", "missing": "start"}
    runs = []
    for arm in spec.arms.values():
        for seed in spec.seeds:
            folder = run_dir(spec, arm.name, seed)
            act = action[run_status(folder)]
            runs.append(PlannedRun(arm.name, seed, folder, act,
                                   [] if act == "skip" else train_command(arm, seed, folder, resume=act == "resume"),
                                   config_differences(arm, seed, folder) if act != "start" else []))
    return runs


def check_reuse(runs: list[PlannedRun], *, force: bool) -> None:
    """Refuse to skip or resume runs whose saved configuration differs from the spec (their numbers would be
    averaged with runs of other settings), naming each difference; ``force`` reuses them and says so."""
    stale = [r for r in runs if r.differences]
    if not stale:
        return
    lines = [f"  {r.arm} seed {r.seed} ({r.dir}, {'finished' if r.action == 'skip' else 'interrupted'}): "
             + "; ".join(r.differences) for r in stale]
    if force:
        print(f"--force: reusing {len(stale)} runs made with other settings than the spec asks:", *lines, sep="\n")
        return
    raise MmrlError(f"{len(stale)} runs in the output folder were made with other settings than the spec now asks "
                    "(run's value -> spec's value):\n" + "\n".join(lines) + "\nMove or delete those run folders to "
                    "run them again with the spec's settings, give another --out, or pass --force to reuse them "
                    "as they are.")


STOP_GRACE_S = 60.0
"""Seconds a running ``mmrl train`` gets to end after SIGTERM when the compare is stopped, before SIGKILL: in RL
a SIGTERM lets the step in flight finish and writes a checkpoint (``mmrl.run.stop_on_signals``), so a resume
loses nothing; before RL it ends at once (``--stop-grace`` sets it; a second Ctrl-C kills at once)."""


class Interrupted(Exception):
    """The compare got SIGINT or SIGTERM: ``stopped`` the runs it ended, ``not_run`` the queued ones it never
    started (``signum``: the signal)."""

    def __init__(self, signum: int, stopped: list[PlannedRun], not_run: list[PlannedRun]):
        self.signum, self.stopped, self.not_run = signum, stopped, not_run
        name = signal.Signals(signum).name
        def say(runs: list[PlannedRun]) -> str:
            return ", ".join(f"{r.arm} seed {r.seed}" for r in runs) or "none"
        super().__init__(f"mmrl compare: stopped by {name}: runs stopped: {say(stopped)}; runs not started: "
                         f"{say(not_run)}. Run the same command again to resume the stopped runs and start the rest.")


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGKILL when the compare process dies, however it dies
    (``kill -9`` included, where no handler of ours runs): ``prctl(PR_SET_PDEATHSIG)``. SIGKILL, not SIGTERM:
    nobody is left to wait out a grace period, and a killed run resumes from its last checkpoint (each is
    published whole). The signal follows the thread that started the child, so children are started from the
    main thread only. None elsewhere than Linux (there the children's own process group is what a stop ends)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the compare died before the prctl: die now
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _stop(procs: list[subprocess.Popen], grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """End children and everything they started (each its own process group): SIGTERM to every group, then
    SIGKILL to what is left after ``grace`` seconds, or as soon as ``hurry()`` says so."""
    def signal_groups(sig: int) -> None:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline and not hurry():
        time.sleep(0.05)
    signal_groups(signal.SIGKILL)  # the children left, and anything of their groups still there
    for proc in procs:
        proc.wait()


def execute(runs: list[PlannedRun], parallel: int, *, show_progress: bool = True,
            grace: float = STOP_GRACE_S) -> dict[tuple[str, int], int]:
    """Run the planned ``mmrl train`` subprocesses, ``parallel`` at once; returns their exit statuses.

    Each child runs in a process group of its own (a terminal's Ctrl-C reaches the compare, which decides) and
    dies with the compare (:func:`_die_with_parent`). SIGINT or SIGTERM stops the running children (their
    groups get SIGTERM, then SIGKILL after ``grace`` seconds; a second signal kills at once), starts no queued
    run and raises :class:`Interrupted` naming both."""
    from tqdm import tqdm

    env = dict(os.environ)
    if parallel > 1:  # the runs share the cores: torch threads per run = cores / parallel
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // parallel)))
    got: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        got.append(signum)

    queue = list(runs)
    running: list[tuple[PlannedRun, subprocess.Popen, Any]] = []  # (run, its process, its log file)
    codes: dict[tuple[str, int], int] = {}
    preexec = _die_with_parent(os.getpid())
    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        with tqdm(total=len(runs), desc="compare", unit="run", disable=not show_progress) as bar:
            while (queue or running) and not got:
                while queue and len(running) < parallel and not got:
                    run = queue.pop(0)
                    run.dir.mkdir(parents=True, exist_ok=True)
                    log = (run.dir / LOG).open("a")
                    log.write(f"$ {shlex.join(run.command)}\n")
                    log.flush()
                    child = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True,
                                             preexec_fn=preexec)  # noqa: PLW1509 -- only a prctl system call
                    running.append((run, child, log))
                for entry in list(running):
                    run, proc, log = entry
                    rc = proc.poll()
                    if rc is None:
                        continue
                    running.remove(entry)
                    log.write(f"{EXIT_MARK}{rc}\n")
                    log.close()
                    codes[(run.arm, run.seed)] = rc
                    if rc:
                        bar.write(f"failed: {run.arm} seed {run.seed} (exit {rc}); log: {run.dir / LOG}")
                    bar.update(1)
                if running and not got:
                    time.sleep(0.2)
        if got:
            print(f"mmrl compare: {signal.Signals(got[0]).name}: stopping {len(running)} running run(s) (SIGTERM: "
                  f"up to {grace:g} s to checkpoint, then SIGKILL; Ctrl-C again to kill them now), starting none "
                  f"of the {len(queue)} queued", file=sys.stderr, flush=True)
            _stop([proc for _, proc, _ in running], grace, hurry=lambda: len(got) > 1)
            for run, proc, log in running:
                log.write(f"[mmrl compare] stopped by {signal.Signals(got[0]).name}\n{EXIT_MARK}{proc.returncode}\n")
                log.close()
            stopped, running = [r for r, _, _ in running], []
            raise Interrupted(got[0], stopped, queue)
    finally:
        if running:  # an error of our own: no child outlives the compare
            _stop([proc for _, proc, _ in running], 0.0)
            for _, _, log in running:
                log.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return codes


# ------------------------------------------------------------------------------------------------- values

def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _at(d: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


AGGREGATES = {"last": lambda v: v[-1], "mean": lambda v: sum(v) / len(v), "min": min, "max": max}
_REACH_RE = re.compile(r"^([^<>=*]+)(>=|<=)\s*(-?[0-9.]+(?:e-?[0-9]+)?)$")


def _reach_target(name: str, arg: str) -> tuple[str, str, float]:
    """``reach:KEY>=VALUE``'s (key, comparison, value)."""
    m = _REACH_RE.match(arg.strip())
    if m is None:
        raise ValueError(f"'{name}': write reach:KEY>=VALUE or reach:KEY<=VALUE, e.g. reach:eval/accuracy>=0.3 "
                         "(no '*')")
    return m.group(1).strip(), m.group(2), float(m.group(3))


def metric_value(name: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """One run's value of a metric (None when the run does not have it)."""
    kind, arg = parse_metric(name)
    if kind == "summary":
        v = _at(summary, arg)
        return float(v) if _num(v) else None
    if kind == "gain":
        after, before = _at(summary, f"eval_after_rl.{arg}"), _at(summary, f"eval_before_rl.{arg}")
        return float(after - before) if _num(after) and _num(before) else None
    if kind == "reach":
        key, op, target = _reach_target(name, arg)
        for r in rows:
            v = r.get(key)
            if r.get("stage") == "rl" and _num(v) and (v >= target if op == ">=" else v <= target):
                return float(r["step"])
        return None
    values = [float(r[arg]) for r in rows if r.get("stage") == "rl" and _num(r.get(arg))]
    return AGGREGATES[kind](values) if values else None


_COUNTS = ("n", "n_total", "skipped", "seconds", "excluded")


def metric_bounds(name: str) -> tuple[float, float] | None:
    """The range a metric's values cannot leave: [0, 1] for the evaluations' accuracies (any
    ``eval_before_rl`` / ``eval_after_rl`` path but counts and seconds) and for metrics.jsonl keys that are
    accuracies; [-1, 1] for a gain of accuracies; None for anything else."""
    kind, arg = parse_metric(name)
    if kind in ("summary", "gain"):
        parts = (arg if kind == "summary" else f"eval_after_rl.{arg}").split(".")
        if parts[0] in ("eval_before_rl", "eval_after_rl") and parts[-1] not in _COUNTS:
            return (0.0, 1.0) if kind == "summary" else (-1.0, 1.0)
        return None
    if kind in AGGREGATES and "accuracy" in arg.split("/")[-1]:
        return 0.0, 1.0
    return None


@dataclass
class RunData:
    arm: str
    seed: int
    dir: Path
    status: str  # finished, failed, unfinished, not run
    summary: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    exit: int | None = None
    error: str = ""  # the last line of the log of a run that did not finish


_ERROR_LINE = re.compile(r"^(error:|[\w.]*(Error|Exception|Interrupt)\b|Killed\b|interrupted\b|"
                         r"RuntimeError|Segmentation fault|torch.distributed.*(failed|error))", re.IGNORECASE)
_NOISE_LINE = re.compile(r"warn|^\[.*\]\s*\[?(INFO|DEBUG)|\r|\d+%\|", re.IGNORECASE)


def _log_tail(log: Path) -> tuple[int | None, str]:
    """The exit status of the last attempt in a run's log (None while running or killed), and the line that
    says why it stopped: its last error line (``error: ...``, an exception, ``Killed``), else its last line
    that is neither a third-party warning nor a progress bar ("" when there is none)."""
    if not log.is_file():
        return None, ""
    code, last, error = None, "", ""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(EXIT_MARK) and line[len(EXIT_MARK):].strip().lstrip("-").isdigit():
            code = int(line[len(EXIT_MARK):])
        elif line.startswith("$ "):
            code, last, error = None, "", ""
        elif _ERROR_LINE.match(line.strip()):
            error = line.strip()
        elif line.strip() and not _NOISE_LINE.search(line):
            last = line.strip()
    return code, (error or last)[:160]


def collect(spec: Spec) -> list[RunData]:
    from mmrl.engine.run_log import read_metrics

    runs = []
    for arm in spec.arms:
        for seed in spec.seeds:
            folder = run_dir(spec, arm, seed)
            status = run_status(folder)
            code, last = _log_tail(folder / LOG)
            if status == "finished":
                runs.append(RunData(arm, seed, folder, status, _read_json(folder / "summary.json") or {},
                                    read_metrics(folder), code))
            elif status == "missing" and not (folder / LOG).is_file():
                runs.append(RunData(arm, seed, folder, "not run"))
            else:
                runs.append(RunData(arm, seed, folder, "failed" if code else "unfinished", exit=code, error=last))
    return runs


def expand_metrics(metrics: list[str], runs: list[RunData]) -> list[str]:
    """Replace each ``*`` metric with the matching keys found in the finished runs (sorted)."""
    out: list[str] = []
    for name in metrics:
        kind, arg = parse_metric(name)
        if "*" not in arg or kind == "reach":
            names = [name]
        elif kind in ("summary", "gain"):
            parent = arg[:-1].rstrip(".")
            roots = [f"eval_after_rl.{parent}", f"eval_before_rl.{parent}"] if kind == "gain" else [parent]
            found = [_at(r.summary, root.strip(".")) for r in runs for root in roots]
            keys = {k for d in found if isinstance(d, dict) for k, v in d.items() if _num(v)}
            names = [name[:-1] + k for k in sorted(keys)] or [name]
        else:
            keys = {k for r in runs for row in r.rows if row.get("stage") == "rl"
                    for k, v in row.items() if fnmatch.fnmatchcase(k, arg) and _num(v)}
            names = [f"{kind}:{k}" for k in sorted(keys)] or [name]
        out += [n for n in names if n not in out]
    return out


def table(spec: Spec, runs: list[RunData]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{metric: {arm: {n, mean, sd, ci95, values, diff_to_base, intervals_overlap, paired}}}`` over finished
    runs; ``paired``: :func:`paired_differences` against the base arm (None for the base arm itself)."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for metric in expand_metrics(spec.metrics, runs):
        stats, values = {}, {}
        for arm in spec.arms:
            finished = [r for r in runs if r.arm == arm and r.status == "finished"]
            values[arm] = {r.seed: v for r in finished if (v := metric_value(metric, r.summary, r.rows)) is not None}
            stats[arm] = clip_interval(summarize(list(values[arm].values())), metric_bounds(metric))
        base = stats[spec.base]
        result[metric] = {}
        for arm, s in stats.items():
            other = arm != spec.base and s.mean is not None and base.mean is not None
            result[metric][arm] = {
                "n": s.n, "mean": s.mean, "sd": s.sd, "ci95": None if s.lo is None else [s.lo, s.hi],
                "values": values[arm], "diff_to_base": s.mean - base.mean if other else None,
                "intervals_overlap": intervals_overlap(s, base) if arm != spec.base else None,
                "paired": None if arm == spec.base else paired_differences(values[arm], values[spec.base],
                                                                           metric_bounds(metric))}
    return result


# ------------------------------------------------------------------------------------------------- report

def _f(v: float | None, sign: bool = False) -> str:
    if v is not None and abs(v) < 1e-12:
        v = 0.0  # a difference of equal values up to float rounding: not "-0.000"
    return "–" if v is None else (f"{v:+.3f}" if sign else f"{v:.3f}")


def _smooth(values: list[float], k: int) -> list[float]:
    """Moving average over the last ``k`` points."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def mean_curve(series: list[dict[int, float]]) -> list[tuple[int, float, float]]:
    """``(step, mean, sd)`` over the seeds that logged each step (sd 0 where only one did)."""
    out = []
    for step in sorted({s for one in series for s in one}):
        vals = [one[step] for one in series if step in one]
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        out.append((step, mean, sd))
    return out


def curve_points(run: RunData, key: str) -> dict[int, float]:
    """``step -> value`` of a metrics.jsonl key over the RL steps; for an evaluation key (``eval/accuracy``) with
    the evaluation before RL at step 0 and the one after RL at the last step (from summary.json)."""
    points = {r["step"]: float(r[key]) for r in run.rows if r.get("stage") == "rl" and _num(r.get(key))}
    if key.startswith("eval/"):
        path = key[len("eval/"):].replace("/", ".")
        before, after = _at(run.summary, f"eval_before_rl.{path}"), _at(run.summary, f"eval_after_rl.{path}")
        last = _at(run.summary, "stages.rl.steps")
        if not _num(last):
            last = max((r["step"] for r in run.rows if r.get("stage") == "rl" and _num(r.get("step"))), default=None)
        if _num(before):
            points[0] = float(before)
        if _num(after) and last is not None:
            points[int(last)] = float(after)
    return dict(sorted(points.items()))


def plot_curves(spec: Spec, runs: list[RunData]) -> dict[str, str]:
    """One PNG per curve: each arm's mean over seeds (smoothed) with a +-1 sd band; returns key -> file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = {}
    for key in spec.curves:
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        drawn = False
        for arm in spec.arms:
            series = [curve_points(run, key) for run in runs if run.arm == arm and run.status == "finished"]
            points = mean_curve([s for s in series if s])
            if not points:
                continue
            steps, mean, sd = (list(x) for x in zip(*points))
            k = 1 if key.startswith("eval/") else max(1, len(steps) // 20)  # evaluations are few: not smoothed
            mean, sd = _smooth(mean, k), _smooth(sd, k)
            line, = ax.plot(steps, mean, lw=2, label=f"{arm} ({len([s for s in series if s])} seeds)")
            ax.fill_between(steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                            color=line.get_color(), alpha=0.2, lw=0)
            drawn = True
        if drawn:
            from mmrl.run.report import save_figure

            ax.set(xlabel="step")
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize=8)
            made[key] = f"curve-{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}.png"
            save_figure(fig, ax, f"{key}: mean over seeds, band ±1 sd", spec.out / made[key])
        plt.close(fig)
    return made


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


NOTES = ("sd: sample standard deviation over seeds (n − 1). 95% interval: mean ± t(0.975, n − 1)·sd/√n, "
         "clipped to the metric's range (accuracies [0, 1], gains [−1, 1]). "
         "Δ: the arm's mean minus the base arm's mean. \"overlap\": the two 95% intervals overlap, so these seeds "
         "do not separate the arms; \"no overlap\": they do (a conservative test); no test where an arm has fewer "
         "than two seeds or a zero-width interval (every seed gave the same value: with few questions or seeds "
         "that says nothing about the spread). Only finished runs count.")


def _no_test(spec: Spec, arms: dict[str, dict[str, Any]], arm: str) -> str:
    """Why a row has no interval comparison with the base arm."""
    if arm == spec.base:
        return "–"
    if arms[spec.base]["n"] == 0:
        return "no test: the base arm has no value of this metric"
    if arms[arm]["n"] < 2 or arms[spec.base]["n"] < 2:
        return "too few seeds (n < 2)"
    which = "this arm's" if arms[arm].get("sd") == 0 else "the base arm's"
    return f"no test: {which} interval has zero width (every seed the same value)"


def _eval_sizes(runs: list[RunData]) -> list[int]:
    """The numbers of held-out questions behind the finished runs' accuracies."""
    return sorted({int(n) for r in runs if r.status == "finished"
                   for stage in ("eval_before_rl", "eval_after_rl") if _num(n := _at(r.summary, f"{stage}.n"))})


def _table_rows(spec: Spec, runs: list[RunData], numbers: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = [(f"| metric | arm | seeds | mean | sd | 95% interval | min / median / max | Δ mean vs {spec.base} | "
            "intervals |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for metric, arms in numbers.items():
        for arm, s in arms.items():
            ci = "–" if s["ci95"] is None else f"[{_f(s['ci95'][0])}, {_f(s['ci95'][1])}]"
            seeds = str(s["n"]) if s["n"] == len(spec.seeds) else f"{s['n']} of {len(spec.seeds)}"
            note = {True: "overlap", False: "**no overlap**", None: _no_test(spec, arms, arm)}
            values = sorted(s["values"].values())
            spread = " / ".join(map(_f, (values[0], statistics.median(values), values[-1]))) if values else "–"
            rows.append(f"| {_cell(metric)} | {arm}{' (base)' if arm == spec.base else ''} | {seeds} | "
                        f"{_f(s['mean'])} | {_f(s['sd'])} | {ci} | {spread} | {_f(s['diff_to_base'], sign=True)} | "
                        f"{note[s['intervals_overlap']]} |")
    for r in runs:  # runs that did not finish are rows of the table too
        if r.status == "finished":
            continue
        what = f"failed (exit {r.exit})" if r.status == "failed" else r.status
        why = r.error or ("no exit status and no error line: killed, or still running" if r.exit is None else "")
        where = "" if r.status == "not run" else f"log `{r.dir / LOG}`" + (f": {_cell(why)}" if why else "")
        rows.append(f"| **run {what}** | {r.arm} | seed {r.seed} | | | | | | {where} |")
    return rows


PAIRED_NOTES = ("Paired: per seed, the arm's value minus the base arm's on the seeds both finished (the arms "
                "share their seeds, so what a seed does to both cancels): the mean difference, its sd and 95% "
                "interval mean ± t(0.975, n − 1)·sd/√n (clipped to what a difference can be), and on how many "
                "seeds the arm is higher, lower or tied. \"**excludes 0**\": these seeds separate the arms (the "
                "sharper test when the per-arm intervals overlap only because the seeds move both arms alike); "
                "no test with fewer than two pairs or a zero-width interval (every seed the same difference).")


def _paired_rows(spec: Spec, numbers: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = ["| metric | arm − base | paired seeds | mean Δ | sd | 95% interval | per seed | test |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for metric, arms in numbers.items():
        for arm, s in arms.items():
            p = s["paired"]
            if p is None:
                continue
            ci = "–" if p["ci95"] is None else f"[{_f(p['ci95'][0], True)}, {_f(p['ci95'][1], True)}]"
            seeds = str(p["n"]) if p["n"] == len(spec.seeds) else f"{p['n']} of {len(spec.seeds)}"
            if p["excludes_zero"] is not None:
                test = "**excludes 0**" if p["excludes_zero"] else "includes 0"
            elif p["n"] < 2:
                test = "too few paired seeds (n < 2)"
            else:
                test = "no test: every seed the same difference"
            counts = f"{p['higher']} higher, {p['lower']} lower, {p['tied']} tied" if p["n"] else "–"
            rows.append(f"| {_cell(metric)} | {arm} − {spec.base} | {seeds} | {_f(p['mean'], True)} | "
                        f"{_f(p['sd'])} | {ci} | {counts} | {test} |")
    return rows


def write_report(spec: Spec) -> Path:
    """Write ``compare.md`` (table, notes, curves) and ``compare.json`` from the run folders."""
    spec.out.mkdir(parents=True, exist_ok=True)
    runs = collect(spec)
    numbers = table(spec, runs)
    curves = plot_curves(spec, runs)
    header = (f"Spec `{spec.path}`; base arm `{spec.base}`; seeds {', '.join(map(str, spec.seeds))}; each run "
              f"is a folder `{spec.out}/<arm>/seed-<s>/` (report.md, summary.json, {LOG}).")
    lines = [f"# mmrl compare: {spec.path.name}", "", header, ""]
    sizes = _eval_sizes(runs)
    if sizes and sizes[0] < 30:
        lines += [(f"**Few questions**: the held-out accuracies come from {', '.join(map(str, sizes))} questions per "
                  f"run, so each is a multiple of 1/{sizes[0]}; seeds often tie, and intervals over so few questions "
                  "and seeds cannot separate the arms. Use a larger held-out split (data.toy_size, --eval-data) and "
                  "more seeds."), ""]
    lines += [*_table_rows(spec, runs, numbers), "", NOTES, ""]
    if len(spec.arms) > 1:
        lines += [f"## Paired differences to {spec.base}", "", *_paired_rows(spec, numbers), "", PAIRED_NOTES, ""]
    lines += ["## Arms", ""]
    shared = next(iter(spec.arms.values())).shared
    if shared:
        lines.append("- every arm: overrides " + " ".join(f"`{o}`" for o in shared))
    for arm in spec.arms.values():
        overrides = " ".join(f"`{o}`" for o in arm.overrides) or "none"
        lines.append(f"- `{arm.name}`{' (base)' if arm.name == spec.base else ''}: task "
                     f"`{arm.task or 'default'}`, config `{arm.config or '–'}`, overrides {overrides}")
    if curves:
        lines += ["", "## Curves", ""]
        for key, fname in curves.items():
            lines += [f"![{key}]({fname})", ""]
    path = spec.out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    data = {"spec": str(spec.path), "out": str(spec.out), "base": spec.base, "seeds": spec.seeds,
            "arms": {a.name: {"task": a.task, "config": a.config, "overrides": a.all_overrides}
                     for a in spec.arms.values()},
            "metrics": numbers, "curves": curves,
            "runs": [{"arm": r.arm, "seed": r.seed, "dir": str(r.dir), "status": r.status, "exit": r.exit,
                      "log": str(r.dir / LOG) if (r.dir / LOG).is_file() else None} for r in runs]}
    (spec.out / "compare.json").write_text(json.dumps(data, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------- CLI

def cmd_compare(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, check=not args.report_only, out=args.out)
    if args.parallel is not None:
        if args.parallel < 1:
            raise MmrlError("--parallel: expected a positive integer")
        spec.parallel = args.parallel
    if args.report_only:
        if not spec.out.is_dir():
            raise MmrlError(f"--report-only: {spec.out} does not exist (no runs to report)")
        print(f"report: {write_report(spec)}")
        return 0
    runs = plan(spec)
    if args.arms:
        chosen = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in chosen if a not in spec.arms]
        if unknown or not chosen:
            raise MmrlError(f"--arms {args.arms!r}: {', '.join(unknown) or 'no arm named'} not in {spec.path.name} "
                            f"(its arms: {', '.join(spec.arms)})")
        runs = [r for r in runs if r.arm in chosen]
    check_reuse(runs, force=args.force)
    todo = [r for r in runs if r.action != "skip"]
    counts = {a: sum(r.action == a for r in runs) for a in ("skip", "resume", "start")}
    print(f"{len(runs)} runs in {spec.out} (parallel {spec.parallel}): {counts['skip']} finished, "
          f"{counts['resume']} to resume, {counts['start']} to start")
    if args.dry_run:
        for r in runs:
            print(f"{r.action:<7}{r.arm} seed {r.seed}  {r.dir}")
            if r.command:
                print(f"       {shlex.join(r.command)}")
        return 0
    if args.stop_grace < 0:
        raise MmrlError("--stop-grace: expected seconds >= 0")
    try:
        codes = execute(todo, spec.parallel, show_progress=not args.quiet, grace=args.stop_grace)
    except Interrupted as stop:
        print(stop, file=sys.stderr, flush=True)
        return 128 + stop.signum
    report = write_report(spec)
    failed = [k for k, rc in codes.items() if rc]
    print(f"report: {report}" + (f" ({len(failed)} of {len(todo)} runs failed; see the table)" if failed else ""))
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="measure methods against plain GRPO: arms x seeds, one table with 95%% intervals",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run every arm of SPEC with every seed (one ordinary `mmrl train` run folder each,\n"
                    "OUT/<arm>/seed-<s>/, its output in train.log there), then write OUT/compare.md (per metric\n"
                    "and arm: mean, sd and 95% t-interval over seeds, difference to the base arm; the paired\n"
                    "per-seed differences to the base arm with their 95% t-interval; overlaid curves) and\n"
                    "OUT/compare.json. A re-run skips finished runs, resumes interrupted ones and\n"
                    "starts missing ones; a run whose saved config.yaml differs from what the spec now asks is\n"
                    "refused with the differences named (--force reuses it).",
        epilog="spec (YAML):\n"
               "  arms:                      # name -> {task, config, overrides}; the first is the base\n"
               "    grpo: {task: video-qa}\n"
               "    rloo: {config: my.yaml, overrides: [grpo.advantage_estimator=rloo]}\n"
               "  seeds: [0, 1, 2]           # each run gets train.seed=<s>\n"
               "  metrics: [eval_after_rl.accuracy, gain, eval_after_rl.by_task.*, last:reward/accuracy]\n"
               "  curves: [reward, reward/accuracy, eval/accuracy]\n"
               "  overrides: [train.steps=200]   # optional: for every arm, before its own\n"
               "  base: grpo                 # optional (default: the first arm)\n"
               "  out: runs/compare/vas      # optional (default: runs/compare/<spec name>)\n"
               "  parallel: 1                # optional (default: half the cores)\n"
               "metrics: a dotted path into summary.json; gain[.path] = after - before RL; last:/mean:/min:/max:KEY\n"
               "of a metrics.jsonl key over the RL steps; reach:KEY>=VALUE the first step it gets there; '*'\n"
               "expands to every key found. See configs/compare/.")
    p.add_argument("spec", metavar="SPEC.yaml", help="the comparison spec, e.g. configs/compare/seeds.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the runs it would skip, resume or start, and exit")
    p.add_argument("--report-only", action="store_true", help="rewrite compare.md / compare.json from the run folders")
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help=f"runs at once (default: the spec's parallel:, else half the cores = {default_parallel()})")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: the spec's out:)")
    p.add_argument("--arms", default=None, metavar="A,B",
                   help="run only these arms (e.g. one added to a measured spec); the report covers every arm "
                        "that has run folders")
    p.add_argument("--force", action="store_true",
                   help="reuse finished or interrupted runs whose saved config.yaml differs from what the spec now "
                        "asks (by default such runs are refused with the differences named)")
    p.add_argument("--stop-grace", type=float, default=STOP_GRACE_S, metavar="S",
                   help=f"on Ctrl-C or SIGTERM: seconds the running runs get to checkpoint and stop before they are "
                        f"killed (default {STOP_GRACE_S:g}); queued runs never start")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_compare)
