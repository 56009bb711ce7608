"""A run's life, from settings to report: one package, each module one job.

* :mod:`~mmrl.run.recipe`: the settings of a run (task recipe, published record, real-model preset, the model
  folder's ``mmrl_eval.json``, config files, overrides), and where each value came from;
* :mod:`~mmrl.run.folder`, :mod:`~mmrl.run.lock`, :mod:`~mmrl.run.inputs`: the run folder (what a session may
  write, its lock, the fingerprint of its data and model, the stages finished);
* :mod:`~mmrl.run.helpers`: what the stages and the methods' own commands share (the model folder, a split's
  data, CPU threads);
* :mod:`~mmrl.run.pipeline`: ``mmrl train`` as its named phases;
* :mod:`~mmrl.run.report`: the run's report and the curves methods add to it.

Below the command line (:mod:`mmrl.cli`) and the methods; above the engine. The names that lived in the
one ``mmrl/run.py`` are still read from here (``from mmrl.run import train, load_split``), loaded on first use
so that importing :mod:`mmrl.run.recipe` starts no torch.
"""

from __future__ import annotations

from typing import Any

from mmrl_common.lazy_front import lazy_front

__all__ = [
    "RunState", "Stopped", "check_rewards", "configure_policy", "default_run_dir", "gpu_advice", "load_split",
    "resolve_model", "set_cpu_threads", "settings_differences", "split_path", "stop_on_signals", "train",
]


_HOMES: dict[str, tuple[str, ...]] = {  # the module of the package that gives each name
    "helpers": ("load_split", "resolve_model", "set_cpu_threads", "split_path"),
    "folder": ("RunState", "default_run_dir", "settings_differences"),
    "pipeline": ("Stopped", "check_rewards", "configure_policy", "gpu_advice", "stop_on_signals", "train"),
}


def _load(home: str) -> dict[str, Any]:
    """The names of the package's module ``home`` (import statements: ``tests/test_layers.py`` reads them)."""
    if home == "helpers":
        from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads, split_path  # noqa: F401
    elif home == "folder":
        from mmrl.run.folder import RunState, default_run_dir, settings_differences  # noqa: F401
    elif home == "pipeline":
        from mmrl.run.pipeline import (  # noqa: F401  (the names are returned by locals())
            Stopped,
            check_rewards,
            configure_policy,
            gpu_advice,
            stop_on_signals,
            train,
        )
    return {k: v for k, v in locals().items() if k != "home"}


__getattr__, __dir__ = lazy_front(globals(), _HOMES, _load)
