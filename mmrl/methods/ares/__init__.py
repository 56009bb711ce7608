"""ARES (arXiv 2510.08457, code shawn0728/ARES): ``imports: [mmrl.methods.ares]``.

``configs/ares.yaml`` (``--task ares``) is the released code's method, which produced the published
checkpoints; ``configs/ares-paper.yaml`` (``--task ares-paper``) adds the parts the paper describes and the code
does not run (window counts, a per-batch threshold, branching, the KL relaxed inside high-entropy windows).
What is published, what is our choice and where mmrl differs from the code: :mod:`rewards.ares`.

* :mod:`.plugin` -- the ``ares`` plug-in: window entropy, HWE counts, difficulty buckets, the reward shaping
  and the dynamic KL (formulas in :mod:`rewards.ares` and :mod:`rewards.entropy`), the report's ARES plots;
* :mod:`.branching` -- "when to explore": rollouts that branch at high-window-entropy points (the plug-in's
  ``branching``, ares-paper's; a rollout strategy, :class:`mmrl.engine.rollout.RolloutStrategy`);
* :mod:`.triggers` -- the released code's reasoning-trigger words (``count_mode: triggers``, ares's);
* :mod:`.cold_start` -- the adaptive cold start (AdaCS): ``sft.target: adaptive_reasoning``, reasoning traces
  whose length follows each question's pass rate.
"""

from . import cold_start  # noqa: F401  (registers the adaptive_reasoning cold start)
from .branching import branched_episodes, plan_branches  # noqa: F401
from .plugin import DEFAULTS, AresPlugin  # noqa: F401
