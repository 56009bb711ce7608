"""The router's auxiliary (load-balancing) loss of a mixture-of-experts policy (Qwen3-VL MoE).

The passes of :mod:`mmrl.model.logprobs` call the base model in several ways (padded, packed, shared prefix in
one or two passes), none through the ``...ForConditionalGeneration`` forward that adds ``router_aux_loss_coef x
aux_loss`` to a language-modelling loss. :class:`RouterLogits` records what every router of the language model
returns while it is open (forward hooks on the module class the model names for its ``router_logits`` output,
``Qwen3VLMoeTextTopKRouter``), and :meth:`RouterLogits.loss` is transformers' own
``load_balancing_loss_func`` (Switch Transformer's loss, the one the model's forward uses) over every token
the passes routed: prompt and completion tokens, each once (a shared prompt is routed once), in every layer.

Hooks are removed on exit, so a recomputation in the backward pass (gradient checkpointing) records nothing.
"""

from __future__ import annotations

from typing import Any, Self

import torch


def router_class(model: torch.nn.Module) -> type[torch.nn.Module] | None:
    """The class of the modules whose output 0 is the router logits (None: not a mixture of experts)."""
    recorder = getattr(model, "_can_record_outputs", None) or {}
    entry = recorder.get("router_logits")
    return getattr(entry, "target_class", None)


def configured_coef(model: torch.nn.Module) -> float:
    """The coefficient the model's own config gives its router's auxiliary loss (0 for a dense model)."""
    if router_class(model) is None:
        return 0.0
    text = getattr(model.config, "text_config", model.config)
    return float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0)


class RouterLogits:
    """``with RouterLogits(model) as rec: <forward passes>``; then ``rec.loss()``. ``model``: the Hugging Face
    model (PEFT-wrapped or not)."""

    def __init__(self, model: torch.nn.Module):
        cls = router_class(model)
        if cls is None:
            raise ValueError(f"{type(model).__name__} has no router (not a mixture-of-experts model)")
        self.routers = [m for m in model.modules() if isinstance(m, cls)]
        text = getattr(model.config, "text_config", model.config)
        self.num_experts = int(text.num_experts)
        self.top_k = int(text.num_experts_per_tok)
        self.logits: list[torch.Tensor] = []
        self._handles: list[Any] = []

    def _record(self, _module: torch.nn.Module, _args: Any, output: Any) -> None:
        self.logits.append(output[0] if isinstance(output, tuple) else output)

    def __enter__(self) -> Self:
        self.logits = []
        self._handles = [m.register_forward_hook(self._record) for m in self.routers]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def loss(self) -> torch.Tensor:
        """The load-balancing loss over every router call recorded (each ``(tokens, experts)``); differentiable
        through the router weights."""
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

        if not self.logits:
            raise RuntimeError("no router ran while recording")
        logits = tuple(t.reshape(-1, self.num_experts) for t in self.logits)
        return load_balancing_loss_func(logits, self.num_experts, self.top_k, None)


def resolve_coef(setting: float | None, model: torch.nn.Module) -> float:
    """``model.router_aux_loss_coef`` for ``model``: None takes the model config's own coefficient; a dense
    model takes None or 0 (a :class:`ConfigError` otherwise)."""
    from mmrl_common.errors import ConfigError

    if router_class(model) is None:
        if setting:
            raise ConfigError(f"model.router_aux_loss_coef={setting}: the model ({model.config.model_type}) has no "
                              "router; the setting applies to mixture-of-experts models (qwen3_vl_moe): leave it "
                              "null or 0")
        return 0.0
    return configured_coef(model) if setting is None else float(setting)
