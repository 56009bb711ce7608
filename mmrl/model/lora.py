"""LoRA through PEFT (``model.lora``).

:func:`apply_lora` injects LoRA layers into the policy's Hugging Face model **in place**: ``policy.model``
stays the same object (its ``lm_head``, ``model.model``, ``get_rope_index`` and vision tower are used as
before) and its targeted linear layers become PEFT LoRA layers, so every forward pass and ``generate``
call goes through the adapters. Only the adapter weights train; every base weight is frozen.

* Adapters are saved in PEFT's own format (``adapter_config.json`` + ``adapter_model.safetensors``) that
  ``peft.PeftModel.from_pretrained(base_model, folder)`` loads, and restored exactly on ``--resume``.
* The KL reference needs no copy of the model: it is the policy with its adapters disabled, i.e. the base
  model (:class:`AdapterReference`).
* :func:`merged_export` writes a plain Hugging Face folder with the adapters merged into the weights
  (``AutoModelForImageTextToText.from_pretrained`` loads it, as does any engine that loads HF folders)
  without touching the live model.

Run folders of a LoRA run: ``checkpoint-<step>/`` holds the adapters (PEFT format), the processor, the
trainer state and ``mmrl_eval.json``; ``final/`` (and ``sft-model/``) hold the merged export with the
adapters in ``adapter/`` beside it.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mmrl_common.errors import ConfigError, MmrlError

from . import router_loss
from .families import (  # noqa: F401  (their home is mmrl.model.families, without torch; re-exported here)
    DEFAULT_TARGETS,
    LINEAR_ATTENTION_TARGETS,
    default_targets,
)

ADAPTER_DIR = "adapter"  # the adapters inside a merged export (final/, sft-model/)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"
_PEFT_ATTR = "_mmrl_peft"  # the PeftModel that wraps a model with injected adapters


def _model(policy_or_model: Any) -> torch.nn.Module:
    """The Hugging Face model of a Policy (or the model itself)."""
    return policy_or_model.model if hasattr(policy_or_model, "processor") else policy_or_model


def peft_model(policy_or_model: Any) -> Any:
    """The PEFT wrapper of a model with adapters (None when it has none)."""
    return getattr(_model(policy_or_model), _PEFT_ATTR, None)


def has_lora(policy_or_model: Any) -> bool:
    return peft_model(policy_or_model) is not None


def target_pattern(targets: list[str] | str) -> str:
    """PEFT's ``target_modules`` for ``model.lora.target_modules``: module names under the language model
    only (the vision tower of Qwen2.5-VL has ``gate_proj``/``up_proj``/``down_proj`` too), as a regular
    expression PEFT matches against full module names; a string is such an expression already."""
    if isinstance(targets, str):
        return targets
    names = "|".join(re.escape(t) for t in targets)
    return rf"(.*\.)?language_model\..*\.({names})"


def apply_lora(policy: Any, settings: Any) -> dict[str, Any]:
    """Inject LoRA layers (``settings``: :class:`mmrl.config.LoraSettings`) into ``policy.model`` in place;
    only the adapters are trainable afterwards. Returns counts for the run's console line."""
    from peft import LoraConfig, get_peft_model

    model = _model(policy)
    if has_lora(model):
        raise MmrlError("the model already has LoRA adapters")
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=target_pattern(default_targets(model, settings.target_modules)), bias="none")
    try:
        with warnings.catch_warnings():  # PEFT reads transformers' deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            wrapper = get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    except ValueError as exc:
        if "not found in the base model" in str(exc) or "Target modules" in str(exc):
            raise ConfigError(f"model.lora.target_modules={settings.target_modules!r}: no module of the model "
                              f"matches ({exc})") from exc
        raise
    object.__setattr__(model, _PEFT_ATTR, wrapper)  # a plain attribute, not a registered submodule
    model.train(model.training)  # the new LoRA modules (dropout) start in train mode: follow the model's
    if wrapper.base_model.model is not model:
        raise MmrlError("PEFT did not inject the adapters in place")
    modules = [n for n, m in model.named_modules() if _is_lora_layer(m)]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    # a mixture-of-experts layer holds its experts as fused 3-D parameters and routes through its own module,
    # neither an nn.Linear that a target name could match: only its attention projections get adapters
    return {"modules": len(modules), "trainable": trainable, "total": total,
            "vision_modules": sum(".visual." in f".{n}." for n in modules),
            "frozen_experts": router_loss.router_class(model) is not None}


def describe(info: dict[str, Any], settings: Any) -> str:
    """The console line of :func:`apply_lora`'s counts."""
    where = "the language model" if not info["vision_modules"] else "the language model and the vision tower"
    return (f"LoRA (PEFT): r={settings.r} alpha={settings.alpha:g} dropout={settings.dropout:g} on "
            f"{info['modules']} modules of {where}; trainable {info['trainable'] / 1e6:.3f}M of "
            f"{info['total'] / 1e6:.2f}M parameters ({100 * info['trainable'] / max(1, info['total']):.2f}%)"
            + ("; the mixture-of-experts layers (routers, fused expert weights) stay frozen"
               if info.get("frozen_experts") else ""))


def _is_lora_layer(module: torch.nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def _require(policy_or_model: Any) -> Any:
    wrapper = peft_model(policy_or_model)
    if wrapper is None:
        raise MmrlError("the model has no LoRA adapters (model.lora is off)")
    return wrapper


# ------------------------------------------------------------------------------------------ save / load
def save_adapters(policy: Any, folder: str | Path, *, state: dict[str, torch.Tensor] | None = None) -> Path:
    """The adapters in PEFT format (``adapter_config.json``, ``adapter_model.safetensors``). ``state``: the
    adapter weights by the model's parameter names where the live model does not hold them (ZeRO-3)."""
    wrapper = _require(policy)
    folder = Path(folder)
    readme = folder / "README.md"
    had_readme = readme.exists()
    kwargs: dict[str, Any] = {}
    if state is not None:  # PEFT reads them under its wrapper's names
        kwargs["state_dict"] = {f"base_model.model.{k}": v for k, v in state.items()}
    wrapper.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    if not had_readme and readme.exists():
        readme.unlink()  # PEFT's model-card stub: nothing to say that the config does not
    config_path = folder / ADAPTER_CONFIG
    config = json.loads(config_path.read_text())
    base = config.get("base_model_name_or_path")
    if base and Path(base).is_dir() and not Path(base).is_absolute():  # found from any working directory later
        config["base_model_name_or_path"] = str(Path(base).resolve())
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    return folder


def adapter_folder(folder: str | Path) -> Path | None:
    """Where a run's model folder keeps its adapters: the folder itself (a checkpoint) or ``adapter/`` in
    it (a merged export); None when it has none."""
    folder = Path(folder)
    for cand in (folder, folder / ADAPTER_DIR):
        if (cand / ADAPTER_CONFIG).is_file() and (cand / ADAPTER_WEIGHTS).is_file():
            return cand
    return None


def load_adapters(policy: Any, folder: str | Path) -> None:
    """Restore adapters saved by :func:`save_adapters` exactly (bit for bit) into the live model. The
    folder's LoRA settings must be the model's."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    wrapper = _require(policy)
    where = adapter_folder(folder)
    if where is None:
        raise MmrlError(f"{folder}: no LoRA adapters ({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}) to load")
    saved = json.loads((where / ADAPTER_CONFIG).read_text())
    live = wrapper.peft_config[ADAPTER_NAME]
    live_targets = sorted(live.target_modules) if isinstance(live.target_modules, set) else live.target_modules
    saved_targets = saved.get("target_modules")
    saved_targets = sorted(saved_targets) if isinstance(saved_targets, list) else saved_targets
    for key, mine in (("r", live.r), ("lora_alpha", live.lora_alpha), ("target_modules", live_targets)):
        if saved.get(key) != mine:
            raise MmrlError(f"{where}: adapters saved with {key}={saved.get(key)!r}, but this run has {mine!r} "
                            "(model.lora must be the one the adapters were trained with)")
    weights = load_file(str(where / ADAPTER_WEIGHTS))
    expected = set(get_peft_model_state_dict(wrapper, adapter_name=ADAPTER_NAME))
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise MmrlError(f"{where}: the adapters do not match the model (missing {missing[:3]}, unexpected "
                        f"{extra[:3]})")
    result = set_peft_model_state_dict(wrapper, weights, adapter_name=ADAPTER_NAME)
    if getattr(result, "unexpected_keys", None):
        raise MmrlError(f"{where}: adapter weights not used: {sorted(result.unexpected_keys)[:3]}")


# ------------------------------------------------------------------------------------------ reference
@contextlib.contextmanager
def disabled_adapters(policy: Any) -> Iterator[None]:
    """Inside: the model computes as the base model (every adapter bypassed)."""
    with _require(policy).disable_adapter():
        yield


def adapter_state(policy: Any) -> dict[str, torch.Tensor]:
    """A copy of the adapter weights, by parameter name of the model."""
    return {n: p.detach().clone() for n, p in _model(policy).named_parameters() if ".lora_" in n}


def is_zero_update(state: dict[str, torch.Tensor]) -> bool:
    """True when these adapter weights change nothing (every ``lora_B`` is 0, as PEFT initialises them)."""
    return all(not bool(t.any()) for n, t in state.items() if ".lora_B." in n)


@contextlib.contextmanager
def swapped_adapters(policy: Any, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """Inside: the adapters hold ``state``; the live weights are put back exactly afterwards."""
    params = dict(_model(policy).named_parameters())
    live = {n: params[n].detach().clone() for n in state}
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
    try:
        yield
    finally:
        with torch.no_grad():
            for n, t in live.items():
                params[n].copy_(t)


class AdapterReference:
    """The KL reference of a LoRA run, with no copy of the model.

    Its passes run the policy's own model with the adapters disabled (the base model), or, when the
    reference was reset after the adapters had trained (a curriculum stage), with the adapter weights of
    that moment swapped in. It stands where the trainer uses a reference :class:`~mmrl.model.Policy`:
    ``inference()`` and ``forward_logprobs()``; other attributes are the policy's.
    """

    def __init__(self, policy: Any, state: dict[str, torch.Tensor] | None = None):
        self.policy = policy
        self.state = state if state and not is_zero_update(state) else None  # None: adapters disabled

    @classmethod
    def of_current(cls, policy: Any) -> AdapterReference:
        """The reference equal to the policy as it is now."""
        return cls(policy, adapter_state(policy))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside: the policy's model computes as the reference."""
        if self.state is None:
            with disabled_adapters(self.policy):
                yield
        else:
            with swapped_adapters(self.policy, self.state):
                yield

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        with self.policy.inference():
            yield

    def forward_logprobs(self, *args: Any, **kwargs: Any) -> Any:
        with self.active():
            return self.policy.forward_logprobs(*args, **kwargs)

    def stored(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores of this reference (empty: the base model)."""
        return {} if self.state is None else {n: t.contiguous() for n, t in self.state.items()}

    def restore(self, stored: dict[str, torch.Tensor]) -> None:
        """Back to what :meth:`stored` returned."""
        device = self.policy.device
        self.state = {n: t.to(device) for n, t in stored.items()} or None
        if self.state is not None and is_zero_update(self.state):
            self.state = None

    def __getattr__(self, name: str) -> Any:
        if name == "policy":  # not set yet (unpickling, copying)
            raise AttributeError(name)
        return getattr(self.policy, name)


# ------------------------------------------------------------------------------------------ export
def merged_state_dict(policy: Any) -> dict[str, torch.Tensor]:
    """The model's weights under the base model's parameter names with every adapter merged in (W + BA *
    alpha / r, computed in fp32 on the device and stored in W's dtype; :func:`mmrl.model.weights.stream_weights`),
    copied to the CPU; the live model is left as it is."""
    from mmrl.model.weights import stream_weights

    model = _model(policy)
    _require(model)
    return {name: t.to("cpu", copy=True) for name, t in stream_weights(model, merge_lora=True)}


def merged_export(policy: Any, processor: Any, folder: str | Path, *,
                  state: dict[str, torch.Tensor] | None = None) -> Path:
    """A plain Hugging Face model folder (config, merged safetensors weights, processor) that
    ``AutoModelForImageTextToText.from_pretrained`` loads, written without changing the live model.
    ``state``: the merged weights where the live model does not hold them (ZeRO-3)."""
    from mmrl.model.weights import save_pretrained

    model = _model(policy)
    folder = Path(folder)
    save_pretrained(folder, model, state if state is not None else merged_state_dict(model))
    if processor is not None:
        processor.save_pretrained(folder)
    return folder
