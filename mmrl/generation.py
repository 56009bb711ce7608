"""Prefill once per group: the HF ``generate`` backend runs each prompt through the model once, not G times.

``model.generate(..., num_return_sequences=G)`` repeats every prompt G times *before* its prefill, so a
group's prompt (vision tokens included; for a video often a thousand tokens or more) is computed G times.
:func:`prefill_once_inputs` instead

1. runs the left-padded batch of the B distinct prompts **without their last token** through the base model
   once (the vision features come from the policy's one tower call for the batch), recording each layer's
   keys and values in a ``DynamicCache``;
2. repeats every layer's keys and values G times along the batch (``repeat_interleave``: the rows of a
   prompt's samples are consecutive, as ``generate``'s own expansion lays them out);
3. returns the keyword arguments of one ``model.generate`` call over the B*G expanded rows with that cache and
   ``num_return_sequences=1``: transformers computes only the uncached last prompt token (its logits are the
   first sampling step's) and decodes as usual, so its sampling, logits processors, stop strings and logits
   output are the ones of the plain call.

Positions: ``generate`` gets the plain call's (4, B*G, L) positions explicitly (text positions from the
attention mask, then the three M-RoPE axes by :func:`mmrl.rope.rope_index`, the function the model's own
``get_rope_index`` is bound to), so neither the prefill nor the decode steps depend on the model's cached
``rope_deltas`` (they are set to the values the plain call leaves behind anyway). Every row therefore sees the
same positions, keys and values as in the plain call; only the order of floating-point operations differs
(the prompt's keys and values come from a B-row pass, the last prompt token is computed against the cache),
which moves log-probabilities by fp32 round-off. The random draws are the plain call's too: the same
``(B*G, V)`` multinomial at every step.

Memory: the expanded cache holds G copies of each prompt's keys and values, as the plain call's cache does;
the prefill's activations are those of B rows instead of B*G.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmrl import rope

if TYPE_CHECKING:
    from mmrl.policy import Policy, TokenSeq

TEXT = 0


def can_prefill_once(policy: Policy, seqs: Sequence[TokenSeq], num_return_sequences: int) -> bool:
    """Whether prefill-once applies: :attr:`Policy.prefill_once` on, several samples per prompt, every prompt
    ends on a text token after at least one other token (the last token is the one ``generate`` computes
    itself; it must not need vision features), and the checkpoint's generation config names no cache
    implementation of its own (``generate`` refuses one together with a given cache)."""
    if not policy.prefill_once or num_return_sequences < 2:
        return False
    if getattr(getattr(policy.model, "generation_config", None), "cache_implementation", None) is not None:
        return False
    return all(len(s) >= 2 and s.mm_types[-1] == TEXT for s in seqs)


def generation_positions(policy: Policy, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq],
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (4, B, L) positions ``generate`` builds for a left-padded batch (row 0: text positions from the
    attention mask, padding at 0; rows 1-3: M-RoPE by the model's rope rule) and the (B, 1) rope deltas."""
    mask = batch["attention_mask"]
    text = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    grid_kw = policy._grid_kwargs(seqs)
    if grid_kw:
        mrope, deltas = rope.rope_index(policy.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                                        attention_mask=mask, **grid_kw)
    else:  # text only: the plain positions on all three axes
        mrope = text.unsqueeze(0).expand(3, -1, -1)
        deltas = torch.zeros(text.shape[0], 1, dtype=torch.long, device=text.device)
    return torch.cat([text.unsqueeze(0), mrope.to(text.dtype)], dim=0), deltas


def prefill_once_inputs(policy: Policy, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq],
                        encoder_outputs: dict[str, Any], n: int) -> dict[str, Any]:
    """``model.generate`` keyword arguments for ``n`` samples of each prompt of the left-padded ``batch``,
    each prompt (but its last token) computed once: ``input_ids``, ``attention_mask``, ``mm_token_type_ids``
    and ``position_ids`` of the B*n rows, and ``past_key_values``, the prompts' cache repeated n times.
    Call ``generate`` with them and ``num_return_sequences=1`` (and without media inputs: the cache holds
    them)."""
    from transformers.cache_utils import DynamicCache

    model = policy.model
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["mm_token_type_ids"]
    positions, deltas = generation_positions(policy, batch, seqs)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    full = bool((mask == 1).all())  # as generate does: no mask at all when nothing is padded
    policy.base(input_ids=ids[:, :-1], attention_mask=None if full else mask[:, :-1],
                position_ids=positions[..., :-1], mm_token_type_ids=types[:, :-1],
                mm_encoder_outputs=encoder_outputs or None, past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(n)
    # what the plain call leaves behind (generate computes the deltas on the B prompts, before expanding)
    policy.base.rope_deltas = deltas
    return {"input_ids": ids.repeat_interleave(n, dim=0), "attention_mask": mask.repeat_interleave(n, dim=0),
            "mm_token_type_ids": types.repeat_interleave(n, dim=0),
            "position_ids": positions.repeat_interleave(n, dim=1), "past_key_values": cache}
