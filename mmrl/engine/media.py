"""Turn a sample's media items into decoded, budget-fitted inputs for the policy.

One place decides what the model sees: videos go through :func:`video.sample_video` (the ``qwen`` policy
by default, which calls qwen-vl-utils so training, rollouts and evaluation see the same frames) and
images through :func:`vision.open_image` and :func:`vision.fit_pixels`. Per-item ``sampling`` hints in the
record override the run's settings. Decoded items are kept in an LRU cache keyed by file and settings
(bounded by ``MediaConfig.cache_mb`` of decoded pixels), so a prompt drawn again does not decode its video
again.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from mmrl.config import MediaConfig
from mmrl.model import MediaInput
from mmrl_common.errors import MediaError


def patch_size_for(family: str) -> int:
    """Vision patch size of a Qwen-VL family (the pixel budget's rounding factor is twice this)."""
    return 16 if family.startswith("qwen3") else 14


def own_budget(opts: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with a record's own pixel bound kept when it lies past the run's other one: a record's
    ``max_pixels`` below the run's ``min_pixels`` lowers the floor to it (and a ``min_pixels`` above the run's
    ``max_pixels`` raises the cap), as the record asks, instead of a budget no frame fits."""
    if "max_pixels" in sampling and "min_pixels" not in sampling:
        opts["min_pixels"] = min(opts["min_pixels"], opts["max_pixels"])
    if "min_pixels" in sampling and "max_pixels" not in sampling:
        opts["max_pixels"] = max(opts["max_pixels"], opts["min_pixels"])
    return opts


class MediaPreparer:
    def __init__(self, cfg: MediaConfig, *, family: str = "qwen2_5_vl"):
        self.cfg = cfg
        self.patch = patch_size_for(family)
        self.cache: OrderedDict[str, tuple[MediaInput, int]] = OrderedDict()
        self.cache_limit = int(cfg.cache_mb * 2**20)
        self.cache_used = 0

    def video_options(self, sampling: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        opts: dict[str, Any] = {"min_pixels": c.video_min_pixels, "max_pixels": c.video_max_pixels,
                                "image_patch_size": self.patch}
        if c.video_total_pixels:  # qwen-vl-utils' whole-video budget (fetch_video: total_pixels / nframes * 2)
            opts["total_pixels"] = c.video_total_pixels
        if c.video_policy == "qwen":
            opts.update(min_frames=c.min_frames, max_frames=c.max_frames)
            opts.update({"nframes": c.nframes} if c.nframes else {"fps": c.fps})
        else:
            opts["nframes"] = c.nframes or c.max_frames
        for key, value in sampling.items():
            if key in ("fps", "nframes") and c.video_policy == "qwen":
                opts.pop("fps", None)
                opts.pop("nframes", None)
            opts[key] = value
        return own_budget(opts, sampling)

    def prepare(self, sample: Any) -> list[MediaInput]:
        """Decode every media item of ``sample``; :class:`MediaError` names the file on failure."""
        return [self._item(item) for item in sample.media]

    def _item(self, item: Any) -> MediaInput:
        sampling = dict(item.sampling or {})
        if item.type == "video":
            opts = self.video_options(sampling)
            key = f"video:{item.path}|{self.cfg.video_policy}|{json.dumps(opts, sort_keys=True)}"
        else:
            opts = own_budget({"min_pixels": sampling.get("min_pixels", self.cfg.image_min_pixels),
                               "max_pixels": sampling.get("max_pixels", self.cfg.image_max_pixels)}, sampling)
            key = f"image:{item.path}|{json.dumps(opts, sort_keys=True)}"
        cached = self.recall(key)
        if cached is not None:
            return cached
        if item.type == "video":
            from video import sample_video

            start, end = opts.pop("start", None), opts.pop("end", None)
            try:
                data = sample_video(item.path, self.cfg.video_policy, start=start, end=end, backend=self.cfg.decoder,
                                    decode_timeout=self.cfg.decode_timeout, **opts)
            except ValueError as exc:
                raise MediaError(item.path, str(exc)) from exc
            except (OSError, RuntimeError, EOFError, MemoryError) as exc:  # a decoder's own error that got past
                # the reader: the file named, so data.on_bad_sample=skip skips it like any bad file
                raise MediaError(item.path, f"cannot decode the video ({type(exc).__name__}: {exc})") from exc
            media = MediaInput(key=key, kind="video", data=data, timestamps=list(data.timestamps))
        elif item.type == "image":
            from vision import fit_pixels, open_image

            try:
                image = fit_pixels(open_image(item.path), opts["min_pixels"], opts["max_pixels"],
                                   factor=2 * self.patch)
            except (ValueError, AssertionError) as exc:  # e.g. an aspect ratio the Qwen-VL resize rule rejects
                raise MediaError(item.path, f"cannot be resized for the model: {exc}") from exc
            except (OSError, RuntimeError, MemoryError) as exc:
                raise MediaError(item.path, f"cannot decode the image ({type(exc).__name__}: {exc})") from exc
            media = MediaInput(key=key, kind="image", data=image)
        else:
            raise MediaError(item.path, f"unknown media type '{item.type}' (expected image or video)")
        return self.remember(key, media)

    def recall(self, key: str) -> MediaInput | None:
        """A cached item (and mark it recently used), or None."""
        if key not in self.cache:
            return None
        self.cache.move_to_end(key)
        return self.cache[key][0]

    def remember(self, key: str, media: MediaInput) -> MediaInput:
        """Cache ``media`` under ``key``, evicting the least recently used items beyond the byte budget."""
        size = int(media.data.frames.nbytes) if media.kind == "video" else media.data.width * media.data.height * 3
        if size <= self.cache_limit:
            self.cache[key] = (media, size)
            self.cache_used += size
            while self.cache_used > self.cache_limit:
                _, (_, freed) = self.cache.popitem(last=False)
                self.cache_used -= freed
        return media
