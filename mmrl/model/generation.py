"""Generation with the HF ``generate``: sampled continuations with their log-probabilities (:func:`generate`),
each prompt computed once for its G samples.

Prefill once per group: the HF ``generate`` backend runs each prompt through the model once, not G times.

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
attention mask, then the three M-RoPE axes by :func:`mmrl.model.rope.rope_index`, the function the model's own
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
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from . import inputs, rope
from .types import TEXT, Generation, PolicyParts, TokenSeq


def can_prefill_once(policy: PolicyParts, seqs: Sequence[TokenSeq], num_return_sequences: int) -> bool:
    """Whether prefill-once applies: :attr:`PolicyOptions.prefill_once` on, several samples per prompt, every prompt
    ends on a text token after at least one other token (the last token is the one ``generate`` computes
    itself; it must not need vision features), and the checkpoint's generation config names no cache
    implementation of its own (``generate`` refuses one together with a given cache)."""
    if not policy.options.prefill_once or num_return_sequences < 2:
        return False
    if getattr(getattr(policy.model, "generation_config", None), "cache_implementation", None) is not None:
        return False
    return all(len(s) >= 2 and s.mm_types[-1] == TEXT for s in seqs)


def generation_positions(policy: PolicyParts, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq],
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (4, B, L) positions ``generate`` builds for a left-padded batch (row 0: text positions from the
    attention mask, padding at 0; rows 1-3: M-RoPE by the model's rope rule) and the (B, 1) rope deltas."""
    mask = batch["attention_mask"]
    text = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    grid_kw = inputs.grid_kwargs(policy, seqs)
    if grid_kw:
        mrope, deltas = rope.rope_index(policy.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                                        attention_mask=mask, **grid_kw)
    else:  # text only: the plain positions on all three axes
        mrope = text.unsqueeze(0).expand(3, -1, -1)
        deltas = torch.zeros(text.shape[0], 1, dtype=torch.long, device=text.device)
    return torch.cat([text.unsqueeze(0), mrope.to(text.dtype)], dim=0), deltas


def repeat_cache(cache: Any, n: int, *, rows: int) -> None:
    """Each of the ``rows`` prompts' cache entries ``n`` times in a row, in place: the keys and values of the
    attention layers and, in a model with linear-attention layers (Qwen3.5), each such layer's convolution and
    recurrent states, which transformers' ``DynamicCache.batch_repeat_interleave`` does not repeat (5.23's
    ``LinearAttentionLayer`` has no such method; its ``reorder_cache`` selects rows)."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    index = None
    for layer in cache.layers:
        if isinstance(layer, DynamicLayer):
            layer.batch_repeat_interleave(n)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            if index is None:
                index = torch.arange(rows).repeat_interleave(n)
            LinearAttentionCacheLayerMixin.reorder_cache(layer, index)


def prefill_once_inputs(policy: PolicyParts, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq],
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
    repeat_cache(cache, n, rows=ids.shape[0])
    # what the plain call leaves behind (generate computes the deltas on the B prompts, before expanding)
    policy.base.rope_deltas = deltas
    return {"input_ids": ids.repeat_interleave(n, dim=0), "attention_mask": mask.repeat_interleave(n, dim=0),
            "mm_token_type_ids": types.repeat_interleave(n, dim=0),
            "position_ids": positions.repeat_interleave(n, dim=1), "past_key_values": cache}


@torch.no_grad()
def generate(
    policy: PolicyParts, seqs: Sequence[TokenSeq], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
    top_k: int = 0, do_sample: bool = True, stop: Sequence[str] = (), num_return_sequences: int = 1,
    with_logprobs: bool = True, with_entropies: bool = False,
) -> list[list[Generation]]:
    """Sample continuations for each sequence (``num_return_sequences`` each), with their log-probs.

    Log-probabilities are those of the temperature-scaled distribution (before top-p/top-k), the same
    quantity :func:`mmrl.model.logprobs.forward_logprobs` computes for training. They need every step's full-vocabulary
    logits; ``with_logprobs=False`` skips them (the trainer recomputes log-probs itself).

    With :attr:`PolicyOptions.prefill_once` (the default) and ``num_return_sequences`` > 1, each prompt (vision tokens
    included) goes through the model once and its samples are decoded from copies of its KV cache; the
    tokens drawn and their log-probs are those of the plain call (up to fp32 round-off).
    """
    if not do_sample and num_return_sequences > 1:  # greedy: n equal copies (HF refuses n > 1 here)
        once = generate(policy, seqs, max_new_tokens=max_new_tokens, do_sample=False, stop=stop,
                             with_logprobs=with_logprobs, with_entropies=with_entropies)
        return [[replace(g[0], token_ids=list(g[0].token_ids), logprobs=list(g[0].logprobs),
                         entropies=list(g[0].entropies))
                 for _ in range(num_return_sequences)] for g in once]
    from transformers import GenerationConfig

    batch = inputs.pad(seqs, left=True, pad_id=policy.pad_id, device=policy.device)
    encoder_outputs, _ = policy.vision.encoder_outputs(seqs)  # one tower call for the batch's media
    # each prompt through the model once, its samples decoded from copies of its cache (prefill_once_inputs)
    prefilled = can_prefill_once(policy, seqs, num_return_sequences)
    # Finished rows are padded with a suppressed token (never sampled), so padding can never be
    # mistaken for a sampled EOS (the tokenizer's pad, <|endoftext|>, is an EOS of Qwen checkpoints).
    fill = policy.suppress_ids[0] if policy.suppress_ids else policy.pad_id
    # A clean generation config: the checkpoint's own (repetition penalty, min_p, ...) would make the
    # sampling distribution differ from the one training computes log-probabilities for.
    # transformers fills every unset (None) field from the checkpoint's generation config, so the
    # neutral values of the processors that change the distribution are set explicitly.
    # A neutral value that still adds a logits processor is left unset (None) where the checkpoint leaves it
    # unset too: min_p=0.0 (it masks nothing, at a softmax and a sort per step) and min_new_tokens=0
    # (min_length becomes the prompt length, a check per step that never fires).
    own = getattr(policy.model, "generation_config", None)
    min_p = None if getattr(own, "min_p", None) is None else 0.0
    min_new = None if not getattr(own, "min_new_tokens", None) else 0
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "typical_p": 1.0,
                "epsilon_cutoff": 0.0, "eta_cutoff": 0.0} if do_sample else {}
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=do_sample,
        num_return_sequences=1 if prefilled else num_return_sequences,
        eos_token_id=policy.eos_ids, pad_token_id=fill, suppress_tokens=policy.suppress_ids or None,
        output_logits=with_logprobs or with_entropies, return_dict_in_generate=True, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
        min_length=0, min_new_tokens=min_new, renormalize_logits=False, **sampling,
        **({"stop_strings": list(stop)} if stop else {}))
    # synced_gpus off: generation is each rank's own (under ZeRO-3 inside generation_weights, the whole
    # weights local; transformers would otherwise turn it on while a DeepSpeed ZeRO-3 config is alive)
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                              "mm_token_type_ids": batch["mm_token_type_ids"], "generation_config": gen,
                              "synced_gpus": False}
    if stop:
        kwargs["tokenizer"] = policy.tokenizer
    if prefilled:  # the B*n rows, positions and the prompts' expanded cache (which holds the media)
        kwargs.update(prefill_once_inputs(policy, batch, seqs, encoder_outputs, num_return_sequences))
    elif encoder_outputs:
        kwargs["mm_encoder_outputs"] = encoder_outputs
        kwargs.update(inputs.grid_kwargs(policy, seqs))
    out = policy.model.generate(**kwargs)
    prompt_len = batch["input_ids"].shape[1]
    new = out.sequences[:, prompt_len:].cpu()
    logp = ent = None
    if with_logprobs or with_entropies:  # (B*n, T, V) float32: memory grows with length x vocabulary
        logits = torch.stack(out.logits, dim=1).float()
        scale = temperature if do_sample else 1.0
        logp_all = F.log_softmax(logits / scale, dim=-1)
        logp = logp_all.gather(-1, new.to(logits.device)[..., None]).squeeze(-1) if with_logprobs else None
        ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropies else None
        del logits, logp_all
    results: list[list[Generation]] = [[] for _ in seqs]
    for row in range(new.shape[0]):
        toks = new[row].tolist()
        n, finished = len(toks), False
        for j, t in enumerate(toks):
            if t in policy.eos_ids:
                n, finished = j + 1, True
                break
            if t == fill:  # padding after a stop string ended this row
                n, finished = j, True
                break
        toks = toks[:n]
        text = policy.tokenizer.decode(toks, skip_special_tokens=True)
        if not finished and stop and any(s in text for s in stop):
            finished = True
        results[row // num_return_sequences].append(Generation(
            token_ids=toks, text=text, logprobs=logp[row, :n].tolist() if logp is not None else [],
            finished=finished, entropies=ent[row, :n].tolist() if ent is not None else []))
    return results


