"""Benchmark media: MVBench's JPEG frame folders and lmms-eval's frame rule, on top of
:class:`mmrl.engine.media.MediaPreparer` (which decodes files with ``video.sample_video`` / ``vision``). A benchmark's
own frame rule is part of its spec (``Benchmark.frame_rule``, e.g. LongVideoBench's :func:`lvb_indices`).

* :class:`FrameFolderReader` — a ``video`` reader over a folder of numbered frames (MVBench Episodic
  Reasoning ships TVQA clips as 3-fps ``00001.jpg`` … folders).
* :func:`mvbench_folder_indices` — the official notebook's ``get_index`` with ``first_idx=1`` for folders.
* a sample's ``duration`` (LongVideoBench's question files) reaches the frame rule only when the rule takes a
  ``duration`` keyword.
* ``lmms-eval`` frame policy — what lmms-eval's Qwen2.5-VL wrapper (``lmms_eval/models/simple/qwen2_5_vl.py``)
  feeds the model: qwen-vl-utils decodes at 2 fps (4 to 768 frames) and sizes the frames for that many, then
  the wrapper keeps ``nframes`` of them (``np.linspace(0, n - 1, nframes, dtype=int)``, duplicates dropped).
  The frames keep the size qwen-vl-utils gave them for the longer list (:meth:`BenchMediaPreparer._item`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from data_pipelines.benchmarks.lvb import lvb_indices
from data_pipelines.schema import MediaItem
from mmrl.config import MediaConfig
from mmrl.engine.media import MediaPreparer
from mmrl.model import MediaInput
from mmrl_common.errors import MediaError
from video.reader import VideoReader
from video.sampling import decode_indices, get_policy, qwen_indices, register_policy, sample_video

__all__ = ["BenchMediaPreparer", "FrameFolderReader", "lmms_eval_decoded", "lmms_eval_indices", "lvb_indices",
           "mvbench_folder_indices"]

FRAME_SUFFIXES = (".jpg", ".jpeg", ".png")
_RESIZE = ("min_pixels", "max_pixels", "total_pixels", "image_patch_size")


class FrameFolderReader(VideoReader):
    """Frames stored as numbered image files in one folder, read in file-name order at ``fps``."""

    def __init__(self, folder: str | Path, fps: float) -> None:
        from PIL import Image

        self.path = Path(folder)
        self.backend = "frames"
        self.files = sorted(p for p in self.path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
        if not self.files:
            raise MediaError(self.path, "frame folder holds no .jpg/.png files")
        self.num_frames = len(self.files)
        self.fps = float(fps)
        with Image.open(self.files[0]) as im:
            self.width, self.height = im.size

    def _read(self, indices: list[int]) -> np.ndarray:
        from vision import open_image

        return np.stack([np.asarray(open_image(self.files[i])) for i in indices])


def mvbench_folder_indices(num_files: int, fps: float, start: float | None, end: float | None,
                           nframes: int) -> list[int]:
    """0-based file positions that MVBench's ``read_frame`` picks: ``get_index`` with ``first_idx=1`` and
    ``max_frame = number of files`` (the files are numbered from 1)."""
    s = max(1, round(start * fps)) if start is not None else 1
    e = min(round(end * fps), num_files) if end is not None else num_files
    seg = (e - s) / nframes
    return [min(max(int(s + seg / 2 + round(seg * i)) - 1, 0), num_files - 1) for i in range(nframes)]


LMMS_FPS, LMMS_MIN_FRAMES, LMMS_MAX_FRAMES = 2.0, 4, 768  # qwen-vl-utils' defaults, which lmms-eval leaves


def lmms_eval_decoded(num_frames: int, fps: float, start: float | None = None, end: float | None = None) -> list[int]:
    """The frames qwen-vl-utils decodes with its defaults (2 fps, 4 to 768 frames)."""
    return qwen_indices(num_frames, fps, start=start, end=end, fps=LMMS_FPS, min_frames=LMMS_MIN_FRAMES,
                        max_frames=LMMS_MAX_FRAMES)


@register_policy("lmms-eval", overwrite=True)
def lmms_eval_indices(num_frames: int, fps: float, /, *, start: float | None = None, end: float | None = None,
                      nframes: int = 32) -> list[int]:
    """lmms-eval's Qwen2.5-VL video frames: of the frames qwen-vl-utils decodes, ``nframes`` spread by
    ``np.linspace(0, n - 1, nframes, dtype=int)`` with duplicates dropped (so a short video keeps fewer)."""
    decoded = lmms_eval_decoded(num_frames, fps, start, end)
    keep = np.unique(np.linspace(0, len(decoded) - 1, int(nframes), dtype=int))
    return [decoded[int(k)] for k in keep]


def _takes(policy: str, key: str) -> bool:
    """Whether the frame rule ``policy`` takes the keyword ``key``."""
    import inspect

    try:
        return key in inspect.signature(get_policy(policy)).parameters
    except ValueError:  # not registered (the error comes from the sampling itself)
        return False


class BenchMediaPreparer(MediaPreparer):
    """A :class:`MediaPreparer` that also reads frame folders and adds run-wide ``extra`` sampling keys
    (e.g. ``total_pixels``). Not thread-safe (its cache); use one per worker thread."""

    def __init__(self, cfg: MediaConfig, *, family: str, extra: dict[str, Any] | None = None,
                 cache_mb: float = 256):
        super().__init__(replace(cfg, cache_mb=min(cfg.cache_mb, cache_mb)), family=family)
        self.extra = dict(extra or {})

    def _item(self, item: MediaItem) -> MediaInput:
        sampling = dict(item.sampling or {})
        if not _takes(self.cfg.video_policy, "duration"):
            sampling.pop("duration", None)
        folder_fps = sampling.pop("folder_fps", None)
        if item.type == "video":
            sampling = {**self.extra, **sampling}
        item = MediaItem(item.type, item.path, sampling)
        path = Path(item.path)
        if item.type == "video" and self.cfg.video_policy == "lmms-eval" and "total_pixels" not in sampling:
            item = MediaItem(item.type, item.path, {**sampling, "total_pixels": self._lmms_total(item, folder_fps)})
        if item.type != "video" or not path.is_dir():
            return super()._item(item)
        return self._folder(item, float(folder_fps or 3.0))

    def _lmms_total(self, item: MediaItem, folder_fps: float | None) -> int:
        """A total-pixel budget that gives the kept frames the size qwen-vl-utils chose for all the frames it
        decoded (its per-frame cap is ``total / frames decoded * 2``; ``decode_indices`` divides by the
        frames kept)."""
        from qwen_vl_utils import vision_process as qvu

        from video import open_video

        path = Path(item.path)
        reader = FrameFolderReader(path, float(folder_fps or 3.0)) if path.is_dir() else None
        try:
            reader = reader or open_video(path, backend=self.cfg.decoder, timeout=self.cfg.decode_timeout)
        except (OSError, RuntimeError, ValueError) as exc:
            raise MediaError(item.path, str(exc)) from exc
        try:
            start, end = item.sampling.get("start"), item.sampling.get("end")
            decoded = len(lmms_eval_decoded(reader.num_frames, reader.fps, start, end))
            kept = len(lmms_eval_indices(reader.num_frames, reader.fps, start=start, end=end,
                                         nframes=int(self.cfg.nframes or 32)))
        finally:
            reader.close()
        factor = self.patch * qvu.SPATIAL_MERGE_SIZE
        return int(qvu.MODEL_SEQ_LEN * factor * factor * 0.9 * kept / decoded)

    def _folder(self, item: MediaItem, fps: float) -> MediaInput:
        opts = self.video_options(dict(item.sampling))
        key = f"frames:{item.path}|{self.cfg.video_policy}|{sorted(opts.items())}"
        cached = self.recall(key)
        if cached is not None:
            return cached
        start, end = opts.pop("start", None), opts.pop("end", None)
        reader = FrameFolderReader(item.path, fps)
        try:
            if self.cfg.video_policy == "segments":
                resize = {k: opts.pop(k) for k in _RESIZE if k in opts}
                idx = mvbench_folder_indices(reader.num_frames, fps, start, end, int(opts.pop("nframes")))
                data = decode_indices(reader, idx, policy="segments", options={"start": start, "end": end},
                                      **resize)
            else:
                data = sample_video(reader, self.cfg.video_policy, start=start, end=end, **opts)
        except ValueError as exc:
            raise MediaError(item.path, str(exc)) from exc
        return self.remember(key, MediaInput(key=key, kind="video", data=data, timestamps=list(data.timestamps)))
