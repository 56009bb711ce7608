"""Videos: readers (decord, PyAV, torchcodec: ``video.decoders``), sampling policies, EARL re-sampling, MP4 writing.

Names are imported lazily so that ``from video.writer import write_mp4`` does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "write_mp4": "writer",
    "open_video": "reader",
    "VideoReader": "reader",
    "DecordReader": "reader",
    "PyAVReader": "reader",
    "TorchCodecReader": "reader",
    "DecodeTimeoutError": "reader",
    "FrameIndexError": "reader",
    "decord_available": "reader",
    "SampledVideo": "sampling",
    "sample_video": "sampling",
    "register_policy": "sampling",
    "unregister_policy": "sampling",
    "available_policies": "sampling",
    "get_policy": "sampling",
    "frame_window": "sampling",
    "decode_indices": "sampling",
    "video_frame_size": "sampling",
    "resize_frames": "sampling",
    "Resampled": "resample",
    "resample_around": "resample",
    "resample_video": "resample",
    "neighbour_intervals": "resample",
}

__all__ = [
    "DecodeTimeoutError",
    "DecordReader",
    "FrameIndexError",
    "PyAVReader",
    "Resampled",
    "SampledVideo",
    "TorchCodecReader",
    "VideoReader",
    "available_policies",
    "decode_indices",
    "decord_available",
    "frame_window",
    "get_policy",
    "neighbour_intervals",
    "open_video",
    "register_policy",
    "resample_around",
    "resample_video",
    "resize_frames",
    "sample_video",
    "unregister_policy",
    "video_frame_size",
    "write_mp4",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'video' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
