"""Chunked log-probs of the chosen tokens (``Policy.forward_logprobs``) and the peak-memory helpers.

* the chunked path (chunk sizes that do and do not divide the token count) gives the log-probs, entropies
  and gradients (every parameter, so the hidden states and the LM head) of a straightforward reference:
  the Hugging Face model's own full logits, a full log-softmax, with and without temperature, entropies with
  and without gradient; the unchunked path (chunk 0) does too;
* no full-vocabulary tensor of the whole micro-batch is kept for backward, and the measured peak memory of a
  micro-batch (forward + backward) with a large vocabulary is at most a third of the unchunked one;
* :mod:`mmrl.engine.memory` measures a known allocation, in-process and in a fresh process.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmrl.engine.memory import measure, measure_in_subprocess, peak_gb, reset_peak
from mmrl.model import Policy, PolicyOptions, TokenSeq, load_policy
from mmrl.toy.tiny_models import build_model, make_tiny

FAMILY = "qwen2_5_vl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(FAMILY, tmp_path_factory.mktemp("logprob-model") / FAMILY, seed=0)


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Policy:
    p = load_policy(model_dir, device="cpu")
    p.set_trainable()
    p.model.train()  # no dropout in Qwen-VL: train mode only makes the test a training pass
    return p


def text_batch(policy: Policy, lengths: list[tuple[int, int]], seed: int = 0, low: int = 40,
               high: int | None = None) -> list[TokenSeq]:
    """Text sequences of (prompt, response) lengths with random ids in [low, high); responses trained on."""
    rng = np.random.default_rng(seed)
    high = high or len(policy.tokenizer) - 40  # below the special tokens (vision placeholders)
    return [TokenSeq(ids=rng.integers(low, high, p + r).tolist(), mm_types=[0] * (p + r),
                     loss_mask=[0] * p + [1] * r) for p, r in lengths]


def reference(policy: Policy, seqs: list[TokenSeq], temperature: float):
    """The model's own logits over every position, a full fp32 log-softmax: (logps, entropies, mask), (B, L)."""
    batch = policy.pad(seqs, left=False)
    logits = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          use_cache=False).logits
    logp_all = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    logp = logp_all.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    mask = batch["loss_mask"][:, 1:]
    zero = torch.zeros(len(seqs), 1)
    return (torch.cat([zero, logp * mask], 1), torch.cat([zero, ent * mask], 1),
            torch.cat([zero.long(), mask], 1))


def loss_of(logp: torch.Tensor, ent: torch.Tensor | None, mask: torch.Tensor, entropy_grad: bool) -> torch.Tensor:
    """A scalar with different weights per token (so a wrong row or a swapped chunk shows in the gradients)."""
    w = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape) * mask
    loss = (logp * w).sum()
    if entropy_grad:
        loss = loss + 0.3 * (ent * w.flip(-1)).sum()
    return loss


def grads(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_logprobs_equal_full_log_softmax(policy: Policy, temperature: float, entropy_grad: bool) -> None:
    seqs = text_batch(policy, [(5, 9), (3, 14), (7, 4)])  # 27 trained tokens, ragged, right-padded
    policy.model.zero_grad(set_to_none=True)
    ref_logp, ref_ent, ref_mask = reference(policy, seqs, temperature)
    loss_of(ref_logp, ref_ent, ref_mask, entropy_grad).backward()
    ref_grads = grads(policy)
    assert "lm_head.weight" in ref_grads and any("layers.0." in n for n in ref_grads)
    for chunk in (4, 27, 1024, 0):  # 4 does not divide 27; 0 is the unchunked path
        policy.model.zero_grad(set_to_none=True)
        logp, ent, mask = policy.forward_logprobs(seqs, temperature=temperature, with_entropy=True,
                                                  entropy_grad=entropy_grad, chunk_tokens=chunk)
        assert torch.equal(mask, ref_mask)
        torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
        assert ent.requires_grad == entropy_grad
        loss_of(logp, ent, mask, entropy_grad).backward()
        got = grads(policy)
        assert got.keys() == ref_grads.keys()
        for name, g in ref_grads.items():  # fp32 round-off, relative to the gradient's own scale
            err = float((got[name] - g).abs().max())
            assert err <= 1e-5 * float(g.abs().max()) + 1e-9, f"chunk {chunk}: {name}: max error {err}"


def test_bf16_model_chunked_equals_unchunked(model_dir: Path) -> None:
    """bf16 logits: both paths take the fp32 log-softmax of the same bf16 logits; gradients come back in bf16."""
    policy = load_policy(model_dir, dtype="bf16", device="cpu")
    policy.set_trainable()
    seqs = text_batch(policy, [(5, 9), (3, 14)], seed=4)
    out = {}
    for chunk in (0, 4):
        policy.model.zero_grad(set_to_none=True)
        logp, ent, mask = policy.forward_logprobs(seqs, temperature=0.7, with_entropy=True, entropy_grad=False,
                                                  chunk_tokens=chunk)
        loss_of(logp, ent, mask, False).backward()
        out[chunk] = (logp.detach(), ent, grads(policy))
    assert out[4][0].dtype == torch.float32
    torch.testing.assert_close(out[4][0], out[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[4][1], out[0][1], rtol=1e-5, atol=1e-5)
    for name, g in out[0][2].items():  # bf16 round-off of the gradients
        assert out[4][2][name].dtype == torch.bfloat16
        err = float((out[4][2][name].float() - g.float()).abs().max())
        assert err <= 2e-2 * float(g.float().abs().max()) + 1e-6, f"{name}: max error {err}"


def test_default_chunk_setting_and_gradient_free_pass(policy: Policy) -> None:
    seqs = text_batch(policy, [(4, 6), (2, 11)], seed=1)
    assert PolicyOptions.logprob_chunk_tokens and PolicyOptions.logprob_chunk_tokens > 0  # chunked by default
    with policy.inference():
        full, full_ent, _ = policy.forward_logprobs(seqs, with_entropy=True, chunk_tokens=0)
        chunked, ent, _ = policy.forward_logprobs(seqs, with_entropy=True, chunk_tokens=5)
        no_ent = policy.forward_logprobs(seqs, chunk_tokens=5)[1]
    assert not chunked.requires_grad and not ent.requires_grad and no_ent is None
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, full_ent, rtol=1e-5, atol=1e-5)
    policy.configure(logprob_chunk_tokens=3)  # the instance setting is what chunk_tokens=None uses
    try:
        with policy.inference():
            by_setting = policy.forward_logprobs(seqs)[0]
    finally:
        policy.configure(logprob_chunk_tokens=PolicyOptions.logprob_chunk_tokens)
    torch.testing.assert_close(by_setting, full, rtol=1e-5, atol=1e-5)


def test_nothing_trained_gives_zeros(policy: Policy) -> None:
    seqs = [TokenSeq(ids=[50, 51, 52], mm_types=[0, 0, 0])]  # no policy tokens
    logp, ent, mask = policy.forward_logprobs(seqs, with_entropy=True, chunk_tokens=4)
    assert mask.sum() == 0 and torch.equal(logp, torch.zeros(1, 3)) and torch.equal(ent, torch.zeros(1, 3))


def _saved_vocab_rows(policy: Policy, seqs: list[TokenSeq], chunk: int) -> list[int]:
    """Rows of every full-vocabulary tensor (last dimension = vocabulary) saved for backward by one pass, the
    LM head's own weight (saved by its matmul) left out."""
    vocab = policy.model.lm_head.out_features
    weight = policy.model.lm_head.weight.untyped_storage().data_ptr()
    rows: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() and t.shape[-1] == vocab and t.untyped_storage().data_ptr() != weight:
            rows.append(t.numel() // vocab)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _, mask = policy.forward_logprobs(seqs, with_entropy=True, entropy_grad=False, chunk_tokens=chunk)
    (logp * mask).sum().backward()
    return rows


def test_no_full_vocabulary_tensor_is_kept_for_backward(policy: Policy) -> None:
    seqs = text_batch(policy, [(3, 20), (3, 20)], seed=2)  # 40 trained tokens
    policy.model.zero_grad(set_to_none=True)
    assert max(_saved_vocab_rows(policy, seqs, chunk=0)) == 40  # the hook sees the full log-softmax
    assert max(_saved_vocab_rows(policy, seqs, chunk=8), default=0) <= 8  # at most one chunk's logits


# ------------------------------------------------------------------------------------------------ memory
def big_vocab_step(model_dir: str, vocab: int, chunk: int):
    """Setup for :func:`measure_in_subprocess`: the tiny model with a ``vocab``-row embedding and LM head,
    4 x 256 trained tokens; the returned work is one micro-batch (forward_logprobs, loss, backward)."""
    from transformers import AutoConfig, AutoProcessor

    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(model_dir)
    config.text_config.vocab_size = vocab
    policy = Policy(build_model(FAMILY, config, seed=0), AutoProcessor.from_pretrained(model_dir))
    policy.set_trainable()
    policy.model.train()
    seqs = text_batch(policy, [(4, 256)] * 4, seed=3, low=2000, high=vocab)

    def work() -> int:
        logp, _, mask = policy.forward_logprobs(seqs, with_entropy=True, entropy_grad=False, chunk_tokens=chunk)
        (-(logp * mask).sum() / mask.sum()).backward()
        return int(mask.sum())

    return work


@pytest.mark.slow
def test_chunked_peak_memory_is_at_most_a_third(model_dir: Path) -> None:
    """One micro-batch (forward + backward) with a 32k vocabulary and 1024 trained tokens, each way in a
    fresh process: each full (tokens x vocabulary) fp32 tensor is 134 MB, a 128-row chunk's 17 MB."""
    vocab = 32768
    peaks = {}
    for chunk in (128, 0):
        peak, tokens = measure_in_subprocess(big_vocab_step, str(model_dir), vocab, chunk)
        assert tokens == 1024
        peaks[chunk] = peak.extra_bytes
    assert peaks[0] > 1024 * vocab * 4  # the unchunked path holds at least one full fp32 tensor
    assert peaks[128] <= peaks[0] / 3, peaks


def test_measure_counts_a_known_allocation() -> None:
    size = 200 * 2**20
    with measure("cpu") as peak:
        block = torch.ones(size // 4)  # written: its pages are resident
        del block
    assert peak.method in ("cpu-rss-hwm", "cpu-rss-lifetime-max")
    assert peak.extra_bytes >= 0.95 * size  # the kernel's resident-set counters lag by a few hundred kB
    if peak.method == "cpu-rss-hwm":
        assert peak.extra_bytes < 2 * size
    reset_peak("cpu")
    assert 0 < peak_gb("cpu") < peak.peak_bytes / 1e9 + 0.1


@pytest.mark.slow
def test_measure_in_subprocess_excludes_setup() -> None:
    # setup: functools.partial(os.urandom, n) (nothing allocated yet); work: os.urandom(n), n bytes written
    n = 100 * 2**20
    peak, out = measure_in_subprocess(functools.partial, os.urandom, n)
    assert len(out) == n
    assert 0.95 * n <= peak.extra_bytes < 3 * n  # the returned bytes and their pickle, not the child's imports
    with pytest.raises(RuntimeError, match="ValueError"):
        measure_in_subprocess(functools.partial, int, "not a number")
