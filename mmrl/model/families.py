"""The model families mmrl trains and what follows from a family name alone, without torch: which families are
mixtures of experts, whose processor and M-RoPE rule a family takes, which decoders have linear-attention
layers, and the LoRA target modules they need.

Plain data and pure functions of a family name (a Hugging Face config's ``model_type``): the run config's schema
and the command line read them without importing torch; :mod:`mmrl.model.types` and :mod:`mmrl.model.lora`
re-export them.
"""

from __future__ import annotations

from typing import Any

# The model families mmrl trains (a Hugging Face config's ``model_type``): the one list every module reads.
FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
# Mixture-of-experts families, by the dense family whose tokenizer, processor, vision tower and M-RoPE rule
# they share (Qwen3-VL-30B-A3B's and Qwen3.5-35B-A3B's language models route each token to experts; the rest is
# their dense sibling's).
MOE_FAMILIES: dict[str, str] = {"qwen3_vl_moe": "qwen3_vl", "qwen3_5_moe": "qwen3_5"}
# Families whose processor (Qwen3VLProcessor: timestamps between a video's frame groups), vision geometry
# (16-px patches) and M-RoPE rule (one block per frame group, interleaved sections) are another family's:
# Qwen3.5 takes Qwen3-VL's (transformers' processing_auto maps qwen3_5 to Qwen3VLProcessor, and
# Qwen3_5Model.get_rope_index splits a video's grid into frames as Qwen3-VL's does). Its vision tower has no
# deepstack taps, and its decoder differs (below).
MEDIA_FAMILIES: dict[str, str] = {"qwen3_5": "qwen3_vl"}
# Families whose decoder interleaves linear-attention layers (Qwen3.5's Gated DeltaNet: a recurrent state and a
# short causal convolution carried along the sequence) with full-attention layers: packing several samples
# into one row mixes their states (:func:`mmrl.model.packing.attention_impl` refuses it).
LINEAR_ATTENTION_FAMILIES: frozenset[str] = frozenset({"qwen3_5", "qwen3_5_moe"})


def dense_family(family: str) -> str:
    """The family whose decoder ``family``'s is, less its experts (itself for a dense one)."""
    return MOE_FAMILIES.get(family, family)


def media_family(family: str) -> str:
    """The family whose processor, vision patch geometry and M-RoPE rule ``family`` uses."""
    dense = dense_family(family)
    return MEDIA_FAMILIES.get(dense, dense)


def is_moe(family: str) -> bool:
    return family in MOE_FAMILIES


def has_linear_attention(family: str) -> bool:
    """Whether ``family``'s decoder has recurrent linear-attention layers (:data:`LINEAR_ATTENTION_FAMILIES`)."""
    return family in LINEAR_ATTENTION_FAMILIES


# LoRA (mmrl.model.lora). model.lora.target_modules by default: every projection of the attention and the MLP of
# each decoder layer
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The projections of a Gated DeltaNet layer (Qwen3.5; 3 of every 4 decoder layers): the default targets name the
# attention and MLP projections only, which would leave those layers' token mixing frozen
LINEAR_ATTENTION_TARGETS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def default_targets(model: Any, targets: list[str] | str) -> list[str] | str:
    """``targets``, with :data:`LINEAR_ATTENTION_TARGETS` added when they are the default list
    (:data:`DEFAULT_TARGETS`) and the model (a Hugging Face model: its ``config.model_type``) has
    linear-attention layers."""
    family = getattr(getattr(model, "config", None), "model_type", "")
    if isinstance(targets, list) and tuple(targets) == DEFAULT_TARGETS and has_linear_attention(family):
        return [*targets, *LINEAR_ATTENTION_TARGETS]
    return targets


__all__ = [
    "DEFAULT_TARGETS", "FAMILIES", "LINEAR_ATTENTION_FAMILIES", "LINEAR_ATTENTION_TARGETS", "MEDIA_FAMILIES",
    "MOE_FAMILIES", "default_targets", "dense_family", "has_linear_attention", "is_moe", "media_family",
]
