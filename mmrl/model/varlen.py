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
  attending causally to itself only.

This module registers an attention implementation, :data:`NAME` (it contains "flash", so transformers takes its
``cu_seqlens`` branches, yet it is not ``flash_attention_N``, so nothing tries to load the flash-attn package or a
hub kernel), that computes every segment of such a call at once:

* on a CUDA device where the installed torch has :func:`torch.nn.attention.varlen.varlen_attn` (torch 2.10+, the
  flash kernels behind sdpa, no extra package), through it (packed, no padding);
* elsewhere (the CPU, older torch), through **one** padded call of transformers' own sdpa function: the segments
  laid out as rows of a batch padded to the longest segment, with a boolean mask of each row's valid keys (and
  causality, aligned to the end of the keys as flash attention aligns it); where every segment is as long as
  the longest (a video's windows and frames, a lone sequence) the batch is a view of the packed tensor and sdpa
  needs no mask. The padding costs at most the longest segment per segment; a block-diagonal mask over the
  whole packed row (what sdpa needs otherwise) costs the packed length per token.

Calls without segment lengths (generation with a KV cache, padded batches, the shared-prefix path's second pass)
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
def _torch_varlen() -> tuple[Any, str] | None:
    """torch's ``varlen_attn`` and how it takes causality (``is_causal`` in torch 2.10-2.11, ``window_size``
    since), or None where torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return varlen_attn, "window_size"
    if "is_causal" in params:
        return varlen_attn, "is_causal"
    return None


def _use_torch_varlen(query: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _torch_varlen() is not None


def _lengths(cu: torch.Tensor) -> torch.Tensor:
    return cu[1:] - cu[:-1]


class _Layout:
    """Where each token of a packed tensor sits in the padded batch of its segments, and the mask of that batch
    (one per set of segment lengths: the tensors of a forward's layers share it)."""

    def __init__(self, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool) -> None:
        dev = cu_q.device
        len_q, len_k = _lengths(cu_q).long(), _lengths(cu_k).long()
        cols_q = torch.arange(max_q, device=dev)
        cols_k = torch.arange(max_k, device=dev)
        self.valid_q = cols_q[None, :] < len_q[:, None]  # (n, max_q)
        valid_k = cols_k[None, :] < len_k[:, None]  # (n, max_k)
        last_q, last_k = int(cu_q[-1]), int(cu_k[-1])
        # gather indices into the packed tokens (padding reads the segment's own first token; it is masked)
        self.index_q = (cu_q[:-1, None].long() + cols_q[None, :]).clamp(max=max(last_q - 1, 0))
        self.index_k = (cu_k[:-1, None].long() + cols_k[None, :]).clamp(max=max(last_k - 1, 0))
        mask = valid_k[:, None, :].expand(-1, max_q, -1)  # (n, max_q, max_k)
        if causal:  # query i of a segment sees its keys up to i + (len_k - len_q): flash attention's alignment
            shift = (len_k - len_q)[:, None, None]
            mask = mask & (cols_k[None, None, :] <= cols_q[None, :, None] + shift)
        # a padded query row sees its segment's keys (any finite result will do: it is dropped)
        mask = mask | (~self.valid_q[:, :, None] & valid_k[:, None, :])
        self.mask = mask[:, None]  # (n, 1, max_q, max_k)
        self.flat_q = self.valid_q.reshape(-1).nonzero().squeeze(-1)
        # every segment as long as the longest, keys as queries (a video's windows and frames, one sequence):
        # no padding, so the tensors are views and sdpa needs no mask (its causal flag, where causal, is exact)
        self.uniform = bool((len_q == max_q).all() and (len_k == len_q).all() and max_q == max_k)
        self.n = int(len_q.numel())


_LAST: list[Any] = [None, None]  # (the key the layout was built for, the layout)


def _layout(cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool) -> _Layout:
    """The layout for these segment lengths, built once for the layers of a forward (and its recomputation under
    activation checkpointing): the key holds the very tensors transformers passes each layer, so a new call's
    tensors never match an old layout."""
    key = _LAST[0]
    if key is not None and key[0] is cu_q and key[1] is cu_k and key[2:] == (max_q, max_k, causal):
        return _LAST[1]
    layout = _Layout(cu_q, cu_k, max_q, max_k, causal)
    _LAST[0], _LAST[1] = (cu_q, cu_k, max_q, max_k, causal), layout
    return layout


def _sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          mask: torch.Tensor | None, scaling: float | None, dropout: float, is_causal: bool) -> torch.Tensor:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                    is_causal=is_causal)
    return out  # (batch, q, heads, dim)


def _segments(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
              scaling: float | None, dropout: float) -> torch.Tensor:
    """Attention within each segment of packed ``(1, heads, tokens, dim)`` tensors; ``(1, tokens_q, heads, dim)``."""
    if _use_torch_varlen(query):
        varlen_attn, causal_arg = _torch_varlen()
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
        if k.shape[1] != q.shape[1]:  # grouped keys: the kernel's GQA support differs across torch versions
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        kw = {"window_size": (-1, 0) if causal else (-1, -1)} if causal_arg == "window_size" else {"is_causal": causal}
        out = varlen_attn(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k),
                          scale=scaling, **kw)
        return out.unsqueeze(0)
    lay = _layout(cu_q, cu_k, int(max_q), int(max_k), causal)
    if lay.uniform:
        q, k, v = (t[0].unflatten(1, (lay.n, int(max_q))).transpose(0, 1) for t in (query, key, value))
        out = _sdpa(module, q, k, v, None, scaling, dropout, causal)  # (n, max_q, heads, dim)
        return out.reshape(1, -1, *out.shape[2:])
    q = query[0][:, lay.index_q].transpose(0, 1)  # (n, heads, max_q, dim)
    k = key[0][:, lay.index_k].transpose(0, 1)
    v = value[0][:, lay.index_k].transpose(0, 1)
    out = _sdpa(module, q, k, v, lay.mask, scaling, dropout, False)  # (n, max_q, heads, dim)
    return out.reshape(-1, *out.shape[2:])[lay.flat_q].unsqueeze(0)


def _dense_mask(attention_mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int, causal: bool,
                device: torch.device) -> torch.Tensor | None:
    """The 4-D boolean mask for a call without segments: the 2-D key padding mask (or none) and causality aligned
    to the end of the keys; None where sdpa's own causal flag says the same (no padding, as many queries as keys)."""
    if attention_mask is None and (not causal or q_len == kv_len or q_len == 1):
        return None
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
              max_length_k: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query`` ``(batch, heads, q, dim)``, keys and values
    ``(batch, kv_heads, k, dim)``); returns ``((batch, q, heads, dim), None)``."""
    causal = bool(getattr(module, "is_causal", True)) if is_causal is None else bool(is_causal)
    if attention_mask is not None and attention_mask.dim() == 4:  # a prepared mask: sdpa as it is
        return _sdpa(module, query, key, value, attention_mask, scaling, dropout, False), None
    if cu_seq_lens_q is not None:
        if query.shape[0] != 1:
            raise ValueError("variable-length attention takes one packed row")
        cu_k = cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
        max_q = max_length_q if max_length_q is not None else int(_lengths(cu_seq_lens_q).max())
        max_k = max_length_k if max_length_k is not None else int(_lengths(cu_k).max())
        return _segments(module, query, key, value, cu_seq_lens_q, cu_k, max_q, max_k, causal, scaling, dropout), None
    mask = _dense_mask(attention_mask, query.shape[0], query.shape[2], key.shape[2], causal, query.device)
    return _sdpa(module, query, key, value, mask, scaling, dropout, causal and mask is None and query.shape[2] > 1), None
