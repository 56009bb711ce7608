"""The kernels a model's linear-attention layers want on a GPU, and a warning when they are missing.

Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``) mixes full-attention layers with Gated DeltaNet (linear-attention)
layers (``layer_types`` of its text config: ``linear_attention`` / ``full_attention``). transformers computes
the latter with flash-linear-attention's Triton kernels (the ``fla`` package, which PyPI's ``fla-core`` provides:
``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``) and their short convolution with the
``causal_conv1d`` package, each where it imports (``use_kernel_func_from_hub_with_fallback`` in
``transformers/integrations/hub_kernels.py``, applied in ``models/qwen3_5/modeling_qwen3_5.py``); where one does
not, it falls back to a PyTorch reference implementation: correct, but a Python loop over chunks that makes a
training step many times slower, and it refuses packed sequences (``cu_seq_lens_q``) outright. On a CPU that
reference is the only path (the kernels need a GPU); on CUDA it is almost always a missing install, which
:func:`linear_attention_kernels` names before the model trains.

``fla-core`` is pure Python (``pip install 'mmrl[gpu]'``); ``causal-conv1d`` is published as source only and
builds with the CUDA toolchain against the installed torch (``pip install --no-build-isolation causal-conv1d``),
so it is not in the ``gpu`` extra, only in the warning. vLLM's own Gated DeltaNet kernels serve rollouts either
way.

The decision reads the configuration, the device's type and what is installed (``importlib.util.find_spec``,
nothing imported): it never touches CUDA.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import torch

LINEAR_ATTENTION = "linear_attention"
# model types whose text model has Gated DeltaNet layers (for a configuration that does not list layer_types)
LINEAR_ATTENTION_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text",
                                          "qwen3_next"})
# module -> (the PyPI package that provides it, what it computes, how to install it)
KERNELS: dict[str, tuple[str, str, str]] = {
    "fla": ("fla-core", "flash-linear-attention's gated delta rule", "pip install 'mmrl[gpu]' (or fla-core)"),
    "causal_conv1d": ("causal-conv1d", "the short causal convolution",
                      ("pip install --no-build-isolation causal-conv1d (a CUDA build against the installed "
                       "torch: needs nvcc)")),
}
WARNED: set[str] = set()  # the messages warn_linear_attention_kernels has shown in this process


def text_config(model_or_config: Any) -> Any:
    """The text model's configuration of a model or a configuration (a multimodal one's ``text_config``)."""
    config = getattr(model_or_config, "config", model_or_config)
    getter = getattr(config, "get_text_config", None)
    text = getter() if callable(getter) else None
    return text if text is not None else getattr(config, "text_config", None) or config


def linear_attention_layers(model_or_config: Any) -> tuple[int, int]:
    """(linear-attention layers, layers) of the text model; (0, layers) for a model without any. A
    configuration that lists no ``layer_types`` counts as all linear when its model type is one of
    :data:`LINEAR_ATTENTION_MODEL_TYPES`."""
    config = getattr(model_or_config, "config", model_or_config)
    text = text_config(model_or_config)
    types = list(getattr(text, "layer_types", None) or [])
    if types:
        return sum(t == LINEAR_ATTENTION for t in types), len(types)
    kinds = {getattr(config, "model_type", None), getattr(text, "model_type", None)}
    if kinds & LINEAR_ATTENTION_MODEL_TYPES:
        layers = int(getattr(text, "num_hidden_layers", 0) or 0) or 1
        return layers, layers
    return 0, int(getattr(text, "num_hidden_layers", 0) or 0)


def importable(module: str) -> bool:
    """Whether top-level ``module`` is installed where this process would import it from (nothing is
    imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules or on the path
        return False


def linear_attention_kernels(model_or_config: Any, device: torch.device | str | None) -> str | None:
    """A warning when a model with linear-attention (Gated DeltaNet) layers is to train on a CUDA device
    without the kernels transformers computes those layers with (:data:`KERNELS`): the layers, the packages
    missing and how to install them. None when the model has no such layers, the device is not CUDA (a CPU
    has only the reference implementation; ``None`` and ``"auto"`` say nothing of a device), or the kernels
    import."""
    if device is None or str(device) == "auto" or torch.device(device).type != "cuda":
        return None
    linear, layers = linear_attention_layers(model_or_config)
    if not linear:
        return None
    missing = [m for m in KERNELS if not importable(m)]
    if not missing:
        return None
    config = getattr(model_or_config, "config", model_or_config)
    kind = getattr(config, "model_type", None) or type(config).__name__
    packages = " and ".join(KERNELS[m][0] for m in missing)
    how = "; ".join(f"{KERNELS[m][0]} (module {m}, {KERNELS[m][1]}): {KERNELS[m][2]}" for m in missing)
    return (f"{kind} has {linear} linear-attention (Gated DeltaNet) layers of {layers} and trains on "
            f"{torch.device(device)}, but {packages} {'is' if len(missing) == 1 else 'are'} not installed here: "
            "transformers computes those layers with its PyTorch reference implementation instead, many times "
            f"slower per step (and it refuses packed sequences without fla). Install {how}")


def warn_linear_attention_kernels(model_or_config: Any, device: torch.device | str | None) -> str | None:
    """:func:`linear_attention_kernels`' warning, shown once per process (a ``UserWarning``); returns it (None:
    nothing to say)."""
    message = linear_attention_kernels(model_or_config, device)
    if message is None:
        return None
    if message not in WARNED:
        WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=2)
    return message
