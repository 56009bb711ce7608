"""Temporal shuffling of sampled frames (Video-R1's T-GRPO contrast: the same frames in another order).

Only the frame tensor is permuted, as Video-R1 does (``randperm`` over the time axis): the timestamps, frame
indices and sampling rate stay those of the ordered clip, so the model sees the same moments at the same
positions in time but with their content out of order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from video.sampling import SampledVideo


def shuffle_frames(video: SampledVideo, perm: Sequence[int]) -> SampledVideo:
    """``video`` with frame ``t`` replaced by frame ``perm[t]`` (everything else unchanged)."""
    if sorted(perm) != list(range(video.frames.shape[0])):
        raise ValueError(f"{list(perm)} is not a permutation of the {video.frames.shape[0]} sampled frames")
    return dataclasses.replace(video, frames=video.frames[list(perm)].contiguous())
