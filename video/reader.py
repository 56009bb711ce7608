"""One video-reader interface over decord (preferred) and PyAV (fallback).

Frame ``i`` has timestamp ``i / fps`` (constant frame rate is assumed, as qwen-vl-utils and the HF
processors do); ``duration == num_frames / fps``.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mmrl_common.errors import MediaError, check_media_path

if TYPE_CHECKING:
    from typing_extensions import Self

Backend = Literal["auto", "decord", "pyav"]


class FrameIndexError(MediaError, IndexError):
    """A requested frame index or timestamp lies outside the video."""


def decord_available() -> bool:
    """True when decord can be imported."""
    return importlib.util.find_spec("decord") is not None


def _check_file(path: Path) -> None:
    check_media_path(path, "video")


class VideoReader:
    """Random access to the frames of one video. Use :func:`open_video` to make one.

    Attributes: ``path``, ``backend`` (``"decord"`` or ``"pyav"``), ``num_frames``, ``fps``,
    ``duration`` (seconds), ``width``, ``height``.
    """

    path: Path
    backend: str
    num_frames: int
    fps: float
    width: int
    height: int

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps

    def _check_indices(self, indices: Sequence[int] | np.ndarray) -> list[int]:
        out = [int(i) for i in np.asarray(indices, dtype=np.int64).reshape(-1)]
        for i in out:
            if not 0 <= i < self.num_frames:
                raise FrameIndexError(
                    self.path, f"frame index {i} out of range: the video has {self.num_frames} frames"
                )
        return out

    def index_at(self, timestamp: float) -> int:
        """Nearest frame index to ``timestamp`` seconds (``round(t * fps)``, clamped to the last frame)."""
        t = float(timestamp)
        if not np.isfinite(t) or t < 0 or t > self.duration + 0.5 / self.fps:
            raise FrameIndexError(
                self.path, f"timestamp {timestamp} s out of range: the video lasts {self.duration:.3f} s"
            )
        return min(round(t * self.fps), self.num_frames - 1)

    def get_frames(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Frames at ``indices`` (any order, repeats allowed) as uint8 ``(N, H, W, 3)`` RGB."""
        idx = self._check_indices(indices)
        if not idx:
            return np.zeros((0, self.height, self.width, 3), dtype=np.uint8)
        try:
            return self._read(idx)
        except MediaError:
            raise
        except Exception as exc:  # decoder failures on corrupt data
            raise MediaError(self.path, f"cannot decode frames ({type(exc).__name__}: {exc})") from exc

    def get_frames_at(self, timestamps: Sequence[float]) -> tuple[np.ndarray, list[int]]:
        """Frames nearest to ``timestamps`` (seconds) and the frame indices chosen."""
        idx = [self.index_at(t) for t in timestamps]
        return self.get_frames(idx), idx

    def _read(self, indices: list[int]) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Release the decoder. Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.path)!r}, backend={self.backend!r}, frames={self.num_frames}, "
            f"fps={self.fps:.3f}, size={self.width}x{self.height})"
        )


class DecordReader(VideoReader):
    """decord.VideoReader behind the common interface."""

    backend = "decord"

    def __init__(self, path: str | Path, num_threads: int = 0) -> None:
        import decord

        self.path = Path(path)
        _check_file(self.path)
        try:
            self._vr: Any = decord.VideoReader(str(self.path), ctx=decord.cpu(0), num_threads=num_threads)
        except Exception as exc:
            raise MediaError(
                self.path, f"cannot open the video (truncated or corrupt?): decord: {_first_line(exc)}"
            ) from exc
        self.num_frames = len(self._vr)
        fps = float(self._vr.get_avg_fps())
        if self.num_frames <= 0 or not np.isfinite(fps) or fps <= 0:
            raise MediaError(self.path, f"decord reports {self.num_frames} frames at {fps} fps")
        self.fps = fps
        self.height, self.width = self._vr[0].shape[:2]
        self._vr.seek(0)

    def _read(self, indices: list[int]) -> np.ndarray:
        return np.ascontiguousarray(self._vr.get_batch(indices).asnumpy(), dtype=np.uint8)

    def close(self) -> None:
        self._vr = None


class PyAVReader(VideoReader):
    """PyAV reader with exact frame-index access.

    Opening demuxes every packet once (no decoding) to list presentation timestamps and key frames, so
    the frame count never depends on the container header (which is 0 for MKV/WebM). Frame ``i`` is
    the ``i``-th presentation timestamp; reading seeks to the key frame before it and decodes forward.
    Streams without timestamps (raw ``.h264``) are counted and read by decoding from the start.
    """

    backend = "pyav"

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        import av

        self.path = Path(path)
        _check_file(self.path)
        try:
            self._container: Any = av.open(str(self.path))
        except Exception as exc:
            raise MediaError(self.path, f"cannot open the video (truncated or corrupt?): {_first_line(exc)}") from exc
        try:
            if not self._container.streams.video:
                raise MediaError(self.path, "no video stream in the file")
            self._stream = self._container.streams.video[0]
            self._threads = threads
            self._stream.thread_count = threads
            self._index_packets()
            self.width = int(self._stream.codec_context.width)
            self.height = int(self._stream.codec_context.height)
        except MediaError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise MediaError(self.path, f"cannot read the video (truncated or corrupt?): {_first_line(exc)}") from exc

    def _index_packets(self) -> None:
        pts: list[int] = []
        keys: list[int] = []
        missing = False
        for packet in self._container.demux(self._stream):
            if packet.size == 0:
                continue
            if packet.pts is None:
                missing = True
                continue
            pts.append(int(packet.pts))
            if packet.is_keyframe:
                keys.append(int(packet.pts))
        self._sequential = missing or not pts
        if self._sequential:
            self._rewind()
            n = sum(1 for _ in self._container.decode(self._stream))
            self._pts: list[int] = []
            self._keys: list[int] = []
        else:
            self._pts = sorted(set(pts))
            self._keys = sorted(set(keys)) or [self._pts[0]]
            n = len(self._pts)
        if n == 0:
            raise MediaError(self.path, "the video stream has no decodable frames")
        self.num_frames = n
        self.fps = self._guess_fps()

    def _rewind(self) -> None:
        """Back to the first frame; raw streams cannot seek, so reopen them."""
        import av

        self._container.close()
        self._container = av.open(str(self.path))
        self._stream = self._container.streams.video[0]
        self._stream.thread_count = self._threads

    def _guess_fps(self) -> float:
        s = self._stream
        for rate in (s.average_rate, s.guessed_rate, s.base_rate):
            if rate is not None and float(rate) > 0:
                return float(rate)
        if len(self._pts) > 1 and s.time_base is not None:
            span = (self._pts[-1] - self._pts[0]) * float(s.time_base)
            if span > 0:
                return (len(self._pts) - 1) / span
        raise MediaError(self.path, "cannot determine the frame rate")

    def _read(self, indices: list[int]) -> np.ndarray:
        wanted = sorted(set(indices))
        got = self._decode_sequential(wanted) if self._sequential else self._decode_by_pts(wanted)
        missing = [i for i in wanted if i not in got]
        if missing:
            raise MediaError(self.path, f"frames {missing[:5]} could not be decoded (truncated or corrupt?)")
        return np.stack([got[i] for i in indices])

    def _decode_sequential(self, wanted: list[int]) -> dict[int, np.ndarray]:
        todo = set(wanted)
        got: dict[int, np.ndarray] = {}
        self._rewind()
        for i, frame in enumerate(self._container.decode(self._stream)):
            if i in todo:
                got[i] = frame.to_ndarray(format="rgb24")
                if len(got) == len(todo):
                    break
        return got

    def _key_before(self, pts: int) -> int:
        return self._keys[max(bisect.bisect_right(self._keys, pts) - 1, 0)]

    def _decode_by_pts(self, wanted: list[int]) -> dict[int, np.ndarray]:
        pts_to_index = {p: i for i, p in enumerate(self._pts)}
        got: dict[int, np.ndarray] = {}
        pending = [self._pts[i] for i in wanted]  # ascending
        while pending:
            target = pending[0]
            self._container.seek(self._key_before(target), stream=self._stream, backward=True, any_frame=False)
            progressed = False
            for frame in self._container.decode(self._stream):
                if frame.pts is None:
                    continue
                if frame.pts in pending:
                    got[pts_to_index[frame.pts]] = frame.to_ndarray(format="rgb24")
                    pending.remove(frame.pts)
                    progressed = True
                if not pending or frame.pts > pending[0]:
                    break  # done, or the next target was skipped: seek again
                if self._key_before(pending[0]) > frame.pts:
                    break  # the next target is in a later group of pictures: jump there
            if not progressed:
                return got  # the decoder never produced the target: report it missing
        return got

    def close(self) -> None:
        container = getattr(self, "_container", None)
        if container is not None:
            container.close()
            self._container = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def open_video(path: str | os.PathLike[str], backend: Backend = "auto") -> VideoReader:
    """Open a video. ``"auto"`` tries decord, then PyAV when decord is missing or cannot open the file.

    Raises :class:`mmrl_common.errors.MediaError` naming the file (missing, empty, truncated/corrupt, no video).
    """
    p = Path(path)
    if backend not in ("auto", "decord", "pyav"):
        raise ValueError(f"unknown video backend {backend!r}; use 'auto', 'decord' or 'pyav'")
    _check_file(p)
    if backend == "pyav":
        return PyAVReader(p)
    if backend == "decord":
        if not decord_available():
            raise MediaError(p, "backend 'decord' requested but decord is not installed")
        return DecordReader(p)
    if decord_available():
        try:
            return DecordReader(p)
        except MediaError as decord_error:
            try:
                return PyAVReader(p)
            except MediaError as exc:
                raise MediaError(p, f"{exc.reason}; decord also failed: {decord_error.reason}") from exc
    return PyAVReader(p)
