"""The methods, one module (or small package) each; a recipe's ``imports:`` names the one it uses.

| module | method | registers |
| --- | --- | --- |
| :mod:`mmrl.methods.acre` | ACRE (answer consistency under shuffled options) | the ``acre`` reward, the ``consistency`` evaluation check, the ``eval_consistency`` plug-in |
| :mod:`mmrl.methods.ares` | ARES (window entropy, difficulty-aware shaping) | the ``ares`` plug-in (with its KL controller) |
| :mod:`mmrl.methods.earl` | EARL (select key frames, re-sample around them) | the ``select_frames`` environment, the ``agent_eval`` plug-in, the multi-turn SFT episodes, ``mmrl eval --agent earl``, ``mmrl data earl-sft`` |
| :mod:`mmrl.methods.medcco` | MedCCO / ARMed (curriculum medical VQA) | the ``curriculum`` plug-in |
| :mod:`mmrl.methods.tgrpo` | Video-R1's T-GRPO | the ``t_grpo`` plug-in, the ``shuffled_frames`` evaluation check and its plug-in |
| :mod:`mmrl.methods.temporal_r1` | Temporal-R1 (data selection by reward variance) | the ``variance_filter`` sampler, ``mmrl data select-variance`` |
| :mod:`mmrl.methods.vas` | MMR1's variance-aware sampling | the ``vas`` sampler |

A method module may import anything of the engine (the policy, the rollout service, the plug-in context) and
the leaf packages; its pure formulas live in the leaves (``rewards.consistency``, ``rewards.ares``,
``rewards.evidence``, ``rewards.temporal``, ``rewards.medical``, ``video.resample``), where they are tested on
their own. The core ``mmrl`` never imports this package (``tests/test_layers.py``): a method plugs in through
the registries and :class:`mmrl.engine.plugins.StepContext`. Adding one needs no engine edit: write a module like these
anywhere and name it under ``imports:``.
"""
