"""Per-token log-probabilities (and entropies) of token sequences under a policy: the padded pass, the
padding-free pass (:mod:`mmrl.model.packing`) and the shared-prefix passes (:mod:`mmrl.model.shared_prefix`),
each followed by the chunked LM head (:mod:`mmrl.model.logprob_head`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import inputs, passes
from . import shared_prefix as prefix
from .logprob_head import token_logprobs
from .types import PolicyParts, TokenSeq


def forward_logprobs(
    policy: PolicyParts, seqs: Sequence[TokenSeq], *, temperature: float = 1.0, with_entropy: bool = False,
    entropy_grad: bool = True, chunk_tokens: int | None = None, shared_prefix: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per-token log-probabilities (and entropies) of each sequence's own tokens.

    Returns ``(logps, entropies, mask)``, each (B, L): entry ``t`` scores token ``t`` given tokens
    ``< t``; ``mask`` is the loss mask (1 on policy-produced tokens). Only masked positions are
    computed through the LM head (the rest are 0), which keeps memory flat for long prompts.
    ``entropy_grad=False`` computes the entropies without a graph (for logging and shaping only).

    Memory: the masked rows go through the LM head ``chunk_tokens`` rows at a time (default
    :attr:`PolicyOptions.logprob_chunk_tokens`; 0 or a ``logprob_chunk_tokens`` of None: all at once). Each chunk
    keeps ``logit[target] - logsumexp(logits)`` and, when asked for, its entropy; its logits are not kept
    for backward but recomputed there one chunk at a time (activation checkpointing per chunk), so no
    full-vocabulary tensor of the whole micro-batch exists in forward or backward. The values and
    gradients equal those of the full log-softmax within fp32 round-off. With ``entropy_grad=True``
    each chunk keeps its own log-softmax graph while it is recomputed (more memory per chunk).

    Shared prefix (``shared_prefix``, default :attr:`PolicyOptions.shared_prefix`): consecutive sequences with
    the same prompt (the tokens before the first trained one, and the same media) form a group; the
    group's longest common token prefix, which must hold all its vision tokens, goes through the language
    model once and the group's continuations attend to that one encoding (its KV cache). The results, and
    the gradients, which reach the prefix's computation once summed over the continuations, are those of
    the padded batch within round-off. Groups of one sequence, groups without a common prefix and groups
    with vision tokens after it take the padded path (in the same prefix pass, whole); so does the whole
    micro-batch with :attr:`PolicyOptions.share_vision_features` off. Activation checkpointing works as usual (the
    prefix's keys and values are written once and only read afterwards, so recomputation is exact).

    With sdpa or eager attention and padding-free passes, the shared prefix may instead run as one packed
    pass (:func:`mmrl.model.shared_prefix.use_one_pass`, chosen by cost: no second call of every module, no summing of each weight's
    gradients from two passes): each prompt once, followed by its continuations, each of which sees the
    prompt and itself.

    Padding-free (:attr:`PolicyOptions.padding_free`, :mod:`mmrl.model.packing`): the padded path and the shared-prefix path's
    first pass put their sequences back to back without padding, each with its own positions and attending
    to itself only (flash attention: one row and the kernel's variable-length call; sdpa/eager: a
    block-diagonal causal mask over the rows that cost least, :func:`mmrl.model.packing.layout`). The results and
    gradients are the padded batch's within round-off.
    """
    opts, invariant = policy.options, policy.binding.invariant
    batch = inputs.pad(seqs, left=False, pad_id=policy.pad_id, device=policy.device)
    position_ids = inputs.position_ids(policy, batch, seqs)
    mask = batch["loss_mask"].clone()
    mask[:, 0] = 0
    rows, cols = mask.nonzero(as_tuple=True)
    use_shared = opts.shared_prefix if shared_prefix is None else shared_prefix
    # share_vision_features off is the peer-framework baseline (every sequence on its own, its media
    # encoded per occurrence): the padded path
    plan = prefix.prefix_plan(seqs) if use_shared and (opts.share_vision_features or invariant) \
        else None
    if plan is None and use_shared and invariant:  # the same two passes on every rank
        plan = [([i], 0) for i in range(len(seqs))]
    if plan is not None and prefix.use_one_pass(policy, plan, seqs):
        hidden_rows = prefix.one_pass_hidden(policy, seqs, batch, position_ids, plan, rows, cols)
    elif plan is not None:
        hidden_rows = prefix.two_pass_hidden(policy, seqs, batch, position_ids, plan, rows, cols)
    elif (impl := passes.packing_impl(policy)) is not None:  # padding-free: the sequences back to back
        lengths = [len(s) for s in seqs]
        packed = passes.pack(policy, batch, position_ids, range(len(seqs)), lengths, impl)
        # media in the order their placeholders appear in the packed rows
        encoder_outputs, anchor = policy.vision.encoder_outputs([seqs[j] for j in packed.order])
        out = policy.base(
            input_ids=packed.input_ids, position_ids=packed.position_ids,
            mm_token_type_ids=packed.mm_token_type_ids, mm_encoder_outputs=encoder_outputs or None,
            use_cache=False, **packed.model_kwargs(impl, passes.compute_dtype(policy)),
        )
        flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        hidden_rows = flat[packed.flat_index(rows, cols - 1)]
        if anchor is not None:
            hidden_rows = hidden_rows + anchor
    else:
        encoder_outputs, anchor = policy.vision.encoder_outputs(seqs)
        out = policy.base(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=position_ids,
            mm_token_type_ids=batch["mm_token_type_ids"], mm_encoder_outputs=encoder_outputs or None,
            use_cache=False,
        )
        hidden_rows = out.last_hidden_state[rows, cols - 1]
        if anchor is not None:
            hidden_rows = hidden_rows + anchor
    chunk = (opts.logprob_chunk_tokens if chunk_tokens is None else chunk_tokens) or 0
    calls = 0
    if invariant and chunk > 0:  # as many LM-head calls as the rank that needs the most
        calls = policy.binding.max_int(-(-int(rows.numel()) // chunk))
    # Under ZeRO-3 a frozen LM head (LoRA) comes back empty to a checkpointed recomputation in backward
    # (measured with DeepSpeed 0.19.8: its weight is not gathered again there): its chunks keep their logits
    recompute = policy.binding.gather_params is None or any(p.requires_grad for p in policy.model.lm_head.parameters())
    lp, ent = token_logprobs(policy.model.lm_head, hidden_rows, batch["input_ids"][rows, cols],
                              temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
                              chunk=chunk, calls=calls, recompute=recompute)
    logps = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), lp)
    entropies = None
    if ent is not None:
        entropies = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), ent)
    return logps, entropies, mask
