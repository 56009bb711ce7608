"""What `make demo` should gain, as measured, and whether a finished run is in that range.

The range is that of the runs in the README's table (the ``video-qa`` recipe as shipped, from the toy base
model that ships with mmrl); ``mmrl compare configs/compare/demo.yaml`` measures it over five seeds at one and
at two CPU threads (another thread count rounds every matrix product differently, as another CPU's kernels do).
The README prints the same range; a run whose settings differ from the demo's (other than the seed, the thread
count and where it writes) is not what was measured, and gets no verdict.
"""

from __future__ import annotations

from typing import Any

DEMO_TASK = "video-qa"
#: settings the range spans or that do not change what a run computes
FREE = ("out", "train.seed", "train.cpu_threads", "train.save_every", "train.keep_checkpoints", "train.log_every",
        "train.log_rollouts", "train.report_to")
#: held-out accuracy after RL minus before, over the ten runs of configs/compare/demo.yaml (train.seed 0-4 at one and
#: two CPU threads, each run alone, on a 2-core AMD EPYC on 2026-11-28; the README's table)
MEASURED = {"runs": 10, "what": "seeds 0-4 at 1 and 2 CPU threads on one 2-core machine", "min": 0.165,
            "median": 0.273, "max": 0.405}


def range_text() -> str:
    m = MEASURED
    return f"{m['min']:+.3f} to {m['max']:+.3f}, median {m['median']:+.3f}, over {m['runs']} runs: {m['what']}"


def differences(cfg: Any) -> list[str]:
    """The settings of ``cfg`` that are not the demo's (besides :data:`FREE`)."""
    from mmrl.config import load_run_config
    from mmrl.config.io import describe

    demo = {k: v for k, v, _ in describe(load_run_config(DEMO_TASK))}
    mine = {k: v for k, v, _ in describe(cfg)}
    return [k for k in sorted(demo.keys() | mine.keys())
            if k not in FREE and demo.get(k, KeyError) != mine.get(k, KeyError)]


def verdict(cfg: Any, before: float, after: float) -> str | None:
    """One line on the run's gain against the README's range; None for a run that is not the demo."""
    if cfg.task != DEMO_TASK or cfg.model.path or cfg.data.train:
        return None
    gain = after - before
    if diff := differences(cfg):
        shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
        return (f"gain {gain:+.3f}; the README's range for `make demo` ({range_text()}) is for the recipe as "
                f"shipped, and this run changed {shown}")
    if gain < MEASURED["min"]:
        return (f"gain {gain:+.3f}: BELOW the range the README states for `make demo` ({range_text()}). Another "
                "CPU's round-off can take a run elsewhere; please report it with this run's summary.json and the "
                "output of `lscpu`")
    where = "above" if gain > MEASURED["max"] else "within"
    return f"gain {gain:+.3f}: {where} the range the README states for `make demo` ({range_text()})"
