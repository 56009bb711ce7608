"""Multi-turn environments: the :class:`Environment` interface, its registry (``rollout.environment``), and the
built-in ``zoom``.

An environment reads the policy's last turn (:meth:`Environment.step`) and returns what the policy sees next
(an :class:`Observation`: text and media, a user turn masked out of the loss) or ``None`` to end the episode;
:func:`mmrl.engine.rollout.run_episodes` drives it. Methods register their own (EARL's ``select_frames``:
:mod:`mmrl.methods.earl`).

``zoom``: the policy may ask for a closer look before answering. Its action is
``<zoom>x0,y0,x1,y1</zoom>`` (a normalised box on the image, or on a video frame: append ``@SECONDS``, e.g.
``<zoom>0.2,0.2,0.7,0.7@1.5</zoom>``; without it the middle of the shown clip is used). The environment
answers with the zoomed crop as a new image. An answer (``<answer>``) or the zoom budget ends the episode;
a malformed action gets a short text reminder of the format, so the loop always makes progress.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mmrl.model import MediaInput
from mmrl_common.registry import Registry


@dataclass
class Observation:
    """What the environment shows the policy next: text with ``{image}``/``{video}`` slots, and media."""

    text: str
    media: list[MediaInput] = field(default_factory=list)


class Environment:
    """Base class for multi-turn environments; one instance per episode."""

    def __init__(self, sample: Any, media: list[MediaInput], **kwargs: Any):
        self.sample = sample
        self.media = media
        self.info: dict[str, Any] = {}

    def step(self, action: str) -> Observation | None:
        """Read the policy's last turn; return the next observation or ``None`` to end the episode."""
        raise NotImplementedError


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", "rollout.environment")
register_environment = ENVIRONMENTS.register


def get_environment(name: str) -> type[Environment]:
    """The environment class registered under ``name`` (a method's module registers its own on import)."""
    return ENVIRONMENTS.get(name)


_NUM = r"(\d*\.?\d+)"
_ZOOM = re.compile(
    rf"<zoom>\s*{_NUM}\s*,\s*{_NUM}\s*,\s*{_NUM}\s*,\s*{_NUM}\s*(?:@\s*{_NUM}\s*)?</zoom>")


@register_environment("zoom")
class ZoomEnvironment(Environment):
    def __init__(self, sample: Any, media: list[MediaInput], *, max_zooms: int = 2,
                 max_pixels: int = 64 * 28 * 28, **kwargs: Any):
        super().__init__(sample, media)
        self.max_zooms = max_zooms
        self.max_pixels = max_pixels
        self.info = {"zooms": 0, "invalid_actions": 0}

    def step(self, action: str) -> Observation | None:
        if "<answer>" in action or self.info["zooms"] >= self.max_zooms or not self.media:
            return None
        match = _ZOOM.search(action)
        if match is None:
            self.info["invalid_actions"] += 1
            return Observation(text="To look closer reply <zoom>x0,y0,x1,y1</zoom> (box in 0..1); "
                                    "otherwise give <answer>...</answer>.")
        from vision import zoom

        at = match.group(5)
        try:
            box = [float(v) for v in match.groups()[:4]]
            frame = self._frame(float(at) if at is not None else None)
            image = zoom(frame, box, max_pixels=self.max_pixels)
        except ValueError as exc:  # a bad box: tell the policy, do not crash the run
            self.info["invalid_actions"] += 1
            return Observation(text=f"Invalid zoom: {exc}. Use 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1.")
        self.info["zooms"] += 1
        n = self.info["zooms"]
        key = f"{self.media[0].key}|zoom{n}:{','.join(f'{v:.3f}' for v in box)}@{at}"
        return Observation(text="Zoomed view: {image}", media=[MediaInput(key=key, kind="image", data=image)])

    def _frame(self, at: float | None) -> Any:
        """The image to zoom into: the first image, or a video frame at ``at`` seconds."""
        first = self.media[0]
        if first.kind == "image":
            return first.data
        from PIL import Image

        video = first.data
        stamps = list(video.timestamps)
        target = at if at is not None else stamps[len(stamps) // 2]
        if video.path:  # zoom into the source frame at full resolution (the run's decoder and timeout)
            with video.reopen() as reader:
                target = min(max(target, 0.0), reader.duration)
                frames, _ = reader.get_frames_at([target])
            return Image.fromarray(frames[0])
        i = min(range(len(stamps)), key=lambda j: abs(stamps[j] - target))
        return Image.fromarray(video.frames[i].permute(1, 2, 0).numpy())
