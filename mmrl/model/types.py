"""The plain types of the model package: token sequences, media items and their encodings, generations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from .families import (  # noqa: F401  (their home is mmrl.model.families, without torch; re-exported here)
    FAMILIES,
    LINEAR_ATTENTION_FAMILIES,
    MEDIA_FAMILIES,
    MOE_FAMILIES,
    dense_family,
    has_linear_attention,
    is_moe,
    media_family,
)
from .options import PolicyOptions, RankBinding

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
