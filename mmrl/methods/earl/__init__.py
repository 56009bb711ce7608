"""EARL (select key frames, re-sample around them, reason between selections): ``imports: [mmrl.methods.earl]``.

* :mod:`.environment` -- the ``select_frames`` environment (the policy's action, read after its reasoning, the
  local re-sampling, the observation with the new frames; the report's EARL plots);
* :mod:`.reasoning` -- the templated reasoning of the cold-start demonstrations (``<think>`` before every call
  and before the answer);
* :mod:`.agent` -- the multi-turn cold start (registered with :func:`mmrl.engine.sft.register_sft_episode`), greedy
  evaluation through the environment (the ``agent_eval`` plug-in, ``mmrl eval --agent earl``);
* :mod:`.trajectories` -- ``mmrl data earl-sft``: action-aware SFT trajectories from records with gold
  evidence.

Its rewards are pure formulas over the episode's ``env_info`` and live in :mod:`rewards.evidence` (imported
here, so the recipe's one import registers them too); the frame-cell geometry they share with the environment
is :mod:`video.resample`'s.
"""

from rewards import evidence  # noqa: F401  (registers the evidence rewards)

from . import agent, environment, trajectories  # noqa: F401  (register the environment, plug-in, SFT episodes)
from .agent import AGENTS, cli_eval, evaluate_agent  # noqa: F401
