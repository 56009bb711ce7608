"""The model's weights one module at a time: the one place the checkpoint writer, the final export and the
vLLM weight push read them from.

Under DeepSpeed ZeRO-3 every rank holds a shard of each parameter; :func:`stream_weights` gathers one module's
parameters at a time (every rank must iterate alike: the gathers are collectives), so no rank ever holds more
than one module's whole weights beside its shards. A model with LoRA adapters (PEFT, :mod:`mmrl.model.lora`) is
streamed merged: each LoRA layer's base weight plus ``B @ A * alpha / r``, computed on the device from that
layer's gathered weights, under the base model's parameter names.

The tensors an iteration yields are valid until the next one (ZeRO-3 releases the gathered module when the
iteration moves on): a consumer copies what it keeps (:func:`collect_on_main` copies to the CPU on rank 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

Gather = Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager]


def _no_gather(params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    if not any(".lora_" in n for n, _ in model.named_parameters()):
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def stream_weights(model: torch.nn.Module, *, gather: Gather | None = None, merge_lora: bool = True,
                   select: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter and persistent buffer of ``model``, named as its
    ``state_dict()`` names them, one module at a time, each module's parameters gathered by ``gather`` (the
    updater's :meth:`~mmrl.optim.Updater.gather_params`; None: read as they are).

    ``merge_lora`` (a model with LoRA adapters): each LoRA layer yields its base weight with the adapters
    merged in, under the base name (``q_proj.weight``, not ``q_proj.base_layer.weight``), and no adapter
    weights; off: the model's own names and tensors, adapters included. ``select(name)``: only these names
    (a module none of whose names is selected is not gathered at all). A parameter shared by two modules
    (tied input and output embeddings) comes once, under its first name, as ``named_parameters`` has it."""
    gather = gather or _no_gather
    seen: set[int] = set()
    lora = _lora_layers(model) if merge_lora else {}
    skip_under = tuple(f"{name}." for name in lora)
    for prefix, module in model.named_modules():
        if prefix and prefix.startswith(skip_under):
            continue  # inside a LoRA layer already streamed merged
        if prefix in lora:
            yield from _merged_layer(prefix, module, gather, select)
            continue
        dot = f"{prefix}." if prefix else ""
        params = [(f"{dot}{n}", p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in params)
        buffers = [(f"{dot}{n}", b) for n, b in module.named_buffers(recurse=False)
                   if n not in module._non_persistent_buffers_set]
        if select is not None:
            params = [(n, p) for n, p in params if select(n)]
            buffers = [(n, b) for n, b in buffers if select(n)]
        if params:
            with gather([p for _, p in params]):
                for name, p in params:
                    yield name, p.detach()
        for name, b in buffers:
            yield name, b.detach()


def _merged_layer(prefix: str, layer: torch.nn.Module, gather: Gather, select: Callable[[str], bool] | None
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA layer's base parameters, the weight with every active adapter merged in (fp32 sum, stored in
    the weight's dtype), gathered together with the adapters."""
    base = layer.base_layer
    names = [(f"{prefix}.{n}", p) for n, p in base.named_parameters()]
    if select is not None:
        names = [(n, p) for n, p in names if select(n)]
    if not names:
        return
    with gather(list(layer.parameters())):
        for name, p in names:
            if name == f"{prefix}.weight":
                with torch.no_grad():
                    delta = sum(layer.get_delta_weight(a).float() for a in layer.active_adapters)
                    yield name, (p.detach().float() + delta).to(p.dtype)
            else:
                yield name, p.detach()


def collect_on_main(stream: Iterator[tuple[str, torch.Tensor]], *, is_main: bool) -> dict[str, torch.Tensor] | None:
    """Run ``stream`` to its end on every rank; rank 0 keeps a CPU copy of each tensor (the others keep
    nothing and get None). Peak: the whole weights in host memory on rank 0, one module on the devices."""
    if not is_main:
        for _ in stream:
            pass
        return None
    return {name: t.to("cpu", copy=True) for name, t in stream}


def adapter_names(name: str) -> bool:
    """``select`` for the LoRA adapter weights alone."""
    return ".lora_" in name


# Tensors that a family's published checkpoints hold transposed against transformers' module, by the name's end.
# Qwen3-VL MoE's fused experts: Qwen3-VL-30B-A3B's safetensors hold gate_up_proj as (experts, hidden, 2 x expert
# width) and down_proj as (experts, expert width, hidden); vLLM reads that layout (its qwen3_vl_moe.py builds the
# experts with ``is_fused_checkpoint_transposed=True`` and transposes every fused tensor it is given), while
# transformers 5 keeps (experts, out, in) and transposes on load (conversion_mapping.py, "qwen3_vl_moe").
TRANSPOSED_IN_CHECKPOINTS: dict[str, tuple[str, ...]] = {
    "qwen3_vl_moe": (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"),
}


# Tensors that mmrl's folders keep fused, by the name's end, where transformers' rule for the family's original
# format splits them (Qwen3.5 MoE: one tensor per expert, ``mlp.experts.<e>.gate_proj.weight``, the layout of
# conversion_mapping.py's "qwen2_moe" rule that transformers 5.23 applies to qwen3_5_moe_text). The fused
# tensors in transformers' own layout load in transformers (its own names) and in vLLM 0.32 (qwen3_5.py's
# experts take fused (experts, 2 x width, hidden) and (experts, hidden, width) tensors as well as split ones:
# the same greedy tokens from both, measured on a tiny model), so every folder mmrl writes, and the weight push,
# keep one tensor per layer.
FUSED_IN_FOLDERS: dict[str, tuple[str, ...]] = {
    "qwen3_5_moe": (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"),
}


def transposed_in_checkpoints(model: torch.nn.Module) -> tuple[str, ...]:
    """The name ends of ``model``'s tensors that its published checkpoints hold transposed (dims 1 and 2)."""
    return TRANSPOSED_IN_CHECKPOINTS.get(getattr(getattr(model, "config", None), "model_type", ""), ())


def published_layout(model: torch.nn.Module) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """``(name, tensor) -> tensor`` in the layout of the family's published checkpoints (what vLLM loads): the
    identity but for :data:`TRANSPOSED_IN_CHECKPOINTS` (a contiguous transposed copy)."""
    ends = transposed_in_checkpoints(model)

    def layout(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.transpose(1, 2).contiguous() if ends and name.endswith(ends) else tensor
    return layout


def from_published_layout(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the model's own names) with the tensors that a folder holds in the published layout turned
    back to the model's. A tensor already in the model's shape is kept: folders mmrl wrote before it wrote the
    published layout. A square one is ambiguous and read as published, as mmrl writes it now."""
    ends = transposed_in_checkpoints(model)
    if not ends:
        return state
    own = model.state_dict()
    out = dict(state)
    for name, t in state.items():
        if name.endswith(ends) and name in own and t.dim() == 3:
            shape = tuple(own[name].shape)
            if tuple(t.shape) != shape or shape[1] == shape[2]:
                out[name] = t.transpose(1, 2).contiguous()
    return out


def save_pretrained(folder: Path, model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> Path:
    """The model's config and weights as a Hugging Face folder, the tensors under the names and in the layout of
    the model family's published checkpoints (:func:`published_names`, :func:`published_layout`), however the
    model was loaded: every model folder mmrl writes (tiny models, checkpoints, ``final/``, ``sft-model/``, LoRA
    merged exports) is written here, so transformers and vLLM both load it. ``state``: the tensors by the
    model's own parameter names (ZeRO-3 gathered, LoRA merged); None: the model's own."""
    state = model.state_dict() if state is None else state
    names = published_names(model, list(state))
    layout = published_layout(model)
    model.save_pretrained(folder, state_dict={names[k]: layout(k, v) for k, v in state.items()},
                          save_original_format=False, safe_serialization=True)
    return folder


def published_names(model: torch.nn.Module, names: list[str], *, legacy: bool = False) -> dict[str, str]:
    """The model's own parameter name -> the name its family's published checkpoints give the tensor
    (Qwen2-VL, Qwen2.5-VL: ``model.layers.*``, ``visual.*`` for ``model.language_model.layers.*``,
    ``model.visual.*``; Qwen3-VL: its own names): what transformers' ``save_pretrained`` writes for a model
    built from its config.

    Not what ``save_pretrained`` of the live model writes: that reverts the renamings recorded when the model
    was loaded, and a model loaded already partitioned (ZeRO-3 on several ranks, through transformers'
    DeepSpeed loader) records every renaming of its family, used or not, so its folders held
    ``model.model.layers.*`` (Qwen3-VL: ``model.language_model.model.*``), which vLLM refuses. ``legacy``:
    those names (how such folders were written before; :func:`load_weights` reads them)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import revert_weight_conversion

    fused = FUSED_IN_FOLDERS.get(getattr(getattr(model, "config", None), "model_type", ""), ())
    kept = [n for n in names if fused and n.endswith(fused)]
    if kept:  # one name each, as the model has it; the rest renamed as below
        rest = published_names(model, [n for n in names if n not in set(kept)], legacy=legacy)
        return {**rest, **{n: n for n in kept}}
    recorded = model.__dict__.pop("_weight_conversions", None)
    # None: transformers' own rule for a model that from_pretrained did not load
    model.__dict__["_weight_conversions"] = get_model_conversion_mapping(model) if legacy else None
    try:
        # each name carries its index in a one-element tensor, 3-D so that the operations some families revert
        # (Qwen3-VL MoE: a transpose of the fused expert weights) apply to it
        reverted = revert_weight_conversion(model, {k: torch.full((1, 1, 1), i) for i, k in enumerate(names)})
    finally:
        model.__dict__["_weight_conversions"] = recorded
    out = {names[int(t.reshape(-1)[0])]: saved for saved, t in reverted.items() if t.numel() == 1}
    if len(out) != len(names) or len(set(out.values())) != len(names):
        raise RuntimeError(f"{type(model).__name__}: transformers' checkpoint names are not a one-to-one renaming "
                           f"of the model's parameter names ({len(names)} names, {len(out)} renamed); mmrl cannot "
                           "write this model's folders")
    return out


__all__ = ["FUSED_IN_FOLDERS", "Gather", "adapter_names", "collect_on_main", "from_published_layout", "published_layout", "published_names",
           "save_pretrained", "stream_weights", "transposed_in_checkpoints"]
