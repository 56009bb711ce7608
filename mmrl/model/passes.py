"""What the log-prob passes share: the attention implementation a pass packs for, packing sequences of a padded
batch (:mod:`mmrl.model.packing`), the language model's activation dtype."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from . import packing
from .types import PolicyParts

# packing.row_cost of each language model, computed on first use
_ROW_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packing_impl(policy: PolicyParts) -> str | None:
    """The attention implementation to pack for (:attr:`PolicyOptions.padding_free`), or None: padded (off, or
    an implementation packing is not known to be exact with)."""
    return packing.attention_impl(policy.base.language_model) if policy.options.padding_free else None


def row_cost(policy: PolicyParts) -> Any:
    """:func:`packing.row_cost` of the policy's language model (computed once per model)."""
    lm = policy.base.language_model
    if lm not in _ROW_COSTS:
        _ROW_COSTS[lm] = packing.row_cost(lm)
    return _ROW_COSTS[lm]


def pack(policy: PolicyParts, batch: dict[str, torch.Tensor], position_ids: torch.Tensor, src: Sequence[int],
         lengths: Sequence[int], impl: str, **tree: Any) -> packing.Packed:
    """Sequences ``src[j]`` (their first ``lengths[j]`` tokens) of the padded ``batch``, packed for ``impl``
    (``tree``: :func:`packing.pack`'s ``offsets``, ``parents`` and ``units``)."""
    one_row = impl in packing.FLASH or bool(policy.options.pack_one_row)
    return packing.pack(batch["input_ids"], batch["mm_token_type_ids"], position_ids, src, lengths,
                        one_row=one_row, pad_id=policy.pad_id, cost=None if one_row else row_cost(policy), **tree)


def compute_dtype(policy: PolicyParts) -> torch.dtype:
    """The dtype of the language model's activations (an additive attention mask is built in it)."""
    return policy.base.language_model.embed_tokens.weight.dtype
