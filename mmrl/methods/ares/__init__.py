"""ARES (arXiv 2510.08457, code shawn0728/ARES): ``imports: [mmrl.methods.ares]``.

* :mod:`.plugin` -- the ``ares`` plug-in: window entropy, HWE counts, difficulty buckets, the reward shaping
  and the dynamic KL (formulas in :mod:`rewards.ares` and :mod:`rewards.entropy`), the report's ARES plots;
* :mod:`.branching` -- "when to explore": rollouts that branch at high-window-entropy points (the plug-in's
  ``branching``; a rollout strategy, :class:`mmrl.rollout.RolloutStrategy`);
* :mod:`.cold_start` -- the adaptive cold start (AdaCS): ``sft.target: adaptive_reasoning``, reasoning traces
  whose length follows each question's pass rate.
"""

from . import cold_start  # noqa: F401  (registers the adaptive_reasoning cold start)
from .branching import branched_episodes, plan_branches  # noqa: F401
from .plugin import DEFAULTS, AresPlugin  # noqa: F401
