"""Qwen3-VL MoE's experts in vLLM's CPU build after a weight push: packed again, as vLLM packs them at load.

vLLM 0.32's unquantized MoE method (``vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py``,
``UnquantizedFusedMoEMethod._setup_kernel``) runs the experts kernel's ``process_weights_after_loading`` only the
first time a layer is loaded. On vLLM's CPU build that is the step that packs the expert weights into the layout its
grouped GEMM reads (``fused_moe/experts/cpu_moe.py``, ``CPUUnquantizedExperts.process_weights_after_loading``:
``cpu_prepack_moe_weight``). An in-place ``reload_weights`` (every push mmrl makes) copies the new weights into that
storage unpacked and stops there, and the kernel then reads them as packed: measured on the tiny model, the
answers of the very weights the engine had loaded from the folder moved by up to 0.13 in log-prob (the failure class
of vllm-project/vllm#42821: a kernel-layout transform applied once at load, then new weights written into it).

After a push, :func:`repack_unpacked_experts` runs that skipped step on the engine's side. It first checks that the
step was skipped: the first MoE layer's ``w13_weight`` must equal, bit for bit, the tensor that was pushed into it
(the policy's fused ``gate_up_proj``, whose layout in transformers' memory is vLLM's ``w13``). A vLLM that packs
them itself leaves them unequal and is left alone.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.model.weights import TRANSPOSED_IN_CHECKPOINTS
from mmrl_common.errors import MmrlError

# the policy's fused gate_up_proj, the tensor that becomes vLLM's w13_weight of a MoE layer
PROBE_END = TRANSPOSED_IN_CHECKPOINTS["qwen3_vl_moe"][0]


def _moe_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """(layer, its experts kernel) of each fused-MoE layer of a vLLM model, in the model's order."""
    layers = []
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight"):
            layers.append((module, experts))
    return layers


@torch.no_grad()
def repack_unpacked_experts(worker: Any, probe: torch.Tensor) -> int:
    """Run on a vLLM worker (``LLM.collective_rpc``) after ``reload_weights``: when the first MoE layer holds
    ``probe`` (what was pushed into its ``w13_weight``) unpacked, run each MoE layer's experts kernel's
    ``process_weights_after_loading`` as the first load did. Returns the number of layers packed (0: vLLM had
    done it, or the model has no MoE layer)."""
    layers = _moe_layers(worker.model_runner.get_model())
    if not layers:
        return 0
    held = layers[0][0].w13_weight
    if tuple(held.shape) != tuple(probe.shape):
        raise MmrlError(
            f"rollout.backend=vllm: the engine's first MoE layer holds its experts as {tuple(held.shape)}, the "
            f"policy's are {tuple(probe.shape)} (sharded or padded by vLLM), so mmrl cannot check that vLLM's CPU "
            "build packed the pushed experts; use rollout.backend=hf")
    if not torch.equal(held, probe.to(device=held.device, dtype=held.dtype)):
        return 0
    for layer, experts in layers:
        experts.process_weights_after_loading(layer)
    return len(layers)
