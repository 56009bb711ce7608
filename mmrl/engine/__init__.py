"""The engine: one GRPO step over image and video tokens, and what it needs around it.

The trainer (:mod:`~mmrl.engine.trainer`) and its rollouts (:mod:`~mmrl.engine.rollout`, the sessions of
:mod:`~mmrl.engine.service`, environments), the plug-in points methods use (:mod:`~mmrl.engine.plugins`,
reward columns and checks in :mod:`~mmrl.engine.evaluate`, SFT targets in :mod:`~mmrl.engine.sft`), batches,
the optimizer and DeepSpeed (:mod:`~mmrl.engine.optim`), checkpoints, ranks (:mod:`~mmrl.engine.distributed`),
media and prompts, the metrics log, and the rollout backends (:mod:`mmrl.engine.backends`).

Below the run (:mod:`mmrl.run`) and the toy world; above the settings (:mod:`mmrl.config`), the model
(:mod:`mmrl.model`) and the GRPO maths (:mod:`mmrl.grpo`). It never imports a method: methods register
themselves by name.
"""
