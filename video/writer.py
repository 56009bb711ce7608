"""Write real H.264 MP4 files with PyAV (used by the toy world and the tests)."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def _check_frame(frame: np.ndarray, shape: tuple[int, int] | None) -> tuple[int, int]:
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError("each frame must be a uint8 numpy array of shape (H, W, 3)")
    h, w = frame.shape[:2]
    if h % 2 or w % 2 or h == 0 or w == 0:
        raise ValueError(f"frame size {w}x{h} must be non-zero and even (yuv420p)")
    if shape is not None and (h, w) != shape:
        raise ValueError(f"frame size {w}x{h} differs from the first frame {shape[1]}x{shape[0]}")
    return h, w


def write_mp4(
    path: str | Path,
    frames: np.ndarray | Iterable[np.ndarray],
    fps: float,
    *,
    crf: int | None = None,
) -> Path:
    """Encode RGB uint8 frames ``(N,H,W,3)`` (or an iterable of ``(H,W,3)``) as H.264/yuv420p MP4.

    Deterministic: single-threaded libx264 and no encoder/muxer metadata, so the same frames give the
    same bytes. ``crf`` sets quality (libx264 default 23 when ``None``; 0 is lossless-luma). Height and
    width must be even. Returns the path written.
    """
    path = Path(path)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if isinstance(frames, np.ndarray):
        if frames.ndim != 4:
            raise ValueError(f"frames array must be (N,H,W,3), got shape {frames.shape}")
        frames = list(frames)
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = Fraction(fps).limit_denominator(1001)
    shape: tuple[int, int] | None = None
    count = 0
    container = av.open(str(path), mode="w", format="mp4", options={"fflags": "+bitexact"})
    try:
        stream: av.VideoStream | None = None
        for frame in frames:
            shape = _check_frame(frame, shape)
            if stream is None:
                opts = {"preset": "medium", "threads": "1"}
                if crf is not None:
                    opts["crf"] = str(int(crf))
                stream = container.add_stream("libx264", rate=rate, options=opts)
                stream.width, stream.height = shape[1], shape[0]
                stream.pix_fmt = "yuv420p"
                stream.thread_count = 1
            # convert here: PyAV's implicit conversion inside encode() made the output vary run to run
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(format="yuv420p")
            vf.pts = count
            vf.time_base = 1 / rate
            for packet in stream.encode(vf):
                container.mux(packet)
            count += 1
        if stream is not None:
            for packet in stream.encode(None):
                container.mux(packet)
    finally:
        container.close()
    if count == 0:
        path.unlink(missing_ok=True)
        raise ValueError("no frames to write")
    return path
