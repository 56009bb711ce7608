"""The toy world: real Qwen-VL architectures at tiny size built offline (:mod:`~mmrl.toy.tiny_models`), the
toy base model pre-trained on the toy videos (:mod:`~mmrl.toy.base`; its recipe and cache key are settings,
in :mod:`mmrl.config.toy`) and the demo's range (:mod:`~mmrl.toy.demo_range`). Above the engine, which
pre-trains the base; below the run, which builds what a config names.
"""
