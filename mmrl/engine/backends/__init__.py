"""The rollout backends beside transformers' ``generate`` (built into :mod:`mmrl.engine.rollout`): vLLM
(:mod:`~mmrl.engine.backends.vllm`) and the repacking of MoE expert weights it loads
(:mod:`~mmrl.engine.backends.vllm_moe_repack`). The names a config may give live in :mod:`mmrl.config.backends`.
"""
