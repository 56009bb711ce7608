"""The shortcuts a decoder with recurrent linear-attention layers rules out (Qwen3.5's Gated DeltaNet).

A Gated DeltaNet layer carries a state along the sequence: a short causal convolution over its last inputs and a
recurrent matrix updated at every token (transformers' ``Qwen3_5GatedDeltaNet``). Two of mmrl's log-prob
shortcuts assume that a token's output depends only on the keys and values it attends to, which is not so here:

* **padding-free packing** (``train.padding_free``, :mod:`mmrl.model.packing`): samples back to back in one row,
  kept apart by a block-diagonal mask (sdpa/eager) or by sequence lengths handed to the kernel (flash,
  ``varlen``). transformers gives the linear-attention layers no 2-D mask for a 4-D one
  (``masking_utils.create_recurrent_attention_mask``), and its torch implementation of the delta rule and the
  convolution take no sequence boundaries (``cu_seq_lens_q`` is dropped by ``torch_chunk_gated_delta_rule``),
  so every sample starts from the state its row's previous sample left;
* **the shared prefix** (``train.shared_prefix``, :mod:`mmrl.model.shared_prefix`): the continuations read the
  prompt's recorded keys and values, but not the recurrent and convolution states the prompt leaves behind
  (forced on, the pass stops: the linear-attention layers ask mmrl's prefix caches for a convolution state they
  do not hold), and a right-padded prompt row would decay that state over its padding.

Both are switched off for such a model (:func:`fit_options`), with the reason printed once: the passes run
padded, which is exact (a padded token is zeroed before the layer, so it adds nothing to the state, and
generation pads on the left). tests/test_qwen3_5.py measures both shortcuts forced on against the plain pass.
Prefill-once generation and the vision-feature cache are kept: the prompt's cache (keys and values and each
linear layer's states) is copied per sample (:func:`mmrl.model.generation.repeat_cache`), and the vision tower is
Qwen3-VL's less the deepstack taps; tests/test_prefill_once.py and tests/test_policy.py run them on every family,
Qwen3.5's included, against the plain calls.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from .families import has_linear_attention
from .options import PolicyOptions

REASONS = {
    "padding_free": "packing several samples into one row lets each start from the recurrent state of the one "
                    "before it (the linear-attention layers see no boundaries)",
    "shared_prefix": "a continuation would miss the recurrent and convolution states its prompt leaves behind "
                     "(only the full-attention layers' keys and values are shared)",
}
_SAID: set[tuple[str, str]] = set()


def fit_options(family: str, options: PolicyOptions) -> PolicyOptions:
    """``options`` with the shortcuts that ``family``'s recurrent layers make wrong switched off (a warning
    names each, once per process); unchanged for a family without linear-attention layers."""
    if not has_linear_attention(family):
        return options
    off = {name: False for name in REASONS if getattr(options, name)}
    for name in off:
        if (family, name) not in _SAID:
            _SAID.add((family, name))
            warnings.warn(f"{family}: train.{name} is switched off for this model: {REASONS[name]}; its log-prob "
                          "passes run padded, which is exact", UserWarning, stacklevel=3)
    return dataclasses.replace(options, **off) if off else options


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Gated DeltaNet (linear-attention) modules of ``model``, in order (transformers'
    ``Qwen3_5GatedDeltaNet`` / ``Qwen3_5MoeGatedDeltaNet``, each a decoder layer's ``linear_attn``)."""
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def direct_reads(model: torch.nn.Module) -> list[tuple[torch.nn.Module, list[torch.nn.Parameter]]]:
    """``(module, parameters)`` for each module of ``model`` whose forward reads a child's parameters without
    calling the child: Qwen3.5's Gated DeltaNet passes ``self.conv1d.weight`` (and bias) to its convolution
    function. A sharding scheme that gathers a module's parameters when that module is called (ZeRO-3) must
    gather these with the reader (:func:`mmrl.optim.gather_direct_reads`)."""
    return [(m, list(m.conv1d.parameters())) for m in linear_layers(model)
            if isinstance(getattr(m, "conv1d", None), torch.nn.Module)]
