"""The plain types of the model package: token sequences, media items and their encodings, generations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from .options import PolicyOptions, RankBinding

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
TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass
class MediaInput:
    """One decoded media item, ready for the processor. ``key`` identifies it for feature sharing."""

    key: str
    kind: str  # "image" | "video"
    data: Any  # PIL image, or a video.sampling.SampledVideo
    timestamps: list[float] | None = None
    layout: str = "video"  # a video's prompt.video_layout: "video" or "frames" (mmrl.prompts.media_parts)


@dataclass
class EncodedMedia:
    key: str
    kind: str
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor  # (3,)
    second_per_grid: float | None = None
    # The item's vision features by the tag of the tower that computed them (:meth:`mmrl.model.vision.VisionEncoder.feature_tag`): they live
    # and go with the item (the trainer clears the media at the end of each step).
    features: dict[Any, tuple[torch.Tensor, list[torch.Tensor]]] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def num_patches(self) -> int:
        return int(self.grid_thw.prod())


class MediaStore(dict):
    """The encoded media by key (:class:`EncodedMedia`), shared by a policy and its reference. Each item keeps
    its cached vision features, so clearing the store (the trainer does at the end of each step) drops both.
    ``vision_calls`` counts the vision-tower runs made for it by every policy that shares it; it is never
    reset (take differences)."""

    vision_calls: int = 0

    def count_vision_calls(self, n: int) -> None:
        self.vision_calls += n


@dataclass
class TokenSeq:
    """A token sequence with its media: a prompt, or a prompt plus completion turns.

    ``loss_mask`` marks tokens the policy produced (trained on); prompt and environment tokens are 0.
    ``media`` lists media keys in the order their placeholders appear.
    """

    ids: list[int]
    mm_types: list[int]
    media: list[str] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.loss_mask:
            self.loss_mask = [0] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Sequence[int], *, trained: bool, mm_types: Sequence[int] | None = None,
               media: Iterable[str] = ()) -> TokenSeq:
        return TokenSeq(
            ids=self.ids + list(ids),
            mm_types=self.mm_types + (list(mm_types) if mm_types is not None else [TEXT] * len(ids)),
            media=self.media + list(media),
            loss_mask=self.loss_mask + [1 if trained else 0] * len(ids),
        )

    def head(self, k: int) -> TokenSeq:
        """The first ``k`` tokens, with the whole media list (the shared-prefix passes cut a row to its prompt,
        which holds every placeholder)."""
        return replace(self, ids=self.ids[:k], mm_types=self.mm_types[:k], loss_mask=self.loss_mask[:k])


@dataclass
class Generation:
    """One sampled continuation: its tokens, text, the log-probabilities under the sampling distribution."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finished: bool  # ended on EOS or a stop string (not cut by max_new_tokens)
    entropies: list[float] = field(default_factory=list)  # per token, when asked for


class PolicyParts(Protocol):
    """What the modules of this package read of a policy (:class:`mmrl.model.Policy` is the one implementation):
    they take the front as an argument and never write to it."""

    model: torch.nn.Module
    base: Any  # the Qwen-VL base model: .visual, .language_model, get_rope_index
    processor: Any
    tokenizer: Any
    media: dict[str, EncodedMedia]
    options: PolicyOptions
    binding: RankBinding
    pad_id: int
    eos_ids: list[int]
    suppress_ids: list[int]
    rope_takes_seconds: bool
    vision: Any  # its mmrl.model.vision.VisionEncoder

    @property
    def device(self) -> torch.device: ...

    @property
    def image_token_id(self) -> int: ...

    @property
    def video_token_id(self) -> int: ...
