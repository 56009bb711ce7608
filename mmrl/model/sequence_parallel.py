"""Sequence parallelism (``train.sequence_parallel_size``): one sample's tokens spread over a group of ranks,
Ulysses-style.

A log-prob pass under a :class:`SequenceGroup` of ``n`` ranks (:func:`forward_logprobs`) computes what one process
computes, with each rank holding ``1 / n`` of the language model's activations (Qwen3.5's linear-attention layers
excepted: they hold the whole sequence on every rank, below):

* **the tokens**: the micro-batch's sequences are packed back to back in one row (:mod:`mmrl.model.packing`, the
  padding-free layout), the row padded at its end to a multiple of ``n`` (the padding is a segment of its own,
  attends to itself only and is never a target), and rank ``r`` holds the row's ``r``-th contiguous slice of tokens
  through the embedding, every decoder layer's projections and MLP, and the LM head;
* **M-RoPE positions** are computed for the whole packed row before the split (:func:`mmrl.model.inputs.position_ids`,
  the pre-training rule) and each rank takes its slice: a rank in the middle of a video gets the video's own
  positions, not positions restarted at its slice;
* **attention** is exchanged with an all-to-all over heads (:class:`_AllToAll`, called from mmrl's attention
  function, :func:`mmrl.model.varlen.attention`, which the model hands the ``mmrl_sequence_group`` keyword to):
  before it each rank holds its tokens of every head, after it every token of ``heads / n`` heads; attention
  then runs over the whole packed row (its segments' ``cu_seqlens`` are the whole row's) and the reverse
  all-to-all brings each rank its tokens back. Key/value heads fewer than the group (grouped-query attention,
  e.g. the tiny models' 2 key heads on 4 ranks) are repeated first, as verl does, so that each rank's query
  heads keep their own key head;
* **the vision tower** runs on whole frames (temporal patches) split contiguously over the group: a video's
  frames never attend to each other in the Qwen-VL towers (window and full attention are within a frame; the
  merger is within a frame), so the split is exact; each rank encodes its frames and the merged embeddings (and
  Qwen3-VL's deepstack features) are gathered over the group (:func:`gather_summed`, whose backward sums the
  group's gradients and keeps a rank's own rows), then each rank takes the embeddings of the placeholders in its
  slice;
* **the log-probs** of the targets in a rank's slice go through the chunked LM head on that rank
  (:func:`mmrl.model.logprob_head.token_logprobs`) and are gathered over the group (:func:`gather_shared`):
  every rank holds the whole ``(B, L)`` log-probs, so the loss, its token counts (a sequence's whole count, as
  ``seq-mean-token-mean`` needs) and the KL are computed exactly as in one process, on every rank of the group
  alike; the gather's backward hands each rank the gradient of its own targets only (every rank computes the
  same loss, so one copy of each gradient reaches the parameters), and the gradient sum over ranks that data
  parallelism makes anyway adds the group's partial gradients into the one-process gradient. The trainer counts
  a group's statistics once (its first rank's).

Why Ulysses and not ring attention: mmrl already makes one variable-length attention call per layer over a packed
row (:mod:`mmrl.model.varlen`); after the all-to-all that call is unchanged (whole sequences, a subset of heads),
so packing, the causal segments and the shared-prefix key index keep working, with two all-to-alls per layer
whose volume does not grow with the group. Ring attention would need a blockwise online-softmax kernel of its own
with causal load balancing, and ``n - 1`` exchanges of keys and values per layer. The cost: the group cannot be
larger than the number of heads (Qwen2.5-VL-7B: 28 query heads, 4 key heads, repeated).

What is not split: generation (the rollout) runs whole on each rank of a group (the group rolls out the same
prompts with the same seeds, one copy kept: :meth:`mmrl.engine.trainer.GRPOTrainer.rollout_prompts`); a media
item whose features are cached (a frozen tower) is not encoded again. The shared-prefix passes are not used under
sequence parallelism (each sequence runs whole in the packed row: exact, more tokens).

**Qwen3.5's Gated DeltaNet (linear-attention) layers** carry a recurrent state and a short causal convolution
along the sequence, so a rank's slice depends on every token before it in its sequence, and the packed row's
sequences must each start from a zero state. Each such layer's forward is wrapped (:func:`install_linear_attention`,
active only in a pass that hands the layers ``mmrl_sequence_group``, so an unsplit pass and a checkpointed layer's
recompute in the backward see the same forward): the layer's input is all-gathered along the sequence
(:func:`gather_summed`: the backward sums the group's gradients of the whole row and keeps this rank's slice, a
reduce-scatter), the layer's own forward runs once per segment of the row (each sequence alone from a zero state,
as the padded one-process pass runs it; the row's padding is a segment of its own) and this rank keeps its slice
of the outputs. Each rank's backward covers its own slice's outputs only, so the sum of the ranks' parameter
gradients is the one-process gradient, as for the other layers. **The cost**: these layers hold the whole
sequence on every rank of the group (no memory saving in them: the gathered input and each segment's
activations are whole) and every rank repeats their compute (every rank makes the same calls, as ZeRO-3's
per-module gathers need); the full-attention layers (the Ulysses all-to-all above), the MLPs of every layer, the
embedding and the LM head are split. Passing the recurrent and convolution states along the group in rank order
instead would split these layers too, but serialises the ranks (rank ``r`` waits for every rank before it) and
needs the delta rule to start from a given state with a gradient through that state; not done.

Learned from (read, not copied): verl ``verl/utils/ulysses.py`` (the all-to-all autograd pair, gathering outputs
and the padding to a multiple of the group) and ``verl/models/transformers/monkey_patch.py`` (repeating key/value
heads when they are fewer than the group; slicing position ids after computing them whole); DeepSpeed
``deepspeed/sequence/layer.py`` (``DistributedAttention``: scatter heads, gather sequence, attend, reverse);
ms-swift ``swift/trainers/sequence_parallel/ulysses.py`` (splitting the inputs after the vision embeddings are
merged, and the loss reduced over the group); transformers ``models/qwen3_5/modeling_qwen3_5.py``
(``Qwen3_5GatedDeltaNet.forward``: its torch delta rule and convolution take no sequence boundaries, hence one call
per segment).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mmrl_common.errors import ConfigError

from . import inputs, passes, recurrent, varlen
from .logprob_head import token_logprobs
from .types import PolicyParts, TokenSeq


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's sequence-parallel group: ``rank`` within it, its ``size`` and the torch process group
    (``group``: None only for a group of one)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def active(self) -> bool:
        return self.size > 1

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attend: Any) -> torch.Tensor:
        """:func:`attention` over this group (what :func:`mmrl.model.varlen.attention` calls)."""
        return attention(module, query, key, value, self, attend)

    def slice(self, width: int) -> slice:
        """This rank's contiguous slice of a row of ``width`` tokens (``width`` a multiple of the size)."""
        part = width // self.size
        return slice(self.rank * part, (self.rank + 1) * part)


# ------------------------------------------------------------------------------------------------ collectives
def _all_to_all(x: torch.Tensor, group: SequenceGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    parts = [p.contiguous() for p in x.chunk(group.size, dim=scatter_dim)]
    out = [torch.empty_like(parts[0]) for _ in range(group.size)]
    torch.distributed.all_to_all(out, parts, group=group.group)
    return torch.cat(out, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Scatter ``x`` over the group along ``scatter_dim`` and gather the pieces along ``gather_dim``; the
    backward is the reverse all-to-all (the gradient goes back where each piece came from)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SequenceGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), ctx.group, gather_dim, scatter_dim), None, None, None


def _gather_rows(x: torch.Tensor, group: SequenceGroup, counts: Sequence[int]) -> torch.Tensor:
    """Every rank's rows (rank ``r`` holds ``counts[r]``), concatenated in rank order (padded to the most for the
    collective, which takes equal shapes)."""
    most = max(counts)
    padded = x if x.shape[0] == most else torch.cat([x, x.new_zeros(most - x.shape[0], *x.shape[1:])])
    out = [torch.empty_like(padded) for _ in range(group.size)]
    torch.distributed.all_gather(out, padded.contiguous(), group=group.group)
    return torch.cat([o[:n] for o, n in zip(out, counts)])


class _GatherRows(torch.autograd.Function):
    """All-gather of row blocks of different sizes. ``summed`` (:func:`gather_summed`): each rank used other ranks'
    rows too (the vision embeddings of the placeholders in its own token slice), so the backward sums the gradient
    over the group and keeps this rank's rows; otherwise (:func:`gather_shared`) every rank uses the result alike
    (the log-probs, from which each rank computes the same loss) and the backward keeps this rank's rows of the
    gradient, unsummed: one copy of the loss's gradient reaches each rank's share."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SequenceGroup, counts: list[int], summed: bool) -> torch.Tensor:
        ctx.group, ctx.counts, ctx.summed = group, counts, summed
        return _gather_rows(x, group, counts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.summed:
            grad = grad.contiguous().clone()
            torch.distributed.all_reduce(grad, group=ctx.group.group)
        start = sum(ctx.counts[:ctx.group.rank])
        return grad[start:start + ctx.counts[ctx.group.rank]].contiguous(), None, None, None


def gather_summed(x: torch.Tensor, group: SequenceGroup, counts: list[int]) -> torch.Tensor:
    """The group's row blocks gathered; the backward sums the gradient over the group (:class:`_GatherRows`)."""
    return _GatherRows.apply(x, group, counts, True)


def gather_shared(x: torch.Tensor, group: SequenceGroup, counts: list[int]) -> torch.Tensor:
    """The group's row blocks gathered, used alike by every rank; the backward keeps this rank's rows
    (:class:`_GatherRows`)."""
    return _GatherRows.apply(x, group, counts, False)


def _counts(n: int, group: SequenceGroup) -> list[int]:
    """Every rank's ``n`` (a small all-gather)."""
    t = torch.tensor([int(n)], dtype=torch.int64)
    out = [torch.empty_like(t) for _ in range(group.size)]
    torch.distributed.all_gather(out, t, group=group.group)
    return [int(o) for o in out]


# ------------------------------------------------------------------------------------------------ attention
def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              group: SequenceGroup, attend: Any) -> torch.Tensor:
    """Ulysses attention of this rank's token slice: ``query`` ``(1, heads, tokens / n, dim)``, keys and values
    ``(1, kv_heads, tokens / n, dim)``; ``attend(q, k, v)`` computes attention over the whole row for a subset of
    heads and returns ``(1, tokens, heads', dim)``. Returns ``(1, tokens / n, heads, dim)``."""
    n = group.size
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % n:
        raise ConfigError(f"train.sequence_parallel_size={n}: the language model's {heads} attention heads do not "
                          f"divide over {n} ranks (Ulysses gives each rank heads / n); use a size that divides {heads}")
    if kv_heads % n:  # fewer (or unevenly many) key heads: repeat each so that every rank gets its queries' own
        rep = n // math.gcd(kv_heads, n)
        if heads % (kv_heads * rep):
            raise ConfigError(f"train.sequence_parallel_size={n}: {kv_heads} key/value heads cannot be repeated to "
                              f"a multiple of {n} that divides the {heads} query heads; use a size that divides "
                              f"{math.gcd(heads, kv_heads)}")
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    # (1, heads, tokens/n, dim) -> (1, heads/n, tokens, dim): scatter the heads, gather the tokens
    q, k, v = (_AllToAll.apply(t, group, 1, 2) for t in (query, key, value))
    out = attend(q, k, v)  # (1, tokens, heads/n, dim)
    # back: scatter the tokens, gather the heads
    return _AllToAll.apply(out, group, 1, 2)


# ------------------------------------------------------------------------------------------------ checks
def check_policy(policy: PolicyParts, size: int) -> None:
    """A :class:`ConfigError` when ``policy`` cannot run sequence-parallel passes over ``size`` ranks."""
    if size <= 1:
        return
    impl = getattr(policy.base.language_model.config, "_attn_implementation", None)
    if impl != varlen.NAME:
        raise ConfigError(
            f"train.sequence_parallel_size={size} needs model.attn_implementation=varlen (the Ulysses all-to-all "
            f"is in mmrl's variable-length attention function), not {impl!r}")
    heads = int(policy.base.language_model.config.num_attention_heads)
    if heads % size:
        raise ConfigError(f"train.sequence_parallel_size={size}: the language model's {heads} attention heads do "
                          f"not divide over {size} ranks; use a size that divides {heads}")


# ------------------------------------------------------------------------------------------------ linear attention
class SegmentedLinearAttention:
    """A Gated DeltaNet module's forward (:func:`install_linear_attention`): the module's own ``forward`` as it
    is, unless the call carries an active ``mmrl_sequence_group``; then :func:`linear_attention`. A plain object
    holding the module's bound forward (``copy.deepcopy`` of the model rebinds it to the copy)."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward

    def __call__(self, hidden_states: torch.Tensor, cache_params: Any = None, attention_mask: Any = None,
                 **kwargs: Any) -> torch.Tensor:
        group = kwargs.get("mmrl_sequence_group")
        if group is None or not group.active:
            return self.forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
        if cache_params is not None or attention_mask is not None:
            raise ValueError("a sequence-parallel linear-attention layer takes no cache and no 2-D mask (the "
                             "packed row's segments are its sequences)")
        return linear_attention(self.forward, hidden_states, group, kwargs.get("cu_seq_lens_q"))


def install_linear_attention(model: torch.nn.Module) -> int:
    """Wraps the forward of each Gated DeltaNet module of ``model`` (:class:`SegmentedLinearAttention`; once:
    an installed one is kept). Returns the number of linear-attention modules."""
    layers = recurrent.linear_layers(model)
    for module in layers:
        if not isinstance(module.__dict__.get("forward"), SegmentedLinearAttention):
            module.forward = SegmentedLinearAttention(module.forward)
    return len(layers)


def linear_attention(forward: Any, hidden: torch.Tensor, group: SequenceGroup,
                     cu_seq_lens: torch.Tensor | None) -> torch.Tensor:
    """A linear-attention layer (``forward``: the module's own) on this rank's slice ``hidden``
    ``(1, tokens / n, hidden)`` of a packed row whose segments are ``cu_seq_lens`` (the whole row's): the
    slices gathered (:func:`gather_summed`), one call per segment from a zero state, this rank's slice of the
    outputs (the module's note)."""
    if cu_seq_lens is None:
        raise ValueError("a sequence-parallel linear-attention layer needs the whole row's segment lengths "
                         "(cu_seq_lens_q)")
    part = hidden.shape[1]
    whole = gather_summed(hidden[0], group, [part] * group.size).unsqueeze(0)  # (1, tokens, hidden)
    bounds = [int(b) for b in cu_seq_lens.tolist()]
    if bounds[0] != 0 or bounds[-1] != whole.shape[1]:
        raise ValueError(f"the segment lengths cover tokens {bounds[0]}..{bounds[-1]} of a row of {whole.shape[1]}")
    out = torch.cat([forward(whole[:, a:b]) for a, b in itertools.pairwise(bounds) if b > a], dim=1)
    return out[:, group.slice(out.shape[1])]


# ------------------------------------------------------------------------------------------------ vision
def _frames(policy: PolicyParts, key: str) -> tuple[int, int, int]:
    t, h, w = (int(x) for x in policy.media[key].grid_thw.tolist())
    return t, h, w


def split_features(policy: PolicyParts, keys: Sequence[str], group: SequenceGroup
                   ) -> tuple[dict[str, tuple[torch.Tensor, list[torch.Tensor]]], torch.Tensor | None]:
    """Each unique key's (merged embeddings, deepstack features), the tower run on whole temporal patches split
    contiguously over the group and its outputs gathered (:func:`gather_summed`); cached features (a frozen
    tower's, :meth:`mmrl.model.vision.VisionEncoder.feature_tag`) are used as they are. Returns the features and an
    anchor (0 times a dummy tower output) for a rank with no frame to encode under a rank binding, else None."""
    vision = policy.vision
    tag = vision.feature_tag()
    feats: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    todo: list[str] = []
    for key in dict.fromkeys(keys):
        cached = policy.media[key].features.get(tag) if tag is not None else None
        if cached is not None:
            feats[key] = cached
        else:
            todo.append(key)
    if not todo:
        return feats, (vision.dummy_tower() if policy.binding.invariant else None)
    merge = int(getattr(policy.base.visual.config, "spatial_merge_size", 2))
    units = [(key, t) for key in todo for t in range(_frames(policy, key)[0])]  # every temporal patch, in order
    per_unit = [_frames(policy, k)[1] * _frames(policy, k)[2] // merge ** 2 for k, _ in units]
    shares = [range(*_share(len(units), group.size, r)) for r in range(group.size)]
    counts = [sum(per_unit[i] for i in s) for s in shares]
    mine = [units[i] for i in shares[group.rank]]
    anchor = None
    dev = policy.device
    if mine:
        pixels, grids = [], []
        for key, run in itertools.groupby(mine, key=lambda u: u[0]):
            ts = [t for _, t in run]
            _, h, w = _frames(policy, key)
            pv = policy.media[key].pixel_values
            pixels.append(pv[ts[0] * h * w:(ts[-1] + 1) * h * w])
            grids.append(torch.tensor([len(ts), h, w]))
        out = policy.base.get_image_features(torch.cat(pixels).to(dev), torch.stack(grids).to(dev), return_dict=True)
        deep = getattr(out, "deepstack_features", None) or []
        local = torch.cat([torch.cat(list(out.pooler_output)), *(torch.cat(list(d)) for d in deep)], dim=-1)
        n_deep = len(deep)
    else:  # no frame here: the tower still runs where the ranks must make the same calls
        if policy.binding.invariant:
            anchor = vision.dummy_tower()
        n_deep = len(getattr(policy.base.visual, "deepstack_visual_indexes", None) or []) \
            if policy.base.config.model_type.startswith("qwen3_vl") else 0
        width = int(policy.base.language_model.config.hidden_size)
        param = next(policy.base.visual.parameters())
        local = torch.zeros(0, width * (1 + n_deep), dtype=param.dtype, device=dev)
    full = gather_summed(local, group, counts)
    if hasattr(policy.media, "count_vision_calls"):
        policy.media.count_vision_calls(len(todo))
    pieces = full.split([n * _frames(policy, k)[0] for k in todo
                         for n in [_frames(policy, k)[1] * _frames(policy, k)[2] // merge ** 2]])
    for key, piece in zip(todo, pieces):
        parts = piece.chunk(1 + n_deep, dim=-1) if n_deep else (piece,)
        embeds, deep_parts = parts[0], list(parts[1:])
        feats[key] = (embeds, deep_parts)
        if tag is not None:
            m = policy.media[key]
            if tag[0] == "live":
                for stale in [t for t in m.features if t[0] == "live" and t[1] == tag[1]]:
                    del m.features[stale]
            m.features[tag] = (embeds.detach(), [d.detach() for d in deep_parts])
    return feats, anchor


def _share(n: int, size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _encoder_outputs(policy: PolicyParts, seqs: Sequence[TokenSeq], ids: torch.Tensor, where: slice,
                     feats: dict[str, tuple[torch.Tensor, list[torch.Tensor]]]) -> dict[str, Any]:
    """``mm_encoder_outputs`` for the placeholders of the packed row ``ids`` that lie in this rank's slice
    ``where``: per kind, the whole row's embeddings in placeholder order, then the rows of this slice."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    outputs: dict[str, Any] = {}
    for name, token in (("image", policy.image_token_id), ("video", policy.video_token_id)):
        keys = [k for s in seqs for k in s.media if policy.media[k].kind == name]
        if not keys:
            continue
        is_tok = ids == token
        before, inside = int(is_tok[:where.start].sum()), int(is_tok[where].sum())
        embeds = torch.cat([feats[k][0] for k in keys])[before:before + inside]
        out = BaseModelOutputWithPooling(pooler_output=(embeds,))
        if feats[keys[0]][1]:
            layers = len(feats[keys[0]][1])
            out["deepstack_features"] = [
                (torch.cat([feats[k][1][i] for k in keys])[before:before + inside],) for i in range(layers)]
        outputs[name] = out
    return outputs


# ------------------------------------------------------------------------------------------------ the pass
def forward_logprobs(policy: PolicyParts, seqs: Sequence[TokenSeq], group: SequenceGroup, *,
                     temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True,
                     chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`mmrl.model.logprobs.forward_logprobs` with the tokens spread over ``group`` (the module's note):
    ``(logps, entropies, mask)``, each ``(B, L)`` and whole on every rank of the group."""
    check_policy(policy, group.size)
    install_linear_attention(policy.base.language_model)  # Qwen3.5's Gated DeltaNet layers; none elsewhere
    dev = policy.device
    batch = inputs.pad(seqs, left=False, pad_id=policy.pad_id, device=dev)
    position_ids = inputs.position_ids(policy, batch, seqs)  # the whole sequences' positions, before the split
    mask = batch["loss_mask"].clone()
    mask[:, 0] = 0
    rows, cols = mask.nonzero(as_tuple=True)
    lengths = [len(s) for s in seqs]
    packed = passes.pack(policy, batch, position_ids, range(len(seqs)), lengths, varlen.NAME)
    assert packed.order == list(range(len(seqs)))  # one row, in order (the targets' order below relies on it)
    width = packed.width
    full = -(-width // group.size) * group.size
    pad = full - width
    ids, types, pos = packed.input_ids, packed.mm_token_type_ids, packed.position_ids
    if pad:  # the row's tail: pad tokens with text positions after the row's, a segment of their own
        ids = torch.cat([ids, ids.new_full((1, pad), policy.pad_id)], dim=1)
        types = torch.cat([types, types.new_zeros(1, pad)], dim=1)
        tail = torch.arange(pad, device=pos.device, dtype=pos.dtype).view(1, 1, pad).expand(4, 1, pad)
        pos = torch.cat([pos, tail], dim=2)
    kw = packed.model_kwargs(varlen.NAME, passes.compute_dtype(policy))
    if pad:
        cu = kw["cu_seq_lens_q"]
        cu = torch.cat([cu, cu.new_tensor([full])])
        kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(kw["max_length_q"], pad),
                  max_length_k=max(kw["max_length_k"], pad))
    where = group.slice(full)
    feats, anchor = split_features(policy, [k for s in seqs for k in s.media], group)
    encoder_outputs = _encoder_outputs(policy, seqs, ids[0], where, feats)
    out = policy.base(input_ids=ids[:, where], position_ids=pos[:, :, where], mm_token_type_ids=types[:, where],
                      mm_encoder_outputs=encoder_outputs or None, use_cache=False, mmrl_sequence_group=group, **kw)
    hidden = out.last_hidden_state[0]  # (tokens / n, hidden)
    # the targets whose predicting token (the one before) lies in this slice: a contiguous run of the row-major
    # targets, since the sequences lie in the row in order
    flat = packed.flat_index(rows, cols - 1)
    here = (flat >= where.start) & (flat < where.stop)
    hidden_rows = hidden[flat[here] - where.start]
    if anchor is not None:
        hidden_rows = hidden_rows + anchor
    opts = policy.options
    chunk = (opts.logprob_chunk_tokens if chunk_tokens is None else chunk_tokens) or 0
    calls = policy.binding.max_int(-(-int(here.sum()) // chunk)) if policy.binding.invariant and chunk > 0 else 0
    recompute = policy.binding.gather_params is None or any(
        p.requires_grad for p in policy.model.lm_head.parameters())
    lp, ent = token_logprobs(policy.model.lm_head, hidden_rows, batch["input_ids"][rows[here], cols[here]],
                             temperature, with_entropy=with_entropy, entropy_grad=entropy_grad, chunk=chunk,
                             calls=calls, recompute=recompute)
    counts = _counts(int(lp.shape[0]), group)
    lp = gather_shared(lp, group, counts)
    logps = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), lp)
    entropies = None
    if ent is not None:
        ent = gather_shared(ent, group, counts) if ent.requires_grad else _gather_rows(ent, group, counts)
        entropies = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), ent)
    return logps, entropies, mask
