"""One video-reader interface over decord, PyAV and torchcodec (``data.media.decoder``, :mod:`video.decoders`).

Frame ``i`` has timestamp ``i / fps`` (constant frame rate is assumed, as qwen-vl-utils and the HF
processors do); ``duration == num_frames / fps``.

**Timeouts.** A reader opened with ``timeout=T`` (``data.media.decode_timeout`` in a run) bounds each call
into its decoder, the opening (the file check included) and each batch of frames, to ``T`` seconds: past it,
:class:`DecodeTimeoutError`, a :class:`~mmrl_common.errors.MediaError` naming the file, which
``data.on_bad_sample: skip`` skips like any bad file. A decoder stuck in its C code cannot be interrupted from
Python, so the call runs on a daemon thread of its own and the caller stops waiting for it: the thread is
given up on, not stopped (it ends when the decoder returns, or with the process), the reader is never used
again (closing it drops it without touching the decoder that thread may still be inside), and fd 2, held
while decoders run (:func:`native_output_held`), is given back at once. This works because the decoders run
their C code without Python's GIL, so the waiting thread wakes on time: decord's calls go through ctypes,
which releases the GIL; PyAV decodes in ``nogil`` blocks; torchcodec's decoding is a torch operator, called with
the GIL released. (Measured: a Python loop beside a 1.3 s decord or PyAV decode of 120 frames at 640x480 was
never held up for more than 16 ms.) A decoder process, killed on a timeout, would also bound a decoder that
held the GIL, but costs a process start and a copy of every frame per video; a thread costs about 0.1 ms per
call.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import errno
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from mmrl_common.errors import ConfigError, MediaError, check_media_path

from .decoders import decoder_problem, installed

if TYPE_CHECKING:
    from typing_extensions import Self

Backend = Literal["auto", "decord", "pyav", "torchcodec"]
T = TypeVar("T")


class FrameIndexError(MediaError, IndexError):
    """A requested frame index or timestamp lies outside the video."""


class DecodeTimeoutError(MediaError):
    """A call into a decoder ran past the reader's timeout (``data.media.decode_timeout``)."""


def decord_available() -> bool:
    """True when decord can be imported."""
    return installed("decord")


EXIT_GRACE_S = 10.0
"""At exit, how long the process waits for the decodes it gave up on to end: a decoder still inside its C code
while the interpreter and the libraries it calls (torch's operator registry for torchcodec) are torn down can
abort the process."""
_given_up: list[threading.Thread] = []
_given_up_lock = threading.Lock()


def _remember_given_up(worker: threading.Thread) -> None:
    with _given_up_lock:
        if not _given_up:
            atexit.register(_wait_for_given_up)
        _given_up[:] = [t for t in _given_up if t.is_alive()] + [worker]


def _wait_for_given_up() -> None:
    """Give the decodes given up on up to :data:`EXIT_GRACE_S` seconds, together, to end; name those that do not."""
    deadline = time.monotonic() + EXIT_GRACE_S
    for t in _given_up:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name.removeprefix("mmrl-decode ") for t in _given_up if t.is_alive()]
    if stuck:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"mmrl: {len(stuck)} video decode(s) given up on after data.media.decode_timeout are "
                             f"still running at exit ({', '.join(stuck[:5])}); the decoder may abort the exit\n")


def within(timeout: float | None, path: Path, backend: str, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, given up on after ``timeout`` seconds (None or 0: waited for however long it takes) with a
    :class:`DecodeTimeoutError` naming ``path``; ``backend`` (may be empty) and ``what`` (``"opening"``,
    ``"reading frames of"``) go into its message. ``fn`` runs on a daemon thread of its own, which is left to
    finish or hang."""
    if not timeout:
        return fn()
    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed to the waiting thread as it is
            out["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=run, name=f"mmrl-decode {path.name}", daemon=True)
    worker.start()
    if not done.wait(timeout):
        let_go(worker.ident)
        _remember_given_up(worker)
        how = f" with {backend}" if backend else ""
        raise DecodeTimeoutError(path, f"decoding took longer than {timeout:g} s (data.media.decode_timeout) while "
                                       f"{what} the video{how}: the file may be damaged or still being written; "
                                       "replace it, raise data.media.decode_timeout, or choose another "
                                       "data.media.decoder")
    if "error" in out:
        raise out["error"]
    return out["value"]


# The first bytes of the image formats FFmpeg would open as a one-frame "video" (its png_pipe, jpeg_pipe, ...
# demuxers): such a file is refused as what it is, not trained on as a still.
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
                (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"qoif", "QOI"))


def image_format_of(head: bytes) -> str | None:
    """The image format whose signature ``head`` (a file's first bytes) starts with, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return next((name for magic, name in _IMAGE_MAGIC if head.startswith(magic)), None)


def _check_file(path: Path) -> None:
    """Missing, empty, unreadable (a symlink loop, no permission: said so) or an image file: MediaError."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        head = b""  # check_media_path says "file not found"
    except IsADirectoryError:
        head = b""
    except OSError as exc:
        cause = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or type(exc).__name__)
        raise MediaError(path, f"cannot open the video file: {cause}") from exc
    check_media_path(path, "video")
    kind = image_format_of(head)
    if kind is not None:
        raise MediaError(path, f"is a {kind} image, not a video (its first bytes are a {kind} signature); give "
                               "it as an image item, or replace it with the video")


# ------------------------------------------------------------------------------ the decoders' own output
# decord logs through its bundled FFmpeg (``[mov,mp4,m4a,3gp,3g2,mj2 @ 0x...] moov atom not found``), which
# decord.logging.set_level turns off, and through dmlc's C++ logger (``[04:49:43] .../video_reader.cc:83: ERROR
# opening: ...``), which nothing turns off: it writes to file descriptor 2 directly. PyAV keeps FFmpeg's log
# off unless the user turns it on (av.logging.set_level), which is left as the user set it.
_NATIVE_NOISE = re.compile(r"^\s*(\[\d\d:\d\d:\d\d\] \S+:\d+: |\[[\w,.-]+ @ (0x)?[0-9a-fA-F]+\] |Stack trace|\[bt\] )")
_held_lock = threading.Lock()
_held: dict[str, Any] = {"depth": 0, "saved": None, "file": None}
_held_by: dict[int, int] = {}  # thread id -> how many native_output_held blocks it is inside
_decord_quiet = False


@contextlib.contextmanager
def native_output_held() -> Iterator[None]:
    """Hold back what the decoders' C code writes to file descriptor 2 while any thread is inside.

    The first thread in sends fd 2 to a temporary file; the last one out restores it and writes back every
    line that is not a decoder's own message (decord's and FFmpeg's log lines, C++ stack traces), so a
    warning printed meanwhile by anything else still appears. Nothing is held back when fd 2 cannot be
    redirected (no real stderr). A thread given up on (a decode past its timeout, :func:`let_go`) counts no
    more: fd 2 comes back without waiting for it."""
    me = threading.get_ident()
    with _held_lock:
        if _held["depth"] == 0:
            try:
                sys.stderr.flush()
                saved = os.dup(2)
            except (OSError, ValueError, AttributeError):
                saved = None
            if saved is not None:
                tmp = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by the last thread out
                os.dup2(tmp.fileno(), 2)
                _held["saved"], _held["file"] = saved, tmp
        _held["depth"] += 1
        _held_by[me] = _held_by.get(me, 0) + 1
    try:
        yield
    finally:
        with _held_lock:
            if _held_by.get(me, 0) > 0:  # not let go of meanwhile
                _held_by[me] -= 1
                if not _held_by[me]:
                    del _held_by[me]
                _release_held(1)


def let_go(thread_id: int | None) -> None:
    """Stop counting thread ``thread_id`` (one that still runs a decode nobody waits for) as inside
    :func:`native_output_held`: fd 2 is restored once the other threads are out."""
    with _held_lock:
        _release_held(_held_by.pop(thread_id, 0) if thread_id is not None else 0)


def _release_held(n: int) -> None:
    """``n`` threads' blocks out of :func:`native_output_held` (``_held_lock`` held): the last one out restores
    fd 2 and writes back what others printed meanwhile."""
    if n <= 0:
        return
    _held["depth"] -= n
    if _held["depth"] == 0 and _held["saved"] is not None:
        saved, tmp = _held["saved"], _held["file"]
        _held["saved"] = _held["file"] = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        kept = [line for line in tmp.read().splitlines(keepends=True)
                if not _NATIVE_NOISE.match(line.decode("utf-8", "replace"))]
        tmp.close()
        if kept:
            with contextlib.suppress(OSError):
                os.write(2, b"".join(kept))


def _quiet_decord() -> None:
    """Turn off the log of decord's bundled FFmpeg (once; mmrl reports a bad file itself)."""
    global _decord_quiet
    if not _decord_quiet:
        import decord

        decord.logging.set_level(decord.logging.QUIET)
        _decord_quiet = True


def _decoder_reason(exc: BaseException) -> str:
    """A decoder's error in one short line: without decord's ``[time] file.cc:line:`` prefixes, its
    ``Check failed: ... (a vs. b)`` expression and C++ stack trace, without PyAV's ``[Errno N]`` and
    the quoted path or function name it appends, and without torchcodec's ``Class, file.cpp:N,`` prefix."""
    text = str(exc)
    text = re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", text)
    text = re.split(r"\n|Stack trace", text.strip())[0]
    text = re.sub(r"Check failed: .*?\(-?\d+ vs\. -?\d+\)\s*", "", text)
    text = re.sub(r"^\[Errno -?\d+\] ", "", text)
    text = re.sub(r"^(\w+, )?\S+\.(cc|cpp|h):\d+, ", "", text)
    text = re.sub(r": '[^']*'$", "", text).strip(" :")
    return text or type(exc).__name__


class VideoReader:
    """Random access to the frames of one video. Use :func:`open_video` to make one.

    Attributes: ``path``, ``backend`` (``"decord"``, ``"pyav"`` or ``"torchcodec"``), ``num_frames``, ``fps``,
    ``duration`` (seconds), ``width``, ``height``, ``timeout`` (seconds each read of frames may take; None: no
    bound).
    """

    path: Path
    backend: str
    num_frames: int
    fps: float
    width: int
    height: int
    timeout: float | None = None
    given_up: str | None = None
    """Why a read of this reader was given up on (a timeout); such a reader reads no more."""

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
        if self.given_up is not None:
            raise MediaError(self.path, f"an earlier read of this video was given up on ({self.given_up}); open it "
                                        "again")
        try:
            return within(self.timeout, self.path, self.backend, "reading frames of", lambda: self._read(idx))
        except DecodeTimeoutError:
            self.given_up = f"past {self.timeout:g} s"
            self._drop()  # the decoder may still be busy on the abandoned thread: never touched again from here
            raise
        except MediaError:
            raise
        except Exception as exc:  # decoder failures on corrupt data
            raise MediaError(self.path, f"cannot decode frames (truncated or corrupt?): {_decoder_reason(exc)}"
                             ) from exc

    def get_frames_at(self, timestamps: Sequence[float]) -> tuple[np.ndarray, list[int]]:
        """Frames nearest to ``timestamps`` (seconds) and the frame indices chosen."""
        idx = [self.index_at(t) for t in timestamps]
        return self.get_frames(idx), idx

    def _read(self, indices: list[int]) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Release the decoder. Safe to call twice."""

    def _drop(self) -> None:
        """Forget the decoder without calling it (it may still be in use on a thread given up on); it is
        released when that thread lets go of it."""

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
        _quiet_decord()
        try:
            with native_output_held():
                self._vr: Any = decord.VideoReader(str(self.path), ctx=decord.cpu(0), num_threads=num_threads)
                self.num_frames = len(self._vr)
                fps = float(self._vr.get_avg_fps())
                if self.num_frames > 0:
                    self.height, self.width = self._vr[0].shape[:2]  # decodes the first frame
                    self._vr.seek(0)
        except Exception as exc:  # decord.DECORDError and whatever its FFmpeg raises
            raise MediaError(
                self.path, f"cannot open the video (truncated or corrupt?): decord: {_decoder_reason(exc)}"
            ) from exc
        if self.num_frames <= 0 or not np.isfinite(fps) or fps <= 0:
            raise MediaError(self.path, f"decord reports {self.num_frames} frames at {fps} fps")
        self.fps = fps

    def _read(self, indices: list[int]) -> np.ndarray:
        with native_output_held():
            return np.ascontiguousarray(self._vr.get_batch(indices).asnumpy(), dtype=np.uint8)

    def close(self) -> None:
        self._vr = None

    _drop = close  # dropping the reference is all closing does: decord frees the reader when no thread holds it


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
            raise MediaError(self.path, f"cannot open the video (truncated or corrupt?): {_decoder_reason(exc)}"
                             ) from exc
        try:
            if not self._container.streams.video:
                raise MediaError(self.path, "no video stream in the file")
            fmt = str(getattr(self._container.format, "name", "") or "")
            if fmt == "image2" or fmt.endswith("_pipe"):  # FFmpeg's still-image demuxers
                raise MediaError(self.path, f"is a still image, not a video (FFmpeg reads it as {fmt}); give it "
                                            "as an image item, or replace it with the video")
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
            raise MediaError(self.path, f"cannot read the video (truncated or corrupt?): {_decoder_reason(exc)}"
                             ) from exc

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

    def _drop(self) -> None:
        self._container = None  # not closed: a thread given up on may be decoding from it


class TorchCodecReader(VideoReader):
    """torchcodec's ``VideoDecoder`` (PyTorch's decoder, on the system's FFmpeg) behind the common interface.

    Opened in torchcodec's ``exact`` seek mode, which scans the file once so that frame ``i`` is the ``i``-th
    frame in presentation order whatever the container's index says, as :class:`PyAVReader` counts them; frames
    come as NHWC uint8 (``dimension_order="NHWC"``). The frame rate is the stream's average rate from the header
    (what PyAV and decord report), else the one torchcodec measured over the frames. API: torchcodec's
    ``decoders/_video_decoder.py`` and ``_core/_metadata.py`` (meta-pytorch/torchcodec).
    """

    backend = "torchcodec"

    def __init__(self, path: str | Path, num_threads: int = 1) -> None:
        self.path = Path(path)
        _check_file(self.path)
        problem = decoder_problem("torchcodec")
        if problem is not None:  # the setup, not this file: stops the run instead of skipping every video
            raise ConfigError(f"data.media.decoder=torchcodec: {problem}")
        from torchcodec.decoders import VideoDecoder

        try:
            with native_output_held():
                self._decoder: Any = VideoDecoder(str(self.path), dimension_order="NHWC", seek_mode="exact",
                                                  num_ffmpeg_threads=num_threads, device="cpu")
                meta = self._decoder.metadata
                self.num_frames = len(self._decoder)
        except Exception as exc:  # torchcodec raises RuntimeError/ValueError with FFmpeg's words
            said = _decoder_reason(exc).replace(f"{self.path} ", "").replace(str(self.path), "the file")
            raise MediaError(self.path, f"cannot open the video (truncated or corrupt?): torchcodec: {said}") from exc
        fps = next((float(f) for f in (meta.average_fps_from_header, meta.average_fps) if f and f > 0), 0.0)
        if self.num_frames <= 0 or not np.isfinite(fps) or fps <= 0:
            raise MediaError(self.path, f"torchcodec reports {self.num_frames} frames at {fps} fps")
        self.fps = fps
        self.width, self.height = int(meta.width), int(meta.height)

    def _read(self, indices: list[int]) -> np.ndarray:
        with native_output_held():
            batch = self._decoder.get_frames_at(indices)
        return np.ascontiguousarray(batch.data.numpy(), dtype=np.uint8)

    def close(self) -> None:
        self._decoder = None

    _drop = close


_READERS: dict[str, type[VideoReader]] = {"decord": DecordReader, "pyav": PyAVReader, "torchcodec": TorchCodecReader}


def open_video(path: str | os.PathLike[str], backend: Backend = "auto", *, timeout: float | None = None
               ) -> VideoReader:
    """Open a video with ``backend`` (:data:`video.decoders.DECODERS`). ``"auto"`` tries decord, then PyAV when
    decord is missing, cannot open the file or takes longer than ``timeout`` to.

    ``timeout`` (seconds; None or 0: none) bounds the opening and each later :meth:`VideoReader.get_frames` of the
    reader (see the module's notes). Raises :class:`mmrl_common.errors.MediaError` naming the file (missing, empty,
    truncated/corrupt, no video, :class:`DecodeTimeoutError`), and :class:`mmrl_common.errors.ConfigError` when
    ``backend`` is unknown or cannot run here (not installed; torchcodec without FFmpeg).
    """
    p = Path(path)
    if backend not in ("auto", *_READERS):
        raise ConfigError(str(decoder_problem(backend)))
    problem = decoder_problem(backend)
    if problem is not None:
        raise ConfigError(f"data.media.decoder={backend}: {problem}")
    # the file itself first (missing, empty, an image, a pipe nothing writes to): said once, not per decoder
    within(timeout, p, "", "opening", lambda: _check_file(p))
    if backend != "auto":
        return _open(_READERS[backend], p, timeout)
    if decord_available():
        try:
            return _open(DecordReader, p, timeout)
        except MediaError as decord_error:
            try:
                return _open(PyAVReader, p, timeout)
            except MediaError as exc:
                if isinstance(decord_error, DecodeTimeoutError):
                    if isinstance(exc, DecodeTimeoutError):  # both ran past it: one timeout, said once
                        raise DecodeTimeoutError(p, exc.reason.replace(" with pyav", " with decord, then with pyav", 1)
                                                 ) from exc
                    decord_said = f"it took longer than {timeout:g} s (data.media.decode_timeout)"
                else:
                    decord_said = decord_error.reason.split("decord: ", 1)[-1]  # the same "cannot open" said once
                kind = DecodeTimeoutError if isinstance(exc, DecodeTimeoutError) else MediaError
                raise kind(p, f"{exc.reason}; decord also failed: {decord_said}") from exc
    return _open(PyAVReader, p, timeout)


def _open(cls: type[VideoReader], path: Path, timeout: float | None) -> VideoReader:
    """``cls(path)`` within ``timeout`` seconds, its reads bounded by the same timeout."""
    reader = within(timeout, path, cls.backend, "opening", lambda: cls(path))
    reader.timeout = timeout or None
    return reader
