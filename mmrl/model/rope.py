"""M-RoPE position ids by the rule the Qwen-VL models were pre-trained with.

Text tokens advance one position per token on all three axes. A vision block (an image, a video, or, in
Qwen3-VL, one frame group of a video) with merged grid ``(T, H, W)`` that starts at position ``s`` gets

* temporal ``s + t'`` for its ``t``-th temporal patch, where ``t' = t`` (Qwen2-VL, Qwen3-VL) or
  ``t' = floor(t * seconds_per_grid * tokens_per_second)`` (Qwen2.5-VL videos; images use ``t' = t``),
* height ``s + h`` and width ``s + w``,

and the text after the block resumes at **the block's largest position + 1**, i.e.
``s + max(t'_last + 1, H, W)``. This is the rule of the original Qwen2-VL / Qwen2.5-VL / Qwen3-VL
releases and of vLLM. transformers 5.23 resumes at ``s + max(H, W)`` instead, which ignores a video's
temporal extent: after a long low-resolution video (``t'_last + 1 > max(H, W)``) the following text gets
positions that overlap the video's. For images (one temporal patch, ``t'_last = 0``) and for Qwen3-VL
(every frame group is its own block with one temporal patch) the two rules agree.

:func:`install` puts :func:`rope_index` on a model instance in place of its ``get_rope_index``, so the
positions the model computes itself (its forward without ``position_ids``, ``generate`` and the
rope-delta cache used while decoding) follow the same rule as the positions mmrl passes in.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from mmrl_common.errors import MmrlError

from .families import FAMILIES, media_family
from .types import IMAGE, TEXT, VIDEO


def _family(base: torch.nn.Module) -> str:
    """The family whose rule positions ``base``'s tokens: a mixture-of-experts model's dense family (Qwen3-VL
    MoE has Qwen3-VL's vision tower and M-RoPE)."""
    family = getattr(base.config, "model_type", None)
    if family not in FAMILIES:
        raise MmrlError(f"M-RoPE positions: model type {family!r} is not one of {', '.join(FAMILIES)}")
    return media_family(family)


def _blocks(family: str, kind: int, grids: torch.Tensor | None,
            seconds: list[float] | None) -> list[tuple[int, int, int, float]]:
    """One ``(T, H, W, seconds per temporal patch)`` per vision block, in placeholder order (grids not yet
    merged); the seconds matter for Qwen2.5-VL videos only."""
    if grids is None:
        return []
    out: list[tuple[int, int, int, float]] = []
    for i, (t, h, w) in enumerate(grids.tolist()):
        if kind == VIDEO and family == "qwen3_vl":  # one block per temporal patch (timestamps between them)
            out += [(1, h, w, 1.0)] * t
        else:
            sec = seconds[i] if kind == VIDEO and seconds is not None else 1.0
            out.append((t, h, w, float(sec)))
    return out


def _block_positions(start: int, t: int, h: int, w: int, seconds: float, family: str, kind: int,
                     tokens_per_second: float) -> torch.Tensor:
    """(3, t*h*w) positions of one merged vision block starting at ``start``."""
    ti = torch.arange(t)
    if kind == VIDEO and family == "qwen2_5_vl":
        # (index x seconds-per-grid) x tokens-per-second in fp32, then truncated, as in the original release
        ti = (ti.to(torch.float32) * torch.tensor(seconds, dtype=torch.float32) * tokens_per_second).long()
    tt = ti.view(t, 1, 1).expand(t, h, w)
    hh = torch.arange(h).view(1, h, 1).expand(t, h, w)
    ww = torch.arange(w).view(1, 1, w).expand(t, h, w)
    return torch.stack([tt, hh, ww]).reshape(3, -1) + start


def rope_index(
    self: torch.nn.Module,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(position_ids (3, B, L), rope_deltas (B, 1))`` for a batch, by the pre-training rule.

    ``self`` is the Qwen-VL base model (``model.model``; its config gives the family, merge size and
    tokens per second). The signature is that of transformers' ``get_rope_index`` (extra keyword arguments,
    such as the ones ``generate`` passes along, are ignored). Padding (``attention_mask == 0``) gets
    position 0; ``rope_deltas`` is ``largest position + 1 - unpadded length``, the offset decoding adds to
    the token index of each new token. Vision blocks are taken from the grids in order across the batch
    (images and videos separately), as the processor lists them.
    """
    family = _family(self)
    vcfg = self.config.vision_config
    merge = int(vcfg.spatial_merge_size)
    tps = float(getattr(vcfg, "tokens_per_second", 1) or 1)
    if mm_token_type_ids is None:
        mm_token_type_ids = torch.zeros_like(input_ids)
        for kind, tok in ((IMAGE, self.config.image_token_id), (VIDEO, self.config.video_token_id)):
            mm_token_type_ids = mm_token_type_ids.masked_fill(input_ids == tok, kind)
    seconds = second_per_grid_ts.tolist() if second_per_grid_ts is not None else None
    queues = {IMAGE: _blocks(family, IMAGE, image_grid_thw, None),
              VIDEO: _blocks(family, VIDEO, video_grid_thw, seconds)}
    used = {IMAGE: 0, VIDEO: 0}
    batch, length = input_ids.shape
    positions = torch.zeros(3, batch, length, dtype=torch.long)
    deltas = []
    types_cpu = mm_token_type_ids.detach().cpu()
    mask_cpu = attention_mask.detach().cpu().bool() if attention_mask is not None and attention_mask.dim() == 2 \
        else torch.ones(batch, length, dtype=torch.bool)
    for b in range(batch):
        kinds = types_cpu[b][mask_cpu[b]].tolist()
        parts: list[torch.Tensor] = []
        nxt, i = 0, 0
        while i < len(kinds):
            kind, j = kinds[i], i
            while j < len(kinds) and kinds[j] == kind:
                j += 1
            if kind == TEXT:
                parts.append(torch.arange(nxt, nxt + j - i).expand(3, -1))
                nxt += j - i
            else:
                left = j - i  # a run of placeholders holds one or more whole blocks
                while left > 0:
                    if used[kind] >= len(queues[kind]):
                        raise MmrlError(f"M-RoPE positions: more {'image' if kind == IMAGE else 'video'} "
                                        "placeholders than grids")
                    t, h, w, sec = queues[kind][used[kind]]
                    used[kind] += 1
                    block = _block_positions(nxt, t, h // merge, w // merge, sec, family, kind, tps)
                    if block.shape[1] > left:
                        raise MmrlError("M-RoPE positions: a grid holds more tokens than its placeholder run")
                    parts.append(block)
                    left -= block.shape[1]
                    nxt = int(block.max()) + 1  # the original rule: text resumes after the block's largest
            i = j
        if parts:
            row = torch.cat(parts, dim=1)
            positions[:, b, mask_cpu[b]] = row
            deltas.append(int(row.max()) + 1 - row.shape[1])
        else:
            deltas.append(0)
    for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
        if used[kind] != len(queues[kind]):
            raise MmrlError(f"M-RoPE positions: {len(queues[kind]) - used[kind]} {name} grid(s) without placeholders")
    device = input_ids.device
    return (positions.to(device=device, dtype=input_ids.dtype),
            torch.tensor(deltas, dtype=torch.long, device=device).unsqueeze(1))


def install(model: torch.nn.Module) -> None:
    """Make ``model`` (a Qwen-VL ``...ForConditionalGeneration``) compute its M-RoPE positions with
    :func:`rope_index`: bound on this instance's base model only (``model.model.get_rope_index``), so its
    forward, ``generate`` and the decoding rope-delta cache all use it; other instances are untouched.
    A deep copy of the model carries the binding over to the copy."""
    base = model.model
    _family(base)
    base.get_rope_index = types.MethodType(rope_index, base)
