"""Padding-free forward passes and micro-batches by a token budget.

**Packing.** The sequences of one forward pass go into as few rows as possible, back to back, with no padding
between them. Every sequence keeps its own positions (for the Qwen-VL models the ``(3, L)`` M-RoPE positions
of the padded batch, which equal the ones the model computes for the sequence alone) and attends only to its
own earlier tokens. How the attention is confined to each sequence depends on the attention implementation:

* **flash attention** (``flash_attention_2``/``_3``, GPU, or mmrl's variable-length attention,
  :mod:`mmrl.model.varlen`, on any device): all sequences in **one** row and no mask; the
  decoder layers receive ``cu_seq_lens_q/k`` and ``max_length_q/k`` (transformers'
  ``FlashAttentionKwargs``), so ``_flash_attention_forward`` runs ``flash_attn_varlen_func`` over the
  sequences directly. The text position row (the first of four, the layout transformers' Qwen-VL text models
  read as ``text_position_ids``) restarts at 0 per sequence, which is also what transformers falls back on
  (``_is_packed_sequence`` / ``prepare_fa_kwargs_from_position_ids``) when the lengths are not passed. This
  is the layout of TRL's ``padding_free`` and verl's ``use_remove_padding`` (``input_ids`` of shape
  ``(1, total)``, ``attention_mask=None``, M-RoPE ``position_ids`` of shape ``(3, 1, total)``).
* **sdpa / eager** (CPU): a block-diagonal causal 4-D mask (boolean for sdpa, additive for eager), which
  transformers passes through as it is. These kernels compute the masked blocks too, so one long row would
  trade the padding's linear-layer work for quadratic attention work; the sequences are filled first-fit by
  decreasing length into rows of the capacity (the longest length times 1, 2, 4, ...) whose rows cost least
  by the model's own sizes (:func:`row_cost`), with no larger a mask than the padded batch's: a tiny model
  gets rows about as long as the longest sequence, a 7B model, whose linear layers dominate up to tens of
  thousands of tokens, the fewest rows that mask allows. A row's unused tail is a segment of its own (each
  tail token sees itself), so no query row is fully masked.

Either way the log-probs and gradients equal the padded batch's within fp32 round-off.

**Token budget.** :func:`token_budget_chunks` splits rows, in order, into micro-batches whose lengths sum to
at most a budget (a longer row alone): the cost of a padding-free pass is about its token count.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import varlen

FLASH = ("flash_attention_2", "flash_attention_3", varlen.NAME)
MASKED = ("sdpa", "eager")


def token_budget_chunks(rows: Sequence[int], lengths: Sequence[int], budget: int,
                        groups: Sequence[int] | None = None,
                        prefixes: Sequence[int] | None = None) -> list[list[int]]:
    """Consecutive runs of ``rows`` (order kept): a row joins the current micro-batch while the micro-batch's
    tokens stay within ``budget``; a row longer than the budget is a micro-batch alone.

    ``groups`` (each row's group id): a group is kept whole in one micro-batch wherever it fits the budget
    (the shared-prefix pass reads a group's prompt once only when its rows meet): a group that does not fit
    beside the current micro-batch starts the next one; a group longer than the whole budget is cut by rows
    as above.

    ``prefixes`` (with ``groups``: each row's shared prefix, the tokens of its group's common prompt that the
    shared-prefix pass computes once for the group's rows that meet in a micro-batch; 0: the row runs whole):
    a micro-batch's tokens are then what its pass computes, each group's prefix once plus every row's tokens
    after it, instead of every row's whole length (an 8-row group of 4.2k-token prompts and 512-token answers
    is ~8.3k tokens, not ~38k). Without them every row counts whole."""
    if budget <= 0:
        raise ValueError(f"token budget must be > 0, got {budget}")
    if prefixes is not None and groups is None:
        raise ValueError("token_budget_chunks: prefixes are shared within groups; pass groups too")
    lengths = list(lengths)
    pre = list(prefixes) if prefixes is not None else [0] * len(lengths)
    gid: list[Any] = list(groups) if groups is not None else [None] * len(lengths)
    out: list[list[int]] = []
    used = 0
    open_group: list[Any] = [None]  # the group of the current micro-batch's last row (its prefix is paid)

    def cost(n: int, p: int, g: Any) -> int:
        """Tokens a row adds to the current micro-batch: its own after the prefix where a row of its group
        is already there (the prefix computed once), else its whole length."""
        return n - p if g is not None and out and open_group[0] == g else n

    def add(r: int, n: int, p: int, g: Any) -> None:
        nonlocal used
        c = cost(n, p, g)
        if out and used + c <= budget:
            out[-1].append(r)
            used += c
        else:
            out.append([r])
            used = n
        open_group[0] = g

    if groups is None:
        for r, n in zip(rows, lengths, strict=True):
            add(r, n, 0, None)
        return out
    runs: list[tuple[Any, list[tuple[int, int, int]]]] = []  # (group, its consecutive (row, length, prefix))
    for r, n, p, g in zip(rows, lengths, pre, gid, strict=True):
        if not 0 <= p < max(n, 1):
            raise ValueError(f"row {r}: shared prefix {p} is not within its {n} tokens")
        if runs and runs[-1][0] == g:
            runs[-1][1].append((r, n, p))
        else:
            runs.append((g, [(r, n, p)]))
    for g, run in runs:
        total = run[0][1] + sum(n - p for _, n, p in run[1:])  # the group alone: its prefix once
        if out and used + cost(run[0][1], run[0][2], g) + total - run[0][1] > budget and total <= budget:
            out.append([])  # the group fits a micro-batch of its own: it starts one
            used = 0
            open_group[0] = None
        for r, n, p in run:
            add(r, n, p, g)
    return out


def attention_impl(model: torch.nn.Module) -> str | None:
    """The language model's attention implementation when packing is exact with it (flash attention: one
    row, the sequence lengths passed to the kernel; sdpa or eager: a block-diagonal 4-D mask), else None."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None)
    impl = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    return impl if impl in FLASH or impl in MASKED else None


@dataclass
class Packed:
    """One packed pass: the model inputs and where each sequence lies in them.

    ``row[j]``/``start[j]``: the packed row and first column of sequence ``j``; ``segments``: ``(R, W)`` the
    sequence index of each packed token (``-1 - r`` for row ``r``'s unused tail); ``order``: the sequences
    in packed (row-major) order, the order in which their media placeholders appear."""

    input_ids: torch.Tensor  # (R, W)
    mm_token_type_ids: torch.Tensor  # (R, W)
    position_ids: torch.Tensor  # (4, R, W): text positions, then the three M-RoPE axes
    segments: torch.Tensor  # (R, W)
    row: torch.Tensor  # (n,)
    start: torch.Tensor  # (n,)
    lengths: list[int]
    order: list[int]
    # parents[j]: the packed sequence whose tokens sequence j also sees, all of them (its prompt in a
    # one-pass shared prefix, :func:`pack` with ``parents``); -1: none
    parents: list[int] | None = None

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    def flat_index(self, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Index into the flattened ``(R * W)`` packed tokens of token ``pos`` of sequence ``seq``."""
        return self.row[seq] * self.width + self.start[seq] + pos

    def model_kwargs(self, impl: str, dtype: torch.dtype) -> dict[str, Any]:
        """The attention inputs for attention implementation ``impl``: the flash-attention variable-length
        arguments (one row), or a 4-D block-diagonal causal mask (boolean for sdpa, additive in ``dtype`` for
        eager)."""
        if impl in FLASH:
            if self.input_ids.shape[0] != 1:
                raise ValueError("flash-attention packing takes one row")
            dev = self.input_ids.device
            lens_q = [self.lengths[j] for j in self.order]
            cu = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device=dev)
            out = {"attention_mask": None, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                   "max_length_q": max(lens_q), "max_length_k": max(lens_q)}
            if self.parents is not None and any(p >= 0 for p in self.parents):
                if impl != varlen.NAME:
                    raise ValueError("flash attention's variable-length call cannot let a sequence see another's "
                                     "tokens")
                # each segment's keys: its parent's columns whole, then its own (mmrl.model.varlen's key index)
                start = dict(zip(self.order, itertools.accumulate([0, *lens_q[:-1]])))
                cols: list[range] = []
                lens_k: list[int] = []
                for j in self.order:
                    p = self.parents[j]
                    if p >= 0:
                        cols.append(range(start[p], start[p] + self.lengths[p]))
                    cols.append(range(start[j], start[j] + self.lengths[j]))
                    lens_k.append(self.lengths[j] + (self.lengths[p] if p >= 0 else 0))
                out["mmrl_key_index"] = torch.tensor([c for r in cols for c in r], dtype=torch.long, device=dev)
                out["cu_seq_lens_k"] = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device=dev)
                out["max_length_k"] = max(lens_k)
            return out
        seg = self.segments
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal  # (R, W, W)
        if self.parents is not None and any(p >= 0 for p in self.parents):
            # each query also sees its parent's tokens (which lie before it, in its row); tails see no parent
            lookup = torch.tensor(self.parents, device=seg.device)
            parent = torch.where(seg >= 0, lookup[seg.clamp(min=0)], torch.iinfo(seg.dtype).min)
            parent = torch.where(parent >= 0, parent, torch.iinfo(seg.dtype).min)
            allowed |= parent[:, :, None] == seg[:, None, :]
        if impl == "sdpa":
            return {"attention_mask": allowed[:, None]}
        mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill(~allowed, torch.finfo(dtype).min)
        return {"attention_mask": mask[:, None]}


def row_cost(model: torch.nn.Module) -> Callable[[int], float]:
    """The forward cost of one row of ``w`` tokens through the decoder layers, in multiply-adds per layer:
    ``w * (P + 2 * w * q)``, P the parameters of one decoder layer (the linear layers' work per token) and q the
    query width (attention scores and their weighted sum: ``2 * w * q`` per token with a dense mask, which
    sdpa and eager compute whole). Only ratios matter (it picks between layouts)."""
    layer = model.layers[0]
    params = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in layer.parameters())
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    q = heads * int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return lambda w: float(w) * (params + 2.0 * w * q)


def _first_fit(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """First-fit by decreasing length (ties in order) into rows of ``cap`` tokens; each row in original order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for j in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        for r, left in enumerate(room):
            if lengths[j] <= left:
                rows[r].append(j)
                room[r] -= lengths[j]
                break
        else:
            rows.append([j])
            room.append(cap - lengths[j])
    return [sorted(r) for r in rows]


def layout(lengths: Sequence[int], *, one_row: bool,
           cost: Callable[[int], float] | None = None) -> list[list[int]]:
    """Sequences per packed row. ``one_row``: all of them, in order. Otherwise rows filled first-fit by
    decreasing length up to a capacity: the longest length, or, given a per-row ``cost`` of a width, the
    capacity among the longest length times 1, 2, 4, ... and the total whose rows (all as wide as the widest)
    cost least, among those whose 4-D mask (rows x width x width) is no larger than the padded batch's. A
    capacity of the longest length never costs more than the padded batch (fewer rows, the same width)."""
    if one_row:
        return [list(range(len(lengths)))]
    longest, total = max(lengths), sum(lengths)
    caps = [longest]
    while cost is not None and caps[-1] < total:
        caps.append(min(2 * caps[-1], total))
    best: tuple[float, list[list[int]]] | None = None
    for cap in caps:
        rows = _first_fit(lengths, cap)
        width = max(sum(lengths[j] for j in r) for r in rows)
        if best is not None and len(rows) * width ** 2 > len(lengths) * longest ** 2:
            continue  # a larger mask than padding's (sdpa on a GPU expands it to the scores' dtype)
        price = len(rows) * cost(width) if cost is not None else 0.0
        if best is None or price < best[0]:
            best = (price, rows)
    return best[1]


def pack(input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, position_ids: torch.Tensor,
         src: Sequence[int], lengths: Sequence[int], *, one_row: bool, pad_id: int,
         cost: Callable[[int], float] | None = None, offsets: Sequence[int] | None = None,
         parents: Sequence[int] | None = None, units: Sequence[Sequence[int]] | None = None) -> Packed:
    """Pack sequence ``j`` = ``lengths[j]`` tokens of row ``src[j]`` of the right-padded
    ``input_ids``/``mm_token_type_ids`` ``(B, L)`` and ``position_ids`` ``(3, B, L)``, from column
    ``offsets[j]`` (default 0, with its positions there), in the rows of :func:`layout`.

    ``parents[j]`` (default none): a sequence whose tokens ``j`` sees whole besides its own (sdpa/eager
    masks only). ``units``: consecutive sequences that stay together, in order, in one row (a prompt and the
    continuations that see it); :func:`layout` places the units. Default: each sequence a unit."""
    dev = input_ids.device
    offsets = list(offsets) if offsets is not None else [0] * len(lengths)
    units = [list(u) for u in units] if units is not None else [[j] for j in range(len(lengths))]
    unit_rows = layout([sum(lengths[j] for j in u) for u in units], one_row=one_row, cost=cost)
    rows = [[j for u in r for j in units[u]] for r in unit_rows]
    width = max(sum(lengths[j] for j in r) for r in rows)
    n_rows = len(rows)
    row = [0] * len(lengths)
    start = [0] * len(lengths)
    seg = torch.empty(n_rows, width, dtype=torch.long)
    text = torch.empty(n_rows, width, dtype=torch.long)
    dst_flat: list[torch.Tensor] = []
    src_flat: list[torch.Tensor] = []
    for r, members in enumerate(rows):
        col = 0
        for j in members:
            k = lengths[j]
            row[j], start[j] = r, col
            seg[r, col:col + k] = j
            text[r, col:col + k] = torch.arange(offsets[j], offsets[j] + k)
            dst_flat.append(torch.arange(r * width + col, r * width + col + k))
            src_flat.append(int(src[j]) * input_ids.shape[1] + offsets[j] + torch.arange(k))
            col += k
        seg[r, col:] = -1 - r  # the tail: a segment of its own
        text[r, col:] = torch.arange(width - col)
    dst = torch.cat(dst_flat).to(dev)
    take = torch.cat(src_flat).to(dev)
    ids = torch.full((n_rows * width,), pad_id, dtype=input_ids.dtype, device=dev)
    ids[dst] = input_ids.reshape(-1)[take]
    types = torch.zeros(n_rows * width, dtype=mm_token_type_ids.dtype, device=dev)
    types[dst] = mm_token_type_ids.reshape(-1)[take]
    pos = torch.zeros(3, n_rows * width, dtype=position_ids.dtype, device=dev)
    pos[:, dst] = position_ids.reshape(3, -1)[:, take]
    text = text.to(dev)
    pos = torch.cat([text.reshape(1, -1).to(pos.dtype), pos]).view(4, n_rows, width)
    # the tail's M-RoPE positions: its text positions (any value would do: nothing reads the tail)
    tail = (seg < 0).to(dev)
    pos[1:, tail] = text[tail].to(pos.dtype)
    return Packed(input_ids=ids.view(n_rows, width), mm_token_type_ids=types.view(n_rows, width),
                  position_ids=pos, segments=seg.to(dev), row=torch.tensor(row, device=dev),
                  start=torch.tensor(start, device=dev), lengths=list(lengths),
                  order=[j for r in rows for j in r], parents=list(parents) if parents is not None else None)
