"""Shared by the policy-level tests: random-pixel images and videos of a chosen grid size for the tiny
models (real processors encode them), a user prompt over them, a probe of the positions the rotary
embedding receives, and a model folder's weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors.torch import load_file

from mmrl.model import MediaInput, Policy, TokenSeq
from video.sampling import SampledVideo


def patch_of(family: str) -> int:
    return 16 if family.startswith("qwen3") else 14


def video(family: str, key: str, frames: int = 8, side: int = 4, fps: float = 2.0, seed: int = 0) -> MediaInput:
    """``frames`` frames of ``side`` x ``side`` patches sampled at ``fps``."""
    px = side * patch_of(family)
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (frames, 3, px, px), generator=g, dtype=torch.uint8)
    data = SampledVideo(frames=pixels, indices=list(range(frames)), timestamps=[i / fps for i in range(frames)],
                        video_fps=fps, sample_fps=fps, total_frames=frames, duration=frames / fps,
                        window_frames=frames)
    return MediaInput(key=key, kind="video", data=data, timestamps=list(data.timestamps))


def image(family: str, key: str, w: int = 3, h: int = 2, seed: int = 0) -> MediaInput:
    """An image of ``w`` x ``h`` merged tokens."""
    f = 2 * patch_of(family)
    g = torch.Generator().manual_seed(100 + seed)
    arr = torch.randint(0, 256, (h * f, w * f, 3), generator=g, dtype=torch.uint8).numpy()
    return MediaInput(key=key, kind="image", data=Image.fromarray(arr))


def prompt(policy: Policy, media: list[MediaInput], question: str) -> TokenSeq:
    content: list[dict[str, Any]] = [{"type": m.kind} for m in media]
    content.append({"type": "text", "text": question})
    return policy.encode(policy.render([{"role": "user", "content": content}]), media)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model folder's safetensors files."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {folder}"
    return out


def model_weights(folder: Path) -> dict[str, torch.Tensor]:
    """A model folder's weights under the model's own parameter names (``from_pretrained`` maps a checkpoint
    saved with the original names, ``model.layers.*``, and one saved with the current names alike)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder)
    return {k: v.detach() for k, v in model.state_dict().items()}


class RopeProbe:
    """The position ids the language model's rotary embedding receives, call by call."""

    def __init__(self, policy: Policy):
        self.seen: list[torch.Tensor] = []
        self.handle = policy.base.language_model.rotary_emb.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module: Any, args: tuple, kwargs: dict) -> None:
        pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        self.seen.append(pos.detach().clone())

    def close(self) -> None:
        self.handle.remove()
