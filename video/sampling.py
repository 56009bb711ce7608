"""Frame-sampling policies: which frames of a video the model sees, at what size.

Policies are pure index functions ``fn(num_frames, video_fps, /, *, start, end, **options) -> list[int]`` kept in
a registry (:func:`register_policy`), so :func:`sample_video` never needs editing for a new one. Every
policy's frames are resized with the qwen-vl-utils pixel budget (:func:`video_frame_size`).

Built-in policies:

- ``qwen``: exactly qwen-vl-utils' rules, by calling its ``calculate_video_frame_range``,
  ``smart_nframes`` and ``torch.linspace(start, end, n).round()``. Options: ``fps`` (default 2.0),
  ``min_frames``, ``max_frames`` or ``nframes``.
- ``uniform``: ``nframes`` indices ``round(linspace(first, last, n))`` over the same frame window.
- ``segments``: MVBench's rule, the middle frame of ``nframes`` equal segments:
  ``int(s + seg/2 + round(seg*i))`` with ``seg = (e - s)/n``, ``s = max(0, round(start*fps))``,
  ``e = min(round(end*fps), num_frames - 1)``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from qwen_vl_utils import vision_process as qvu
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from mmrl_common.errors import MediaError
from mmrl_common.registry import Registry

from .decoders import DECODERS
from .reader import VideoReader, open_video

PolicyFn = Callable[..., list[int]]
POLICIES: Registry[PolicyFn] = Registry("sampling policy", "data.media.video_policy", error=ValueError,
                                        duplicates="error")
"""Every frame-sampling policy by name."""


def register_policy(name: str, fn: PolicyFn | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn(num_frames, video_fps, /, *, start, end, **options) -> list[int]`` under ``name``.

    Usable as ``register_policy("mine", fn)`` or as a decorator ``@register_policy("mine")``.
    """

    def add(f: PolicyFn) -> PolicyFn:
        return POLICIES.add(name, f, overwrite=overwrite)

    return add(fn) if fn is not None else add


def unregister_policy(name: str) -> None:
    """Remove the policy registered as ``name`` (ValueError naming the known ones otherwise)."""
    POLICIES.unregister(name)


def available_policies() -> list[str]:
    """Names of the registered sampling policies."""
    return POLICIES.names()


def get_policy(name: str) -> PolicyFn:
    """The policy registered as ``name`` (ValueError naming the nearest and the known ones otherwise)."""
    return POLICIES.get(name)


def frame_window(num_frames: int, fps: float, start: float | None = None, end: float | None = None) -> tuple[int, int]:
    """First and last frame index inside ``[start, end]`` seconds, by qwen-vl-utils' rule
    (``ceil(start*fps)``, ``floor(end*fps)``, clamped to the video)."""
    ele = {k: v for k, v in (("video_start", start), ("video_end", end)) if v is not None}
    first, last, _ = qvu.calculate_video_frame_range(ele, num_frames, fps)
    return first, last


@register_policy("qwen")
def qwen_indices(
    num_frames: int,
    video_fps: float,
    /,
    *,
    start: float | None = None,
    end: float | None = None,
    **options: Any,
) -> list[int]:
    """qwen-vl-utils' frame indices (options: ``fps``, ``min_frames``, ``max_frames`` | ``nframes``)."""
    unknown = set(options) - {"fps", "nframes", "min_frames", "max_frames"}
    if unknown:
        raise ValueError(f"unknown option(s) for the 'qwen' policy: {sorted(unknown)}")
    first, last = frame_window(num_frames, video_fps, start, end)
    n = qvu.smart_nframes(dict(options), total_frames=last - first + 1, video_fps=video_fps)
    return torch.linspace(first, last, n).round().long().tolist()


def sampling_problem(num_frames: int, video_fps: float, sampling: dict[str, Any]) -> str | None:
    """Why a record's ``sampling`` (``start``/``end`` seconds, ``fps``, ``nframes``, ``min_frames``,
    ``max_frames``) takes no frames of a video of ``num_frames`` frames at ``video_fps`` by the ``qwen`` rule
    (the default policy; the frames :func:`sample_video` would fail on), said with what to change; None when it
    takes some. The values must be numbers (the schema checks them first)."""
    start, end = sampling.get("start"), sampling.get("end")
    duration = num_frames / video_fps
    video = f"the video is {duration:.2f} s, {num_frames} frames at {video_fps:g} fps"
    if num_frames < 2:
        return (f"the video has {num_frames} frame; Qwen-VL's frame rule takes at least 2: give it as an image "
                "(type: image, the frame saved as PNG), or re-encode it with more frames")
    if start is not None and start >= duration:
        return f"sampling start={start:g} s is at or after the end of the video: {video}; give a window inside it"
    try:
        first, last = frame_window(num_frames, video_fps, start, end)
    except ValueError:
        shown = f"{start or 0:g}-{min(end, duration) if end is not None else duration:g} s"
        return f"sampling window {shown} holds fewer than 2 frames: {video}; widen the window"
    window = last - first + 1
    options = {k: sampling[k] for k in ("fps", "nframes", "min_frames", "max_frames") if k in sampling}
    if "nframes" in options:
        options.pop("fps", None)
    quiet = qvu.logger.level
    qvu.logger.setLevel(logging.ERROR)  # its "nframes > total_frames" warning: this check says what matters
    try:
        qwen_indices(num_frames, video_fps, start=start, end=end, **options)
    except (ValueError, AssertionError):
        most = window - window % 2
        if "nframes" in options:
            return (f"sampling nframes={options['nframes']} does not fit: the window holds {window} frames ({video}) "
                    f"and Qwen-VL's frame rule takes an even number of them, 2 to {most}; give nframes from 2 to "
                    f"{most}")
        given = " ".join(f"{k}={v:g}" for k, v in options.items())
        return (f"sampling {given} takes no frames from the window of {window} frames ({video}); Qwen-VL's frame "
                "rule needs at least 2: give max_frames 2 or more")
    finally:
        qvu.logger.setLevel(quiet)
    return None


@register_policy("uniform")
def uniform_indices(
    num_frames: int, fps: float, /, *, start: float | None = None, end: float | None = None, nframes: int = 16
) -> list[int]:
    """``nframes`` indices spread evenly from the first to the last frame of the window (may repeat
    when the window is shorter than ``nframes``)."""
    if nframes < 1:
        raise ValueError(f"nframes must be >= 1, got {nframes}")
    first, last = frame_window(num_frames, fps, start, end)
    return [int(i) for i in np.rint(np.linspace(first, last, nframes))]


@register_policy("segments")
def segment_indices(
    num_frames: int, fps: float, /, *, start: float | None = None, end: float | None = None, nframes: int = 16
) -> list[int]:
    """MVBench: the middle frame of each of ``nframes`` equal segments of ``[start, end]``."""
    if nframes < 1:
        raise ValueError(f"nframes must be >= 1, got {nframes}")
    s = max(0, round(start * fps)) if start is not None else 0
    e = min(round(end * fps), num_frames - 1) if end is not None else num_frames - 1
    if e < s:
        raise ValueError(f"empty range: start={start}, end={end} for a {num_frames / fps:.3f} s video")
    seg = (e - s) / nframes
    return [min(int(s + seg / 2 + round(seg * i)), num_frames - 1) for i in range(nframes)]


def video_frame_size(
    height: int,
    width: int,
    nframes: int,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
    image_patch_size: int = 14,
) -> tuple[int, int]:
    """Resized (H, W) for ``nframes`` frames, following qwen-vl-utils ``fetch_video``'s pixel budget
    (:func:`frame_pixel_bounds`), then ``qwen_vl_utils.smart_resize`` with factor ``f = image_patch_size*2``."""
    lo, hi = frame_pixel_bounds(nframes, min_pixels=min_pixels, max_pixels=max_pixels, total_pixels=total_pixels,
                                image_patch_size=image_patch_size)
    factor = image_patch_size * qvu.SPATIAL_MERGE_SIZE
    return qvu.smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)


def frame_pixel_bounds(
    nframes: int,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
    image_patch_size: int = 14,
) -> tuple[int, float]:
    """(min, max) pixels of each of ``nframes`` frames by qwen-vl-utils ``fetch_video``'s budget: the max is
    ``min(VIDEO_MAX_TOKEN_NUM*f², total_pixels/nframes*2)`` (at least 1.05×min) capped by ``max_pixels``."""
    factor = image_patch_size * qvu.SPATIAL_MERGE_SIZE
    lo = min_pixels if min_pixels is not None else qvu.VIDEO_MIN_TOKEN_NUM * factor * factor
    if min_pixels is None and max_pixels is not None:
        lo = min(lo, max_pixels)  # a small max_pixels alone lowers the default floor (qwen would assert)
    elif max_pixels is not None and max_pixels < lo:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({lo})")
    total = total_pixels if total_pixels is not None else qvu.MODEL_SEQ_LEN * factor * factor * 0.9
    hi = max(min(qvu.VIDEO_MAX_TOKEN_NUM * factor * factor, total / nframes * qvu.FRAME_FACTOR), int(lo * 1.05))
    if max_pixels is not None:
        hi = min(max_pixels, hi)
    return lo, hi


def resize_frames(frames: np.ndarray | torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(T,H,W,3) uint8 array or (T,3,H,W) tensor → (T,3,h,w) uint8 tensor, bicubic with antialias as
    qwen-vl-utils does (then rounded back to uint8)."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2) if isinstance(
        frames, np.ndarray
    ) else frames
    if tuple(video.shape[-2:]) == tuple(size):
        return video.to(torch.uint8).contiguous()
    out = TF.resize(video, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    return out.float().round().clamp(0, 255).to(torch.uint8)


@dataclass
class SampledVideo:
    """Frames chosen from one video, ready for a Qwen-VL processor.

    ``frames``: uint8 (T,3,H,W) already fitted to the pixel budget; ``indices``: frame indices in the
    source video; ``timestamps``: ``index / video_fps`` seconds; ``sample_fps``: ``T / window_frames *
    video_fps`` as qwen-vl-utils computes it; ``total_frames``/``duration``: the whole video.
    """

    frames: torch.Tensor
    indices: list[int]
    timestamps: list[float]
    video_fps: float
    sample_fps: float
    total_frames: int
    duration: float
    window_frames: int
    path: str = ""
    backend: str = ""
    policy: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    decode_timeout: float | None = None

    def reopen(self) -> VideoReader:
        """The source video opened again as it was decoded: the same decoder (so the same frames) and timeout.
        A method or environment that reads more of the video (EARL's new frames, a zoom) opens it this way."""
        if not self.path:
            raise MediaError("(frames)", "the video has no source file to open again")
        backend = self.backend if self.backend in DECODERS else "auto"  # e.g. a benchmark's folder of frames
        return open_video(self.path, backend=backend, timeout=self.decode_timeout)  # type: ignore[arg-type]

    def frame(self, i: int) -> SampledVideo:
        """The ``i``-th frame alone, as a one-frame video (same source, fps and window)."""
        return replace(self, frames=self.frames[i:i + 1], indices=[self.indices[i]],
                                   timestamps=[self.timestamps[i]])

    @property
    def metadata(self) -> dict[str, Any]:
        """Kwargs for ``transformers.video_utils.VideoMetadata`` (pass as ``videos_kwargs={"video_metadata":
        ..., "do_sample_frames": False}``).

        ``total_num_frames`` is the number of frames in the sampled window, as qwen-vl-utils reports it, so
        that ``VideoMetadata.sampled_fps`` (used by Qwen2.5-VL for ``second_per_grid_ts``) equals
        ``sample_fps``; ``frames_indices`` are absolute, so Qwen3-VL's timestamps are ``index / fps``.
        """
        return {
            "fps": self.video_fps,
            "frames_indices": list(self.indices),
            "total_num_frames": self.window_frames,
            "duration": self.duration,
            "width": int(self.frames.shape[-1]),
            "height": int(self.frames.shape[-2]),
            "video_backend": self.backend,
        }


def decode_indices(
    reader: VideoReader,
    indices: Sequence[int],
    *,
    window_frames: int | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
    image_patch_size: int = 14,
    resized_height: int | None = None,
    resized_width: int | None = None,
    policy: str = "",
    options: dict[str, Any] | None = None,
) -> SampledVideo:
    """Decode ``indices`` from ``reader``, fit the pixel budget and wrap them as a :class:`SampledVideo`."""
    idx = [int(i) for i in indices]
    if not idx:
        raise ValueError(f"{reader.path}: no frames to decode")
    raw = reader.get_frames(idx)
    if resized_height is not None and resized_width is not None:
        factor = image_patch_size * qvu.SPATIAL_MERGE_SIZE
        size = qvu.smart_resize(resized_height, resized_width, factor=factor)
    else:
        size = video_frame_size(
            reader.height, reader.width, len(idx), min_pixels=min_pixels, max_pixels=max_pixels,
            total_pixels=total_pixels, image_patch_size=image_patch_size,
        )
    window = window_frames if window_frames is not None else reader.num_frames
    return SampledVideo(
        frames=resize_frames(raw, size),
        indices=idx,
        timestamps=[i / reader.fps for i in idx],
        video_fps=reader.fps,
        sample_fps=len(idx) / max(window, 1e-6) * reader.fps,
        total_frames=reader.num_frames,
        duration=reader.duration,
        window_frames=window,
        path=str(reader.path),
        backend=reader.backend,
        policy=policy,
        options=dict(options or {}),
        decode_timeout=getattr(reader, "timeout", None),
    )


_RESIZE_KEYS = ("min_pixels", "max_pixels", "total_pixels", "image_patch_size", "resized_height", "resized_width")


def sample_video(
    video: str | os.PathLike[str] | VideoReader,
    policy: str = "qwen",
    *,
    start: float | None = None,
    end: float | None = None,
    backend: str = "auto",
    decode_timeout: float | None = None,
    **options: Any,
) -> SampledVideo:
    """Sample frames from a path or an open reader with a registered ``policy``.

    A path is opened with decoder ``backend`` (``data.media.decoder``: auto, decord, pyav, torchcodec) and
    ``decode_timeout`` seconds for its opening and its read (``data.media.decode_timeout``; None: no bound; past it
    :class:`video.reader.DecodeTimeoutError`); an open reader keeps its own. ``start``/``end`` bound the window in
    seconds. Resize options (``min_pixels``, ``max_pixels``,
    ``total_pixels``, ``image_patch_size`` — 14 for Qwen2/2.5-VL, 16 for Qwen3-VL — ``resized_height``,
    ``resized_width``) go to the pixel budget; the rest to the policy.
    """
    fn = get_policy(policy)
    resize = {k: options.pop(k) for k in _RESIZE_KEYS if k in options}
    own = not isinstance(video, VideoReader)
    reader = open_video(video, backend=backend, timeout=decode_timeout) if own else video  # type: ignore[arg-type]
    try:
        try:
            first, last = frame_window(reader.num_frames, reader.fps, start, end)
            indices = fn(reader.num_frames, reader.fps, start=start, end=end, **options)
        except (ValueError, AssertionError) as exc:  # qwen-vl-utils asserts and raises in its own words
            said = sampling_problem(reader.num_frames, reader.fps, {**options, "start": start, "end": end}) \
                if policy == "qwen" and _numeric(options, start, end) else None
            raise ValueError(f"{reader.path}: {said or exc}") from exc
        except TypeError as exc:  # an option the policy does not take
            raise ValueError(f"{reader.path}: bad options {sorted(options)} for policy {policy!r}: {exc}") from exc
        opts = {**options, **resize, **({"start": start} if start is not None else {}),
                **({"end": end} if end is not None else {})}
        return decode_indices(reader, indices, window_frames=last - first + 1, policy=policy, options=opts,
                              **resize)
    finally:
        if own:
            reader.close()


def _numeric(options: dict[str, Any], start: float | None, end: float | None) -> bool:
    """Whether the ``qwen`` policy's options are all numbers, as :func:`sampling_problem` takes them."""
    values = [options.get(k) for k in ("fps", "nframes", "min_frames", "max_frames")] + [start, end]
    return all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)


def seconds_per_grid(sample: SampledVideo, temporal_patch_size: int = 2) -> float:
    """Seconds covered by one temporal grid step (Qwen2.5-VL's ``second_per_grid_ts``)."""
    return temporal_patch_size / sample.sample_fps if sample.sample_fps > 0 else math.inf
