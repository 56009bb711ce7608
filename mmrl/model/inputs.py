"""Model inputs from token sequences: the padded batch, the vision grids and the M-RoPE positions, and the
prompt as the model saw it (for the logged rollouts).

**M-RoPE computed, not guessed.** Position ids come from the model's own ``get_rope_index`` rule
(:func:`mmrl.model.rope.rope_index`) with the image/video grids, the token-type ids and (Qwen2.5-VL) the video
seconds-per-grid, on the padded batch; they equal the positions the model computes for each sequence alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import rope
from .types import TEXT, PolicyParts, TokenSeq


def prompt_text(tokenizer: Any, seq: TokenSeq) -> str:
    """The prompt of ``seq`` as the model saw it (the tokens before its first trained token, chat-template
    and vision tokens included), each run of a repeated media placeholder shown once with its count
    (``<|video_pad|>×96``), for the logged rollouts."""
    end = next((i for i, m in enumerate(seq.loss_mask) if m), len(seq.ids))
    ids, parts = seq.ids[:end], []
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i] and seq.mm_types[j] != TEXT:
            j += 1
        if j - i > 1:
            parts.append(f"{tokenizer.decode([ids[i]])}×{j - i}")
            i = j
            continue
        j = i + 1
        while j < len(ids) and seq.mm_types[j] == TEXT:
            j += 1
        parts.append(tokenizer.decode(ids[i:j]))
        i = j
    return "".join(parts)


def grid_kwargs(policy: PolicyParts, seqs: Sequence[TokenSeq]) -> dict[str, Any]:
    """The vision grids of ``seqs``' media (and Qwen2.5-VL's video seconds per grid), as the model's
    forward and its rope rule take them."""
    kw: dict[str, Any] = {}
    image_grids = [policy.media[k].grid_thw for s in seqs for k in s.media if policy.media[k].kind == "image"]
    videos = [policy.media[k] for s in seqs for k in s.media if policy.media[k].kind == "video"]
    if image_grids:
        kw["image_grid_thw"] = torch.stack(image_grids).to(policy.device)
    if videos:
        kw["video_grid_thw"] = torch.stack([v.grid_thw for v in videos]).to(policy.device)
        if policy.rope_takes_seconds:
            kw["second_per_grid_ts"] = torch.tensor(
                [v.second_per_grid if v.second_per_grid is not None else 1.0 for v in videos], device=policy.device)
    return kw


def pad(seqs: Sequence[TokenSeq], *, left: bool, pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``seqs`` padded (left for generation, right for log-prob passes) on ``device``: input ids,
    token types, attention mask and loss mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(seqs), width), dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, sl] = torch.tensor(s.ids)
        types[i, sl] = torch.tensor(s.mm_types)
        attn[i, sl] = 1
        loss[i, sl] = torch.tensor(s.loss_mask)
    out = {"input_ids": ids, "mm_token_type_ids": types, "attention_mask": attn, "loss_mask": loss}
    return {k: v.to(device) for k, v in out.items()}


def position_ids(policy: PolicyParts, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq]) -> torch.Tensor:
    """(3, B, L) M-RoPE positions for a padded batch, by the pre-training rule (:func:`mmrl.model.rope.rope_index`,
    the function the model's own forward and ``generate`` use too): text after a vision block resumes at
    the block's largest position + 1."""
    grid_kw = grid_kwargs(policy, seqs)
    if not grid_kw:  # text only: plain positions on all three axes
        pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        return pos.unsqueeze(0).expand(3, -1, -1)
    pos, _ = rope.rope_index(
        policy.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
        attention_mask=batch["attention_mask"], **grid_kw)
    return pos
