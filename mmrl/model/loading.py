"""Loading a model folder as a :class:`~mmrl.model.Policy`: the cheap checks first, the device, LoRA
checkpoints (their base model found and the adapters merged in)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mmrl_common.errors import MmrlError

from . import varlen
from .families import FAMILIES
from .folder import adapter_base, check_model_dir
from .kernels import warn_linear_attention_kernels
from .policy import Policy

_WARNED: set[str] = set()


def warn_cpu_fallback() -> None:
    """A warning when this machine has NVIDIA GPUs that CUDA cannot use (a driver or build mismatch,
    ``CUDA_VISIBLE_DEVICES`` hiding them, a CPU-only torch): ``model.device=auto`` then runs on the CPU,
    hundreds of times slower, which nobody wants silently."""
    if "cpu" in _WARNED or torch.cuda.is_available():
        return
    gpus = sorted(Path("/dev").glob("nvidia[0-9]*")) if Path("/dev").is_dir() else []
    if not gpus and not Path("/proc/driver/nvidia").exists():
        return
    _WARNED.add("cpu")
    why = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None
           else f"torch built for CUDA {torch.version.cuda} cannot use them (driver too old? "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r})")
    warnings.warn(f"this machine has NVIDIA GPUs ({len(gpus)} device files) but {why}: model.device=auto runs on "
                  "the CPU; fix the install, or set model.device=cpu to mean it", RuntimeWarning, stacklevel=2)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU (with a warning when the machine has
    GPUs that CUDA cannot use: :func:`warn_cpu_fallback`)."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        warn_cpu_fallback()
        return torch.device("cpu")
    return torch.device(device)


def load_policy(path: str | Path, *, dtype: str = "fp32", attn_implementation: str = "sdpa",
                device: str = "auto") -> Policy:
    """Load any Qwen-VL folder in Hugging Face format onto ``device``; errors name the folder and what is
    missing."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    path = check_model_dir(path)
    if not (path / "config.json").is_file():  # a LoRA checkpoint: its base with the adapters merged in
        return load_adapter_checkpoint(path, dtype=dtype, attn_implementation=attn_implementation, device=device)
    config = AutoConfig.from_pretrained(path)
    if config.model_type not in FAMILIES:
        raise MmrlError(f"{path}: model type '{config.model_type}' is not supported; "
                        f"mmrl trains {', '.join(FAMILIES)}")
    target = resolve_device(device)
    warn_linear_attention_kernels(config, target)  # Qwen3.5 on a GPU without fla / causal_conv1d: slow
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    processor = AutoProcessor.from_pretrained(path)
    with _partitioned_shapes_in_conversions():
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch_dtype, attn_implementation="sdpa" if attn_implementation == varlen.CONFIG_VALUE
            else attn_implementation)
    if attn_implementation == varlen.CONFIG_VALUE:
        varlen.apply(model)
    if not hasattr(next(model.parameters()), "ds_id"):  # ZeRO-3 partitions already sit on their device
        model = model.to(target)
    return Policy(model, processor, load_args={"path": str(path), "dtype": dtype,
                                               "attn_implementation": attn_implementation, "device": device})


@contextlib.contextmanager
def _partitioned_shapes_in_conversions() -> Iterator[None]:
    """While a model loads: the weight conversion that transposes Qwen3-VL MoE's fused expert weights (the
    published checkpoints hold them transposed) compares the file's tensor with the parameter's full shape.

    transformers 5.23's ``Transpose(check_dims=True)`` transposes unless the tensor already has the shape of
    ``model.get_parameter(name)``; under ZeRO-3 that is the empty partition, shape ``(0,)``, so it transposed
    tensors that were in the model's layout already (every folder mmrl or ``save_pretrained`` writes): a size
    mismatch that stopped ZeRO-3 runs of a MoE model on several ranks, or, for square expert weights, weights
    loaded transposed without a word. A partitioned parameter keeps its full shape in ``ds_shape``."""
    from transformers.core_model_loading import Transpose

    original = Transpose.convert

    def convert(self: Any, input_dict: dict[str, Any], source_patterns: list[str], target_patterns: list[str],
                **kwargs: Any) -> dict[str, torch.Tensor]:
        model, name = kwargs.get("model"), kwargs.get("full_layer_name")
        full = getattr(model.get_parameter(name), "ds_shape", None) if self.check_dims and model and name else None
        if full is None:
            return original(self, input_dict, source_patterns, target_patterns, **kwargs)
        tensors = next(iter(input_dict.values()))
        tensor = tensors[0] if isinstance(tensors, list) else tensors
        target = self.get_target_pattern(input_dict, source_patterns, target_patterns)
        if tuple(tensor.shape) == tuple(full):
            return {target: tensor}
        return {target: torch.transpose(tensor, dim0=self.dim0, dim1=self.dim1).contiguous()}

    Transpose.convert = convert
    try:
        yield
    finally:
        Transpose.convert = original


def load_adapter_checkpoint(folder: Path, **kwargs: Any) -> Policy:
    """A LoRA checkpoint (adapters and processor) as a model: the base loaded, the adapters merged in."""
    from peft import PeftModel

    policy = load_policy(adapter_base(folder), **kwargs)
    merged = PeftModel.from_pretrained(policy.model, str(folder)).merge_and_unload()
    from transformers import AutoProcessor

    return Policy(merged, AutoProcessor.from_pretrained(folder), load_args={**policy.load_args, "path": str(folder)})
