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

__all__ = [
    "RunState", "Stopped", "check_rewards", "configure_policy", "default_run_dir", "gpu_advice", "load_split",
    "resolve_model", "set_cpu_threads", "settings_differences", "split_path", "stop_on_signals", "train",
]


def __getattr__(name: str) -> Any:
    if name in ("load_split", "resolve_model", "set_cpu_threads", "split_path"):
        from mmrl.run import helpers

        return getattr(helpers, name)
    if name in ("RunState", "default_run_dir", "settings_differences"):
        from mmrl.run import folder

        return getattr(folder, name)
    if name in ("Stopped", "check_rewards", "configure_policy", "gpu_advice", "stop_on_signals", "train"):
        from mmrl.run import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'mmrl.run' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
