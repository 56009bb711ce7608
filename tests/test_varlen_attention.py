"""Variable-length attention (``model.attn_implementation=varlen``, :mod:`mmrl.model.varlen`), issue 58:

* the attention function itself: many segments of one packed tensor in one call give what sdpa gives on each
  segment alone (causal and not, grouped key heads, continuations whose keys are a prefix plus their own with
  causality from the end of the keys), values and gradients;
* real tiny models of every family, images and videos: log-probs, entropies and every parameter's gradient
  equal the sdpa path's (padded, the reference every other packing test uses) within fp32 round-off, on the
  plain and shared-prefix paths (one pass and two), with activation checkpointing; every pass is one row without
  padding, and makes one to three attention calls per vision block and per decoder layer on the CPU (batches of
  similar shapes; sdpa: one per vision window);
* segments of very different lengths go in separate batches (no continuation padded to its prompt's length);
* generation (left-padded prompts, a KV cache) draws the same greedy tokens as sdpa.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from synthetic_media import image, prompt, video
from test_packing import SHORTCUT_FAMILIES, Layer0, folders, group, loss_of, policy_of  # noqa: F401 (fixtures)

from mmrl.model import FAMILIES, Policy, TokenSeq, checkpointing_switch, shared_prefix, varlen


# ------------------------------------------------------------------------------------------------ the function
class _Module(torch.nn.Module):
    def __init__(self, causal: bool, groups: int) -> None:
        super().__init__()
        self.is_causal = causal
        self.num_key_value_groups = groups


def cu_of(lens: list[int]) -> torch.Tensor:
    """Cumulative segment lengths, as transformers passes them (int32, starting at 0)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _reference(q, k, v, lens_q, lens_k, causal: bool, scale: float) -> torch.Tensor:
    """Each segment alone through torch's sdpa with an explicit mask (causality from the end of its keys)."""
    rep = q.shape[1] // k.shape[1]
    outs, sq, sk = [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        qs, ks, vs = q[:, :, sq:sq + lq], k[:, :, sk:sk + lk], v[:, :, sk:sk + lk]
        ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        mask = None
        if causal:
            mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale).transpose(1, 2))
        sq, sk = sq + lq, sk + lk
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("lens_q", [[5, 1, 9, 3, 9], [5, 7, 6, 2], [6, 6, 6], [11]],
                         ids=["ragged", "one-class", "uniform", "one"])
def test_segments_in_one_call_equal_each_segment_alone(causal: bool, prefix: bool, lens_q: list[int]) -> None:
    torch.manual_seed(0)
    lens_k = [n + (7 if prefix else 0) for n in lens_q]  # a continuation sees a prefix and itself
    heads, kv_heads, dim = 4, 2, 8
    q = torch.randn(1, heads, sum(lens_q), dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, kv_heads, sum(lens_k), dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, kv_heads, sum(lens_k), dim, dtype=torch.float64, requires_grad=True)
    module = _Module(causal, heads // kv_heads)
    out, _ = varlen.attention(module, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu_of(lens_q), cu_seq_lens_k=cu_of(lens_k),
                              max_length_q=max(lens_q), max_length_k=max(lens_k))
    ref = _reference(q, k, v, lens_q, lens_k, causal, 0.3)
    assert out.shape == ref.shape == (1, sum(lens_q), heads, dim)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_padded_calls_follow_the_key_padding_mask() -> None:
    """Without segments (generation, padded batches): a 2-D key padding mask and causality from the end of the
    keys (a cache of 4 tokens, 3 new queries), as each row alone."""
    torch.manual_seed(1)
    q = torch.randn(2, 4, 3, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    keys = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)  # row 1 left-padded by 2
    out, _ = varlen.attention(_Module(True, 2), q, k, v, keys, scaling=0.25)
    for b, pad in enumerate((0, 2)):
        ref = _reference(q[b:b + 1], k[b:b + 1, :, pad:], v[b:b + 1, :, pad:], [3], [7 - pad], True, 0.25)
        torch.testing.assert_close(out[b:b + 1], ref)


# ------------------------------------------------------------------------------------------------ real models
# the tiny models of every family and their loaded policies: test_packing's fixtures (folders, policy_of)


class AttentionCalls:
    """Attention kernel calls (torch's sdpa function) while active."""

    def __enter__(self) -> AttentionCalls:  # noqa: PYI034
        self.n, self._orig = 0, F.scaled_dot_product_attention

        def counted(*a: Any, **kw: Any) -> torch.Tensor:
            self.n += 1
            return self._orig(*a, **kw)

        F.scaled_dot_product_attention = counted
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._orig


def batch_of(policy: Policy, family: str, kind: str) -> list[TokenSeq]:
    """A group over a large video or image (many vision windows) with ragged answers, and a small prompt's group."""
    big = video(family, "big", frames=4, side=16, seed=1) if kind == "video" else image(family, "big", w=8, h=8, seed=1)
    small = image(family, "small", w=2, h=2, seed=2)
    return (group(policy, prompt(policy, [big], "What happens here?"), [3, 9, 1], seed=0)
            + group(policy, prompt(policy, [small], "Colour?"), [6, 2], seed=10))


def forward_backward(policy: Policy, seqs: list[TokenSeq], *, shared: bool, padded: bool = False,
                     one_pass: bool | None = None):
    policy.configure(padding_free=not padded, shared_prefix_one_pass=one_pass)
    policy.model.zero_grad(set_to_none=True)
    probe = Layer0(policy)
    try:
        with AttentionCalls() as calls:
            logp, ent, mask = policy.forward_logprobs(seqs, temperature=0.9, with_entropy=True, entropy_grad=True,
                                                      shared_prefix=shared)
            fwd = calls.n
            loss_of(logp, ent, mask).backward()
    finally:
        probe.close()
        policy.configure(padding_free=True, shared_prefix_one_pass=None)
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads, fwd, probe.calls


def tower_calls(policy: Policy, seqs: list[TokenSeq]) -> int:
    """Attention calls of one vision-tower run over the media of ``seqs``."""
    keys = list(dict.fromkeys(k for s in seqs for k in s.media))
    policy.weights_changed()  # no cached features
    with AttentionCalls() as calls, torch.no_grad():
        policy.vision.run(keys)
    policy.weights_changed()
    return calls.n


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_varlen_equals_sdpa(policy_of, family: str, kind: str) -> None:  # noqa: F811
    ref_policy, policy = policy_of(family, "sdpa"), policy_of(family, "varlen")
    sdpa_tower = tower_calls(ref_policy, batch_of(ref_policy, family, kind))
    ref_logp, ref_ent, ref_grads, _, _ = forward_backward(ref_policy, batch_of(ref_policy, family, kind),
                                                                shared=False, padded=True)
    seqs = batch_of(policy, family, kind)
    vision_blocks = len(policy.base.visual.blocks)
    layers = len(policy.base.language_model.layers)
    plan = shared_prefix.prefix_plan(seqs)
    assert plan is not None and all(n > 0 for _, n in plan)
    for shared, one_pass in ((False, None), (True, None), (True, False)):
        for checkpointing in (False, True):
            checkpointing_switch(policy.model, checkpointing)
            try:
                logp, ent, grads, calls, layer0 = forward_backward(policy, seqs, shared=shared, one_pass=one_pass)
                tower = tower_calls(policy, seqs)
            finally:
                checkpointing_switch(policy.model, False)
            torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5 * float(ref_logp.abs().max()))
            torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5 * float(ref_ent.abs().max()))
            assert grads.keys() == ref_grads.keys()
            assert any(n.startswith("model.visual.") for n in grads) and "lm_head.weight" in grads
            for name, g in ref_grads.items():
                err = float((grads[name] - g).abs().max())
                assert err <= 2e-5 * float(g.abs().max()) + 1e-9, f"shared={shared} {name}: max error {err}"
            # the vision tower: a call or two per block (here a large and a small medium, one batch each), whatever
            # the number of windows (sdpa: one per window); the language model: one row, one pass by default (the
            # prompts once, each followed by its continuations, which see it through the key index), two when
            # asked; its calls per layer and pass: one per length class of its segments on the CPU
            two = one_pass is False
            assert vision_blocks <= tower <= 2 * vision_blocks, (shared, one_pass, tower)
            assert calls - tower >= layers * (2 if two else 1)

            # every pass one row without padding (the one pass leaves out each row's last token: nothing reads it)
            if not shared:
                want = [(1, sum(len(s) for s in seqs))]
            elif two:
                want = [(1, sum(n for _, n in plan)), (1, sum(len(seqs[i]) - n for g, n in plan for i in g))]
            else:
                want = [(1, sum(n + sum(len(seqs[i]) - 1 - n for i in g) for g, n in plan))]
            assert [c for c, _ in layer0[:len(want)]] == want and all(m is None for _, m in layer0), layer0
    if family == "qwen2_5_vl":  # sdpa: one call per window in the windowed blocks
        assert sdpa_tower > 4 * vision_blocks


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_equals_sdpa(policy_of, family: str) -> None:  # noqa: F811
    """Left-padded prompts of different lengths, decoded greedily with a KV cache: the same tokens."""
    out = {}
    for attn in ("sdpa", "varlen"):
        policy = policy_of(family, attn)
        seqs = [prompt(policy, [image(family, "a", w=4, h=4, seed=3)], "Describe the picture in detail."),
                prompt(policy, [], "Hi")]
        policy.model.eval()
        try:
            with policy.inference():
                gens = policy.generate(seqs, max_new_tokens=6, do_sample=False)
        finally:
            policy.model.train()
        out[attn] = [(g[0].token_ids, g[0].logprobs) for g in gens]
    for (ids_s, lp_s), (ids_v, lp_v) in zip(out["sdpa"], out["varlen"]):
        assert ids_s == ids_v
        torch.testing.assert_close(torch.tensor(lp_v), torch.tensor(lp_s), rtol=1e-4, atol=1e-4)


def test_a_prompt_and_its_continuations_are_not_padded_to_one_length() -> None:
    """The CPU's batches: a 300-token prompt and eight 20-token continuations (which see it through the key index)
    make two batches, neither padded past twice its own attention; values as each segment alone."""
    torch.manual_seed(2)
    lens_q = [300] + [20] * 8
    lens_k = [300] + [320] * 8
    q = torch.randn(1, 2, sum(lens_q), 8, dtype=torch.float64)
    k = torch.randn(1, 2, sum(lens_k), 8, dtype=torch.float64)
    v = torch.randn(1, 2, sum(lens_k), 8, dtype=torch.float64)
    layout = varlen._Layout(cu_of(lens_q), cu_of(lens_k), max(lens_q), max(lens_k), True)
    shapes = sorted((tuple(iq.shape), tuple(ik.shape)) for iq, ik, _, _, _ in layout.batches)
    assert shapes == [((1, 300), (1, 300)), ((8, 20), (8, 320))]  # no padding at all
    with AttentionCalls() as calls:
        out, _ = varlen.attention(_Module(True, 1), q, k, v, None, cu_seq_lens_q=cu_of(lens_q), cu_seq_lens_k=cu_of(lens_k),
                                  max_length_q=max(lens_q), max_length_k=max(lens_k))
    assert calls.n == 2
    torch.testing.assert_close(out, _reference(q, k, v, lens_q, lens_k, True, None))


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_a_key_index_lets_continuations_see_their_prompt(kv_heads: int) -> None:
    """One packed row [prompt | continuation | continuation]: with the key index each continuation's keys are the
    prompt's and its own (as the one-pass shared prefix passes them), causal from the end of the keys; values and
    gradients as the keys gathered by hand."""
    torch.manual_seed(3)
    lens_q, prompt = [6, 3, 2], list(range(6))
    index = torch.tensor(prompt + prompt + [6, 7, 8] + prompt + [9, 10])
    lens_k = [6, 9, 8]
    q = torch.randn(1, 4, 11, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, kv_heads, 11, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, kv_heads, 11, 8, dtype=torch.float64, requires_grad=True)
    out, _ = varlen.attention(_Module(True, 4 // kv_heads), q, k, v, None, cu_seq_lens_q=cu_of(lens_q),
                              cu_seq_lens_k=cu_of(lens_k), max_length_q=6, max_length_k=9, mmrl_key_index=index)
    ref = _reference(q, k[:, :, index], v[:, :, index], lens_q, lens_k, True, None)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    for g, r in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
        torch.testing.assert_close(g, r)


def _kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, is_causal=None, window_size=None):
    """torch's ``varlen_attn`` contract (tokens x heads x dim, causal from the end of each segment's keys,
    ``scale`` default 1/sqrt(dim)), each segment alone through sdpa: what the GPU kernel computes."""
    causal = bool(is_causal) if window_size is None else tuple(window_size) == (-1, 0)
    outs = []
    for i in range(len(cu_seq_q) - 1):
        a, b, c, d = int(cu_seq_q[i]), int(cu_seq_q[i + 1]), int(cu_seq_k[i]), int(cu_seq_k[i + 1])
        q, k, v = (t.transpose(0, 1)[None] for t in (query[a:b], key[c:d], value[c:d]))
        mask = torch.arange(d - c)[None] <= torch.arange(b - a)[:, None] + (d - c) - (b - a) if causal else None
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("convention", ["window_size", "is_causal", "is_causal, no scale"])
def test_the_gpu_kernels_arguments(monkeypatch: pytest.MonkeyPatch, convention: str) -> None:
    """What the CUDA branch hands torch's varlen_attn (only a GPU runs the kernel itself: tests/test_gpu.py): the
    packed layout, grouped key heads, the key index, causality in either of torch's conventions and the scale
    (carried by the queries where the kernel takes none); the result as each segment alone."""
    def kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kw):
        assert set(kw) <= {"window_size", "is_causal", "scale"} and convention.split(",")[0] in kw
        assert ("scale" in kw) == (convention != "is_causal, no scale")
        assert query.shape[1] == key.shape[1] and cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
        return _kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kw)

    monkeypatch.setattr(varlen, "_torch_varlen", lambda: (kernel, convention.split(",")[0],
                                                          convention != "is_causal, no scale"))
    monkeypatch.setattr(varlen, "_use_torch_varlen", lambda q: True)
    torch.manual_seed(4)
    lens_q, prompt = [6, 3, 2], list(range(6))
    index = torch.tensor(prompt + prompt + [6, 7, 8] + prompt + [9, 10])
    lens_k = [6, 9, 8]
    q = torch.randn(1, 4, 11, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 11, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 11, 8, dtype=torch.float64)
    out, _ = varlen.attention(_Module(True, 2), q, k, v, None, scaling=0.2, cu_seq_lens_q=cu_of(lens_q),
                              cu_seq_lens_k=cu_of(lens_k), max_length_q=6, max_length_k=9, mmrl_key_index=index)
    torch.testing.assert_close(out, _reference(q, k[:, :, index], v[:, :, index], lens_q, lens_k, True, 0.2))


def test_a_padded_forward_builds_its_mask_once_for_all_layers(policy_of,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation's calls (a 2-D padding mask, the same tensor for every layer): the 4-D mask is built once a
    forward, as the model builds sdpa's, not once per layer."""
    policy = policy_of("qwen2_5_vl", "varlen")
    seqs = [prompt(policy, [], "Describe the picture in detail, please."), prompt(policy, [], "Hi")]
    builds = []
    build = varlen._build_dense_mask
    monkeypatch.setattr(varlen, "_build_dense_mask", lambda *a: builds.append(a[2:4]) or build(*a))
    policy.model.eval()
    try:
        with policy.inference():
            policy.generate(seqs, max_new_tokens=3, do_sample=False)
    finally:
        policy.model.train()
    layers = len(policy.base.language_model.layers)
    # three forwards (the prompt, two decode steps): once each, not once per layer
    assert builds and layers > 1 and len(builds) <= 3
