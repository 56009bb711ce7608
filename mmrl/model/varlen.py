"""Variable-length attention: one attention call per layer for many short sequences (``model.attn_implementation=
varlen``).

Two places of a Qwen-VL forward attend within many independent segments of one packed tensor:

* the **vision tower**: Qwen2.5-VL's window attention splits a video's patches into windows of 64 (4,096 vision
  tokens: 7,232 windows a forward over 32 blocks) and its full-attention blocks into frames. transformers'
  ``Qwen2_5_VLVisionAttention`` (and Qwen2-VL's, Qwen3-VL's) hands the whole packed tensor and its ``cu_seqlens``
  to the attention function in one call only when the implementation's name says flash attention
  (``is_flash_attention_requested``); otherwise it splits the tensor on the host (``lengths.tolist()``) and calls
  sdpa once per window;
* the **language model's packed rows** (:mod:`mmrl.model.packing`): a micro-batch's sequences back to back, each
  attending causally to itself only, or, with the shared prefix (:mod:`mmrl.model.shared_prefix`), each group's
  prompt once followed by its answers, each answer attending to the prompt and itself: a key index
  (``mmrl_key_index``, handed to every layer with the segment lengths) lays out each segment's keys.

This module registers an attention implementation, :data:`NAME` (it contains "flash", so transformers takes its
``cu_seqlens`` branches, yet it is not ``flash_attention_N``, so nothing tries to load the flash-attn package or a
hub kernel), that computes every segment of such a call at once:

* on a CUDA device where the installed torch has :func:`torch.nn.attention.varlen.varlen_attn` (torch 2.10+, the
  flash kernels behind sdpa, no extra package), through it (packed, no padding);
* elsewhere (the CPU, older torch), through padded calls of transformers' own sdpa function: the segments laid
  out as rows of a batch padded to the longest, with a boolean mask of each row's valid keys (and causality,
  aligned to the end of the keys as flash attention aligns it); where every segment has one shape (a video's
  windows and frames, a lone sequence) the batch is a view of the packed tensor and sdpa needs no mask. One call
  in those cases; segments of very different lengths (a shared prompt and its continuations in one pass) go in
  a few batches by length class, so that padding never doubles a length (:class:`_Layout`). A block-diagonal
  mask over the whole packed row (what sdpa needs otherwise) computes the packed length for every token.

Calls without segment lengths (generation with a KV cache, padded batches, the rank-invariant dummy pass)
take the flash-attention mask convention: the model hands a 2-D padding mask or none (transformers'
``flash_attention_mask``), and this function builds the 4-D mask from it, causal from the end of the keys, and calls
sdpa once. Either way the results equal sdpa's within round-off (tests/test_varlen_attention.py).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

NAME = "mmrl_flash_varlen"
"""The name under which transformers finds this implementation (``config._attn_implementation``)."""

CONFIG_VALUE = "varlen"
"""``model.attn_implementation`` that selects it."""


@functools.cache
def register() -> str:
    """Register :func:`attention` and its mask convention with transformers (once per process); returns
    :data:`NAME`."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
    return NAME


def apply(model: torch.nn.Module) -> None:
    """Switch a loaded model (its language model and vision tower) to :data:`NAME`. The model is loaded with sdpa
    first: transformers would take any other name with "flash" in it for a hub kernel to download."""
    register()
    model.config._attn_implementation = NAME  # the setter sets every sub-config (vision, text) too


@functools.cache
def _torch_varlen() -> tuple[Any, str, bool] | None:
    """torch's ``varlen_attn``, how it takes causality (``is_causal`` in torch 2.10-2.11, ``window_size`` since)
    and whether it takes a ``scale``; None where torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    for causal_arg in ("window_size", "is_causal"):
        if causal_arg in params:
            return varlen_attn, causal_arg, "scale" in params
    return None


def _use_torch_varlen(query: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _torch_varlen() is not None


def _lengths(cu: torch.Tensor) -> torch.Tensor:
    return cu[1:] - cu[:-1]


def _band(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """``(1, 1, q_len, k_len)``: query i sees keys up to i + (k_len - q_len), flash attention's causal alignment."""
    return (torch.arange(k_len, device=device)[None, :] <= torch.arange(q_len, device=device)[:, None]
            + (k_len - q_len))[None, None]


class _Layout:
    """How the segments of a packed tensor become batches for sdpa (one layout per set of segment lengths: the
    layers of a forward share it).

    Every segment of one shape (a video's windows, its frames, a lone sequence): one batch that is a view of the
    packed tensor. Otherwise one batch per length class (the next power of two of a segment's query length and of
    its key length: a shared prompt and its short continuations make two batches, not the continuations padded
    to the prompt's length; padding never doubles a length); a batch's segments are gathered into rows padded to
    its longest, with a mask of each row's valid keys (and causality). Where a batch's segments share one shape
    no mask is needed beyond causality: none with sdpa's causal flag where queries and keys are as many, else one
    band shared by the rows, aligned to the end of the keys. One call per batch: one in the common cases."""

    def __init__(self, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool) -> None:
        dev = cu_q.device
        len_q, len_k = _lengths(cu_q).long(), _lengths(cu_k).long()
        self.n, self.max_q, self.max_k, self.causal = int(len_q.numel()), max_q, max_k, causal
        self.same = bool((len_q == max_q).all() and (len_k == max_k).all())
        if self.same:
            self.mask = _band(max_q, max_k, dev) if causal and max_q != max_k else None
            return
        lq, lk = len_q.tolist(), len_k.tolist()
        sq, sk = cu_q[:-1].tolist(), cu_k[:-1].tolist()
        classes: dict[tuple[int, int], list[int]] = {}  # by length class: the next power of two of each length
        for j in range(self.n):
            classes.setdefault(((lq[j] - 1).bit_length(), (lk[j] - 1).bit_length()), []).append(j)
        groups = [classes[c] for c in sorted(classes, reverse=True)]
        # each batch: (queries' packed indices (b, mq), keys' (b, mk), mask or None, sdpa's causal flag, the
        # valid queries among the batch's b * mq)
        self.batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool, torch.Tensor | None]] = []
        where: list[torch.Tensor] = []
        for g in groups:
            gq = torch.tensor([lq[i] for i in g], device=dev)
            gk = torch.tensor([lk[i] for i in g], device=dev)
            mq, mk = max(lq[i] for i in g), max(lk[i] for i in g)
            cols_q, cols_k = torch.arange(mq, device=dev), torch.arange(mk, device=dev)
            index_q = torch.tensor([sq[i] for i in g], device=dev)[:, None] + cols_q[None, :]
            index_k = torch.tensor([sk[i] for i in g], device=dev)[:, None] + cols_k[None, :]
            if all(lq[i] == mq and lk[i] == mk for i in g):  # one shape: no padding
                mask = _band(mq, mk, dev) if causal and mq != mk else None
                self.batches.append((index_q, index_k, mask, causal and mq == mk, None))
                where.append(index_q.reshape(-1))
                continue
            valid_q = cols_q[None, :] < gq[:, None]  # (b, mq)
            valid_k = cols_k[None, :] < gk[:, None]  # (b, mk)
            # padding reads a valid token (the packed tensors' last); it is masked or dropped
            index_q, index_k = index_q.clamp(max=int(cu_q[-1]) - 1), index_k.clamp(max=int(cu_k[-1]) - 1)
            full = valid_k[:, None, :].expand(-1, mq, -1)  # (b, mq, mk)
            if causal:  # query i of a segment sees its keys up to i + (len_k - len_q)
                full = full & (cols_k[None, None, :] <= cols_q[None, :, None] + (gk - gq)[:, None, None])
            # a padded query row sees its segment's keys (any finite result will do: it is dropped)
            full = full | (~valid_q[:, :, None] & valid_k[:, None, :])
            flat = valid_q.reshape(-1).nonzero().squeeze(-1)
            self.batches.append((index_q, index_k, full[:, None], False, flat))
            where.append(index_q.reshape(-1)[flat])
        self.order = torch.cat(where).argsort()  # the batches' queries back in packed order

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None, dropout: float, key_index: torch.Tensor | None = None) -> torch.Tensor:
        """``(1, tokens, heads, dim)`` attention of packed ``(1, heads, tokens, dim)`` queries, keys and values
        (``key_index``: the segments' keys are these columns of ``key``/``value``, gathered once per batch)."""
        if self.same:
            if key_index is not None:
                key, value = key.index_select(2, key_index), value.index_select(2, key_index)
            q = query[0].unflatten(1, (self.n, self.max_q)).transpose(0, 1)
            k = key[0].unflatten(1, (self.n, self.max_k)).transpose(0, 1)
            v = value[0].unflatten(1, (self.n, self.max_k)).transpose(0, 1)
            causal = self.causal and self.max_q == self.max_k
            out = _sdpa(module, q, k, v, self.mask, scaling, dropout, causal)  # (n, max_q, heads, dim)
            return out.reshape(1, -1, *out.shape[2:])
        outs = []
        for index_q, index_k, mask, causal, flat in self.batches:
            if index_q.shape[0] == 1:  # one segment: a slice of the queries
                a = int(index_q[0, 0])
                q = query[:, :, a:a + index_q.shape[1]]
            else:
                q = query[0][:, index_q].transpose(0, 1)  # (b, heads, mq, dim)
            if key_index is not None:  # the keys' columns through the key index: one gather
                index_k = key_index[index_k]
            if index_k.shape[0] == 1 and key_index is None:
                b = int(index_k[0, 0])
                k, v = key[:, :, b:b + index_k.shape[1]], value[:, :, b:b + index_k.shape[1]]
            else:
                k, v = key[0][:, index_k].transpose(0, 1), value[0][:, index_k].transpose(0, 1)
            out = _sdpa(module, q, k, v, mask, scaling, dropout, causal).reshape(-1, query.shape[1], query.shape[3])
            outs.append(out if flat is None else out[flat])
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out[self.order].unsqueeze(0)


_LAYOUTS: list[tuple[tuple, _Layout]] = []  # the latest few (key, layout), newest last
_KEEP = 4  # a vision tower alternates between its windows and its frames, a shared-prefix forward between passes


def _layout(cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool) -> _Layout:
    """The layout for these segment lengths, built once for the layers of a forward (and its recomputation under
    activation checkpointing): a key holds the very tensors transformers passes each layer, so a new call's
    tensors never match an old layout (and those kept cannot be freed and reused meanwhile)."""
    for key, layout in _LAYOUTS:
        if key[0] is cu_q and key[1] is cu_k and key[2:] == (max_q, max_k, causal):
            return layout
    layout = _Layout(cu_q, cu_k, max_q, max_k, causal)
    _LAYOUTS.append(((cu_q, cu_k, max_q, max_k, causal), layout))
    del _LAYOUTS[:-_KEEP]
    return layout


def _sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          mask: torch.Tensor | None, scaling: float | None, dropout: float, is_causal: bool) -> torch.Tensor:
    if not query.is_cuda and key.shape[1] != query.shape[1]:
        # grouped key heads on the CPU: torch's kernel takes them as they are, with a mask too (transformers'
        # function copies them to every query head where a mask is given, for the CUDA kernels' sake)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
            is_causal=is_causal and mask is None and query.shape[2] > 1, enable_gqa=True)
        return out.transpose(1, 2)
    groups = query.shape[1] // key.shape[1]
    if groups != getattr(module, "num_key_value_groups", groups):
        # a sequence-parallel rank's share of the heads (mmrl.model.sequence_parallel: key heads repeated to fill
        # the group): grouped as the shapes say, not as the module's whole heads are (transformers' function
        # repeats the keys by the module's count)
        if groups > 1:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
            is_causal=is_causal and mask is None and query.shape[2] > 1)
        return out.transpose(1, 2)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                    is_causal=is_causal)
    return out  # (batch, q, heads, dim)


def _segments(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
              scaling: float | None, dropout: float, key_index: torch.Tensor | None = None) -> torch.Tensor:
    """Attention within each segment of packed ``(1, heads, tokens, dim)`` tensors; ``(1, tokens_q, heads, dim)``
    (``key_index``: the segments' keys and values are these columns of ``key`` and ``value``)."""
    if _use_torch_varlen(query):
        if key_index is not None:
            key, value = key.index_select(2, key_index), value.index_select(2, key_index)
        varlen_attn, causal_arg, takes_scale = _torch_varlen()
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
        if k.shape[1] != q.shape[1]:  # grouped keys: the kernel's GQA support differs across torch versions
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        kw: dict[str, Any] = {"window_size": (-1, 0) if causal else (-1, -1)} if causal_arg == "window_size" \
            else {"is_causal": causal}
        if takes_scale:
            kw["scale"] = scaling
        elif scaling is not None:  # the kernel's own scale is 1/sqrt(dim): the queries carry the difference
            q = q * (scaling * q.shape[-1] ** 0.5)
        out = varlen_attn(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k), **kw)
        return out.unsqueeze(0)
    return _layout(cu_q, cu_k, int(max_q), int(max_k), causal).attend(module, query, key, value, scaling, dropout,
                                                                      key_index)


_MASKS: list[tuple[tuple, torch.Tensor | None]] = []  # the latest (key, 4-D mask): a forward's layers share one


def _dense_mask(attention_mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int, causal: bool,
                device: torch.device) -> torch.Tensor | None:
    """The 4-D boolean mask for a call without segments: the 2-D key padding mask (or none) and causality aligned
    to the end of the keys; None where sdpa's own causal flag says the same (no padding, as many queries as keys).
    Built once for the layers of a forward (a generation step hands every layer the same 2-D mask), as sdpa's
    mask is built once by the model."""
    if attention_mask is None and (not causal or q_len == kv_len or q_len == 1):
        return None
    key = (batch, q_len, kv_len, causal, device)
    for (held, *rest), mask in _MASKS:
        if held is attention_mask and tuple(rest) == key:
            return mask
    mask = _build_dense_mask(attention_mask, batch, q_len, kv_len, causal, device)
    _MASKS.append(((attention_mask, *key), mask))
    del _MASKS[:-2]
    return mask


def _build_dense_mask(attention_mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int, causal: bool,
                      device: torch.device) -> torch.Tensor:
    keys = torch.ones(batch, kv_len, dtype=torch.bool, device=device) if attention_mask is None \
        else attention_mask[:, -kv_len:].to(device=device, dtype=torch.bool)
    mask = keys[:, None, :].expand(-1, q_len, -1)
    if causal:
        rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        mask = mask & (torch.arange(kv_len, device=device)[None, :] <= rows)[None]
    mask = mask | ~mask.any(-1, keepdim=True)  # a query with no key (left padding): any finite result
    return mask[:, None]


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, cu_seq_lens_q: torch.Tensor | None = None,
              cu_seq_lens_k: torch.Tensor | None = None, max_length_q: int | None = None,
              max_length_k: int | None = None, mmrl_key_index: torch.Tensor | None = None,
              mmrl_sequence_group: Any = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query`` ``(batch, heads, q, dim)``, keys and values
    ``(batch, kv_heads, k, dim)``); returns ``((batch, q, heads, dim), None)``.

    ``mmrl_key_index`` (with the segment lengths; the model passes its keyword arguments down to every layer):
    the keys and values of the segments are these columns of the packed row's, in order, so a segment can see
    tokens of another besides its own: a shared prompt's continuations, packed after it, each see the prompt and
    themselves (``cu_seq_lens_k`` counts both), in one pass (:func:`mmrl.model.shared_prefix.one_pass_hidden`).

    ``mmrl_sequence_group`` (a :class:`mmrl.model.sequence_parallel.SequenceGroup`, handed to the language model's
    layers by a sequence-parallel pass): the queries, keys and values are this rank's slice of the packed row's
    tokens and the segment lengths the whole row's; the heads are exchanged for the tokens with an all-to-all
    around the segments' attention (Ulysses). The vision tower never gets it (its frames are split whole)."""
    if mmrl_sequence_group is not None and mmrl_sequence_group.active:
        if cu_seq_lens_q is None:
            raise ValueError("sequence-parallel attention needs the whole row's segment lengths (cu_seq_lens_q)")
        cu_k = cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
        max_q = max_length_q if max_length_q is not None else int(_lengths(cu_seq_lens_q).max())
        max_k = max_length_k if max_length_k is not None else int(_lengths(cu_k).max())
        causal = bool(getattr(module, "is_causal", True)) if is_causal is None else bool(is_causal)

        def whole(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return _segments(module, q, k, v, cu_seq_lens_q, cu_k, max_q, max_k, causal, scaling, dropout,
                             mmrl_key_index)

        return mmrl_sequence_group.attend(module, query, key, value, whole), None
    causal = bool(getattr(module, "is_causal", True)) if is_causal is None else bool(is_causal)
    if mmrl_key_index is not None and cu_seq_lens_q is None:
        raise ValueError("mmrl_key_index needs the segments' lengths (cu_seq_lens_q / cu_seq_lens_k)")
    if attention_mask is not None and attention_mask.dim() == 4:  # a prepared mask: sdpa as it is
        return _sdpa(module, query, key, value, attention_mask, scaling, dropout, False), None
    if cu_seq_lens_q is not None:
        if query.shape[0] != 1:
            raise ValueError("variable-length attention takes one packed row")
        cu_k = cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
        max_q = max_length_q if max_length_q is not None else int(_lengths(cu_seq_lens_q).max())
        max_k = max_length_k if max_length_k is not None else int(_lengths(cu_k).max())
        return _segments(module, query, key, value, cu_seq_lens_q, cu_k, max_q, max_k, causal, scaling, dropout,
                         mmrl_key_index), None
    mask = _dense_mask(attention_mask, query.shape[0], query.shape[2], key.shape[2], causal, query.device)
    return _sdpa(module, query, key, value, mask, scaling, dropout, causal and mask is None and query.shape[2] > 1), None
