"""The shared prefix: a group's prompt through the language model once in a log-prob pass.

Consecutive sequences with the same prompt (the tokens before the first trained one, and the same media) form a
group; the group's longest common token prefix, which must hold all its vision tokens, goes through the
language model once and the group's continuations attend to that one encoding. Two ways:

* two passes (:func:`two_pass_hidden`): the prefixes (recording each layer's keys and values), then the
  continuations reading them (:func:`prefix_caches`);
* one packed pass (:func:`one_pass_hidden`, sdpa/eager with padding-free passes, chosen by cost in
  :func:`use_one_pass`, or mmrl's variable-length attention, always): each prompt once, followed by its
  continuations, each of which sees the prompt and
  itself.

The results, and the gradients, which reach the prefix's computation once summed over the continuations, are
those of the padded batch within round-off.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from . import packing, passes, varlen
from .types import TEXT, PolicyParts, TokenSeq

Plan = list[tuple[list[int], int]]


def prefix_plan(seqs: Sequence[TokenSeq]) -> Plan | None:
    """Groups of consecutive rows with one prompt and media: ``[(rows, prefix length), ...]``, covering
    every row in order; a prefix length of 0 means the rows run whole (a group of one, no common prefix,
    vision tokens after the common prefix). None when no group shares a prefix."""
    def prompt_key(s: TokenSeq) -> tuple:
        first = s.loss_mask.index(1) if 1 in s.loss_mask else len(s)
        return tuple(s.ids[:first]), tuple(s.mm_types[:first]), tuple(s.media)

    groups: list[list[int]] = []
    last = None
    for i, s in enumerate(seqs):
        key = prompt_key(s)
        if groups and key == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        last = key
    plan: list[tuple[list[int], int]] = []
    for group in groups:
        n = 0
        if len(group) > 1:
            first = seqs[group[0]]
            n = min(len(seqs[i]) for i in group) - 1  # every row keeps a token after the prefix
            for i in group[1:]:
                s = seqs[i]
                k = 0
                while k < n and s.ids[k] == first.ids[k] and s.mm_types[k] == first.mm_types[k]:
                    k += 1
                n = k
            if any(t != TEXT for i in group for t in seqs[i].mm_types[n:]):
                n = 0  # vision tokens after the shared part: their features would be needed twice
        plan.append((group, n))
    if all(n == 0 for _, n in plan):
        return None
    return plan


def use_one_pass(policy: PolicyParts, plan: Plan, seqs: Sequence[TokenSeq]) -> bool:
    """Whether the shared prefix runs as one packed pass instead of two (:func:`two_pass_hidden`).

    Only with a masked attention (sdpa/eager) or mmrl's variable-length attention (whose key index lets a
    continuation see its prompt; flash attention's variable-length call cannot) and padding-free passes on,
    and never where every rank must make the same
    calls (ZeRO-3 gathers per call, and ranks may differ in whether they share a prefix). Two passes sum
    every weight's gradient from both (a parameter-sized add per weight, and a second call of every
    module); one pass computes each continuation's attention over its whole group's row, prompt and the
    other continuations included (masked, yet computed by sdpa/eager). By :func:`packing.row_cost`: one
    pass when its rows, all as wide as the widest group, cost no more than the two passes' tokens plus the
    extra pass's parameter-sized work (:attr:`PolicyOptions.second_pass_cost`;
    :attr:`PolicyOptions.shared_prefix_one_pass` forces the choice)."""
    impl = passes.packing_impl(policy)
    if policy.binding.invariant or (impl not in packing.MASKED and impl != varlen.NAME):
        return False
    if policy.options.shared_prefix_one_pass is not None:
        return policy.options.shared_prefix_one_pass
    if impl == varlen.NAME:  # each segment computes only its own keys (the prompt's and its own): always cheaper
        return True
    cost = passes.row_cost(policy)
    q = (cost(2) - 2 * cost(1)) / 4  # cost(w) = w * (P + 2 * w * q)
    params = cost(1) - 2 * q
    one_row = bool(policy.options.pack_one_row)

    def packed_price(lengths: list[int]) -> float:
        rows = packing.layout(lengths, one_row=one_row, cost=cost)
        return len(rows) * cost(max(sum(lengths[j] for j in r) for r in rows))

    lengths = [len(s) for s in seqs]
    one = packed_price([n + sum(lengths[i] - 1 - n for i in g) if n else lengths[i] - 1
                        for g, n in plan for i in (g[:1] if n else g)])
    prefixes = [n if n else lengths[i] for g, n in plan for i in (g[:1] if n else g)]
    rest = [lengths[i] - n for g, n in plan if n for i in g]
    width = max(rest)  # pass 2: padded continuations, each attending to the widest prefix and itself
    two = packed_price(prefixes) + len(rest) * width * (params + 2 * (max(prefixes) + width) * q)
    return one <= two + policy.options.second_pass_cost * params


def one_pass_hidden(policy: PolicyParts, seqs: Sequence[TokenSeq], batch: dict[str, torch.Tensor],
                     position_ids: torch.Tensor, plan: Plan,
                     rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Last hidden states at ``(rows, cols - 1)`` of the padded batch, from one packed pass: per group,
    its prompt (the shared prefix, with the vision features) once, then each row's continuation, which
    sees the prompt whole and its own earlier tokens (a 4-D mask, :func:`packing.pack` with parents), with
    its slice of the full sequence's positions; unshared rows whole. Each row's last token is left out
    (nothing reads its hidden state). The values and gradients are the padded batch's within round-off."""
    lengths = [len(s) for s in seqs]
    src: list[int] = []
    lens: list[int] = []
    offsets: list[int] = []
    parents: list[int] = []
    units: list[list[int]] = []
    item_pre = [0] * len(seqs)  # the packed item holding each row's first `split` tokens
    item_suf = [0] * len(seqs)  # the one holding the rest (but the last)
    split = [0] * len(seqs)

    def add(i: int, off: int, k: int, parent: int) -> int:
        src.append(i)
        offsets.append(off)
        lens.append(k)
        parents.append(parent)
        return len(src) - 1

    # a row's last token is left out: its hidden state would predict a token after the row
    for group, n in plan:
        if n == 0:
            for i in group:
                j = add(i, 0, max(lengths[i] - 1, 1), -1)
                item_pre[i] = item_suf[i] = j
                split[i] = lengths[i]
                units.append([j])
            continue
        p = add(group[0], 0, n, -1)
        unit = [p]
        for i in group:
            item_pre[i], split[i] = p, n
            if lengths[i] - 1 > n:  # else every hidden state it needs is the prompt's
                item_suf[i] = add(i, n, lengths[i] - 1 - n, p)
                unit.append(item_suf[i])
        units.append(unit)
    impl = passes.packing_impl(policy)
    packed = passes.pack(policy, batch, position_ids, src, lens, impl, offsets=offsets, parents=parents, units=units)
    # media: only prompts and unshared rows hold placeholders, in packed order
    media_seqs = [seqs[src[j]].head(lens[j]) for j in packed.order if parents[j] < 0]
    encoder_outputs, anchor = policy.vision.encoder_outputs(media_seqs)
    out = policy.base(input_ids=packed.input_ids, position_ids=packed.position_ids,
                    mm_token_type_ids=packed.mm_token_type_ids, mm_encoder_outputs=encoder_outputs or None,
                    use_cache=False, **packed.model_kwargs(impl, passes.compute_dtype(policy)))
    flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    dev = rows.device
    pos = cols - 1
    cut = torch.tensor(split, device=dev)[rows]
    first = pos < cut
    item = torch.where(first, torch.tensor(item_pre, device=dev)[rows], torch.tensor(item_suf, device=dev)[rows])
    hidden = flat[packed.flat_index(item, torch.where(first, pos, pos - cut))]
    return hidden + anchor if anchor is not None else hidden


def two_pass_hidden(policy: PolicyParts, seqs: Sequence[TokenSeq], batch: dict[str, torch.Tensor],
                          position_ids: torch.Tensor, plan: Plan,
                          rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Last hidden states at ``(rows, cols - 1)`` of the padded batch, each shared prefix run once.

    Pass 1 runs one row per shared group (its prefix, with the vision features) and every unshared row
    whole, right-padded together or, padding-free (:func:`passes.packing_impl`), packed back to back, recording
    each layer's keys and values. Pass 2 runs every shared row's continuation, right-padded, attending to
    its group's recorded keys and values (selected along the batch, or gathered out of the packed rows:
    their gradient sums over the group) and its own, with the continuation's slice of the full sequence's
    M-RoPE positions and a 2-D mask over the prefix (its padding excluded) and the continuation. Under
    sdpa/eager pass 2 stays padded: its continuations read different prefixes, which a packed row cannot express
    with one block-diagonal mask. Under mmrl's variable-length attention it is packed as well
    (:func:`_packed_second_pass`): each continuation a segment whose keys are its prefix's and its own (flash
    attention's kernel would take the same arguments, but transformers' flash path is not tested here: it stays
    padded).
    """
    recorder_cls, reader_cls = prefix_caches()
    dev = batch["input_ids"].device
    lengths = [len(s) for s in seqs]
    pre_src: list[int] = []  # source row of each pass-1 row
    pre_len: list[int] = []
    suf_src: list[int] = []  # source row of each pass-2 row
    suf_pre: list[int] = []  # its pass-1 row
    row_pre = [0] * len(seqs)  # pass-1 row of each source row
    row_suf = [-1] * len(seqs)  # pass-2 row (-1: none)
    row_split = [0] * len(seqs)  # tokens of the row computed in pass 1
    for group, n in plan:
        if n == 0:
            for i in group:
                row_pre[i], row_split[i] = len(pre_src), lengths[i]
                pre_src.append(i)
                pre_len.append(lengths[i])
            continue
        p = len(pre_src)
        pre_src.append(group[0])
        pre_len.append(n)
        for i in group:
            row_pre[i], row_split[i], row_suf[i] = p, n, len(suf_src)
            suf_src.append(i)
            suf_pre.append(p)
    width = max(pre_len)
    src = torch.tensor(pre_src, device=dev)
    keep = torch.arange(width, device=dev)[None, :] < torch.tensor(pre_len, device=dev)[:, None]
    pre_attn = keep.long()
    pre_seqs = [seqs[i].head(k) for i, k in zip(pre_src, pre_len)]
    impl = passes.packing_impl(policy)
    packed = None
    if impl is not None:  # padding-free pass 1: the prefixes and unshared rows back to back
        packed = passes.pack(policy, batch, position_ids, pre_src, pre_len, impl)
        encoder_outputs, anchor = policy.vision.encoder_outputs([pre_seqs[j] for j in packed.order])
        inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
                  "mm_token_type_ids": packed.mm_token_type_ids,
                  **packed.model_kwargs(impl, passes.compute_dtype(policy))}
    else:
        encoder_outputs, anchor = policy.vision.encoder_outputs(pre_seqs)
        inputs = {"input_ids": batch["input_ids"][src, :width].masked_fill(~keep, policy.pad_id),
                  "attention_mask": pre_attn, "position_ids": position_ids[:, src, :width] * keep,
                  "mm_token_type_ids": batch["mm_token_type_ids"][src, :width] * keep}
    recorded = recorder_cls()
    second_pass = bool(suf_src) or policy.binding.invariant  # rank-invariant: pass 2 runs on every rank
    with _cache_under_checkpointing(policy):
        out = policy.base(**inputs, mm_encoder_outputs=encoder_outputs or None,
                        past_key_values=recorded if second_pass else None, use_cache=False)
    pre_hidden = out.last_hidden_state
    if anchor is not None:
        pre_hidden = pre_hidden + anchor
    # where each (row, col - 1) lies: in pass 1's rows or in pass 2's
    pos = cols - 1
    split = torch.tensor(row_split, device=dev)[rows]
    in_pre = pos < split
    pre_row = torch.tensor(row_pre, device=dev)[rows]
    if packed is not None:
        pre_index = packed.flat_index(pre_row, pos.clamp(max=split - 1))
        rec_width = packed.width
        # pass 2 reads each group's prefix out of the packed rows, into a padded (prefix, width) layout
        last = packed.start + packed.start.new_tensor(pre_len) - 1
        prefix_cols = (packed.start[:, None] + torch.arange(width, device=dev)[None, :]).minimum(last[:, None])
    else:
        pre_index = pre_row * width + pos
        rec_width, prefix_cols = width, None
    if not suf_src:
        hidden = pre_hidden.reshape(-1, pre_hidden.shape[-1])[pre_index]
        if second_pass:  # a one-token dummy continuation, attending to nothing of pass 1's
            owner = torch.zeros(1, dtype=torch.long, device=dev)
            attn = torch.cat([pre_attn.new_zeros(1, rec_width),
                              torch.ones(1, 1, dtype=pre_attn.dtype, device=dev)], dim=1)
            with _cache_under_checkpointing(policy):
                dummy = policy.base(input_ids=torch.full((1, 1), policy.pad_id, device=dev), attention_mask=attn,
                                  position_ids=position_ids[:, :1, :1] * 0,
                                  mm_token_type_ids=torch.zeros(1, 1, dtype=torch.long, device=dev),
                                  past_key_values=reader_cls(recorded, owner), use_cache=False)
            hidden = hidden + dummy.last_hidden_state.sum() * 0.0
        return hidden
    if packed is not None and impl == varlen.NAME:  # mmrl's variable-length attention: pass 2 packed too
        suf_hidden, suf_index = _packed_second_pass(policy, batch, position_ids, recorded, reader_cls, packed,
                                                    suf_src, suf_pre, row_split, lengths, pre_len)
        suf_index = suf_index[rows] + (pos - split).clamp(min=0)
    else:
        suf_hidden, suf_index = _padded_second_pass(policy, batch, position_ids, recorded, reader_cls, packed,
                                                    prefix_cols, pre_attn, suf_src, suf_pre, row_split, lengths)
        suf_index = suf_index[rows] + (pos - split).clamp(min=0)
    # gather each pass's rows, then put them back in (rows, cols) order
    first, second = in_pre.nonzero().squeeze(-1), (~in_pre).nonzero().squeeze(-1)
    gathered = torch.cat([pre_hidden.reshape(-1, pre_hidden.shape[-1])[pre_index[first]],
                          suf_hidden.reshape(-1, suf_hidden.shape[-1])[suf_index[second]]])
    return gathered[torch.cat([first, second]).argsort()]


def _padded_second_pass(policy: PolicyParts, batch: dict[str, torch.Tensor], position_ids: torch.Tensor,
                        recorded: Any, reader_cls: type, packed: packing.Packed | None, prefix_cols: Any,
                        pre_attn: torch.Tensor, suf_src: list[int], suf_pre: list[int], row_split: list[int],
                        lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 2 right-padded: each continuation a row attending to its prefix (a 2-D mask over the recorded
    prefixes' width, their padding excluded) and itself. Returns the hidden states and, per source row, the flat
    index of its first continuation token in them (0 where it has none)."""
    dev = batch["input_ids"].device
    starts = torch.tensor([row_split[i] for i in suf_src], device=dev)
    ends = torch.tensor([lengths[i] for i in suf_src], device=dev)
    suf_width = int((ends - starts).max())
    take = starts[:, None] + torch.arange(suf_width, device=dev)[None, :]
    suf_attn = (take < ends[:, None]).long()
    take = take.clamp(max=batch["input_ids"].shape[1] - 1)
    sidx = torch.tensor(suf_src, device=dev)[:, None]
    suf_ids = batch["input_ids"][sidx, take].masked_fill(suf_attn == 0, policy.pad_id)
    suf_pos = position_ids[:, sidx, take] * suf_attn
    owner = torch.tensor(suf_pre, device=dev)
    attn = torch.cat([pre_attn[owner], suf_attn], dim=1)
    take = None if packed is None else (packed.row[owner][:, None], prefix_cols[owner])
    with _cache_under_checkpointing(policy):
        suf_out = policy.base(input_ids=suf_ids, attention_mask=attn, position_ids=suf_pos,
                            mm_token_type_ids=torch.zeros_like(suf_ids),
                            past_key_values=reader_cls(recorded, owner, take), use_cache=False)
    first_col = torch.zeros(len(lengths), dtype=torch.long, device=dev)
    first_col[torch.tensor(suf_src, device=dev)] = torch.arange(len(suf_src), device=dev) * suf_width
    return suf_out.last_hidden_state, first_col


def _packed_second_pass(policy: PolicyParts, batch: dict[str, torch.Tensor], position_ids: torch.Tensor,
                        recorded: Any, reader_cls: type, packed: packing.Packed,
                        suf_src: list[int], suf_pre: list[int], row_split: list[int], lengths: list[int],
                        pre_len: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 2 packed in one row, no padding, for mmrl's variable-length attention (:mod:`mmrl.model.varlen`):
    continuation ``j`` is a segment whose queries are its own tokens and whose keys are its prefix's recorded
    keys (gathered out of pass 1's packed row) followed by its own, causal from the end of the keys
    (``cu_seq_lens_q`` != ``cu_seq_lens_k``). Returns the hidden states and, per source row, the flat index of its
    first continuation token in them (0 where it has none)."""
    dev = batch["input_ids"].device
    n_pre = [row_split[i] for i in suf_src]
    own = [lengths[i] - row_split[i] for i in suf_src]
    cont = packing.pack(batch["input_ids"], batch["mm_token_type_ids"], position_ids, suf_src, own, one_row=True,
                        pad_id=policy.pad_id, offsets=n_pre)
    assert cont.order == list(range(len(suf_src)))  # one row, in order
    # keys of segment j: its prefix's columns in pass 1's row, then its own columns in pass 2's (after them)
    width1 = packed.width
    parts: list[torch.Tensor] = []
    for j, (p, k) in enumerate(zip(suf_pre, own)):
        start = int(packed.start[p])
        parts.append(torch.arange(start, start + pre_len[p], device=dev))
        parts.append(width1 + int(cont.start[j]) + torch.arange(k, device=dev))
    keys = torch.cat(parts)
    lens_q = torch.tensor(own, dtype=torch.int32, device=dev)
    lens_k = lens_q + torch.tensor([pre_len[p] for p in suf_pre], dtype=torch.int32, device=dev)
    kwargs = {"attention_mask": None, "max_length_q": max(own), "max_length_k": int(lens_k.max()),
              "cu_seq_lens_q": torch.cat([lens_q.new_zeros(1), lens_q.cumsum(0, dtype=torch.int32)]),
              "cu_seq_lens_k": torch.cat([lens_k.new_zeros(1), lens_k.cumsum(0, dtype=torch.int32)])}
    with _cache_under_checkpointing(policy):
        out = policy.base(input_ids=cont.input_ids, position_ids=cont.position_ids,
                          mm_token_type_ids=torch.zeros_like(cont.input_ids),
                          past_key_values=reader_cls(recorded, None, keys=keys), use_cache=False, **kwargs)
    first_col = torch.zeros(len(lengths), dtype=torch.long, device=dev)
    first_col[torch.tensor(suf_src, device=dev)] = cont.start
    return out.last_hidden_state, first_col


@contextlib.contextmanager
def _cache_under_checkpointing(policy: PolicyParts) -> Iterator[None]:
    """Let checkpointed decoder layers keep the shared-prefix caches (HF drops any cache there, since its
    own caches grow again when a layer is recomputed in backward; :func:`prefix_caches` do not)."""
    layers = [m for m in policy.base.language_model.modules()
              if getattr(m, "gradient_checkpointing", False) is True and "_can_checkpoint_with_cache" not in vars(m)]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache


@functools.cache
def prefix_caches() -> tuple[type, type]:
    """The two KV caches of the shared-prefix forward (classes built on first use: transformers is imported
    lazily). Neither changes after a layer has written to it, so a layer recomputed in backward (activation
    checkpointing) sees what it saw in forward.

    * the recorder (pass 1) keeps each layer's first keys and values (its prefix rows) and returns them as
      they are; a recomputation's second write is ignored;
    * the reader (pass 2) returns, per layer, the recorded rows selected for each continuation (``owner``;
      after a packed pass 1, its prefix's tokens gathered out of the packed rows by ``take``) followed by the
      continuation's own keys and values, and stores nothing.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    class Recorder(DynamicCache):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            while len(self.layers) <= layer_idx:
                self.layers.append(DynamicLayer())
            layer = self.layers[layer_idx]
            if not layer.is_initialized:
                layer.lazy_initialization(key_states, value_states)
                layer.keys, layer.values = key_states, value_states
            return key_states, value_states

    class Reader(DynamicCache):
        def __init__(self, recorded: DynamicCache, owner: torch.Tensor | None,
                     take: tuple[torch.Tensor, torch.Tensor] | None = None, keys: torch.Tensor | None = None) -> None:
            super().__init__()
            self.layers = list(recorded.layers)
            self.owner = owner
            # packed pass 1: each continuation's packed row (n, 1) and its prefix's columns there (n, width)
            self.take = take
            # packed pass 2 (variable-length attention): the key columns of pass 1's row followed by pass 2's
            # row, in the order the segments' keys are laid out
            self.keys = keys

        def _rows(self, t: torch.Tensor) -> torch.Tensor:
            if self.take is None:
                return t.index_select(0, self.owner)
            row, col = self.take  # (rows, heads, width, dim)[row, :, col] is (n, width, heads, dim)
            return t[row, :, col].transpose(1, 2)

        # the length the attention mask is built for: the recorded width, or the gathered prefixes' width
        def get_seq_length(self, layer_idx: int = 0) -> int:
            return super().get_seq_length(layer_idx) if self.take is None else int(self.take[1].shape[1])

        def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
            if self.take is None:
                return super().get_mask_sizes(query_length, layer_idx)
            return int(self.take[1].shape[1]) + query_length, 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            layer = self.layers[layer_idx]
            if self.keys is not None:  # (1, heads, width1 + width2, dim), then each segment's keys in order
                return (torch.cat([layer.keys, key_states], dim=-2).index_select(-2, self.keys),
                        torch.cat([layer.values, value_states], dim=-2).index_select(-2, self.keys))
            return (torch.cat([self._rows(layer.keys), key_states], dim=-2),
                    torch.cat([self._rows(layer.values), value_states], dim=-2))

    return Recorder, Reader


