"""The model package: a Qwen-VL policy behind one front (:class:`Policy`), its plain types, options, loading,
media encoding and vision cache, input building, log-prob passes, generation, LoRA, RoPE and packing.

It imports nothing of the engine (the trainer, rollouts, the run): ``tests/test_layers.py`` checks it.
"""

from .loading import adapter_base, check_model_dir, load_policy, resolve_device, warn_cpu_fallback
from .options import PolicyOptions, RankBinding
from .policy import Policy, checkpointing_switch
from .types import FAMILIES, IMAGE, TEXT, VIDEO, EncodedMedia, Generation, MediaInput, MediaStore, TokenSeq

__all__ = [
    "FAMILIES", "IMAGE", "TEXT", "VIDEO", "EncodedMedia", "Generation", "MediaInput", "MediaStore", "Policy",
    "PolicyOptions", "RankBinding", "TokenSeq", "adapter_base", "check_model_dir", "checkpointing_switch",
    "load_policy", "resolve_device", "warn_cpu_fallback",
]
