"""The passes every DeepSpeed rank must make alike (``Policy.rank_invariant``), in one process: the vision tower
runs once per pass (all of its images and videos in one call; a one-token dummy when the pass has no media),
the LM head as many times as asked, both shared-prefix passes always; none of it changes a log-prob or a
gradient. Under torchrun these keep ZeRO-3's per-module gathers in step (tests/test_distributed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synthetic_media import image, prompt, video

from mmrl.model import FAMILIES, RankBinding, TokenSeq, load_policy
from mmrl.model.logprob_head import token_logprobs as _token_logprobs
from mmrl.toy.tiny_models import ensure_tiny


@pytest.fixture(scope="module", params=FAMILIES)
def policy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", str(tmp_path_factory.mktemp("cache")))
    p = load_policy(ensure_tiny(request.param), device="cpu")
    p.model.train()
    yield p
    mp.undo()


def _batch(policy) -> list[TokenSeq]:
    fam = policy.family
    media = [prompt(policy, [video(fam, "v", frames=4), image(fam, "i")], "What is shown?"),
             prompt(policy, [image(fam, "j", seed=1)], "And here?")]
    g = torch.Generator().manual_seed(0)
    return [p.extend(torch.randint(100, 300, (n,), generator=g).tolist(), trained=True) for p in media for n in (3, 5)]


def _text(policy) -> list[TokenSeq]:
    ids = policy.tokenizer("A question with no media at all.")["input_ids"]
    return [TokenSeq(ids=ids + [120, 130], mm_types=[0] * (len(ids) + 2), loss_mask=[0] * len(ids) + [1, 1])]


def _logps_and_grads(policy, seqs: list[TokenSeq]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    policy.model.zero_grad(set_to_none=True)
    logp, _, mask = policy.forward_logprobs(seqs)
    (-(logp * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("batch", ["media", "text only"])
def test_rank_invariant_passes_change_nothing_but_the_calls(policy, batch: str) -> None:
    seqs = _batch(policy) if batch == "media" else _text(policy)
    policy.bind_ranks(RankBinding(invariant=None))
    calls = policy.tower_calls
    policy.configure(shared_prefix_one_pass=False)  # the two passes the rank-invariant mode always makes
    try:
        want, want_grads = _logps_and_grads(policy, seqs)
    finally:
        policy.configure(shared_prefix_one_pass=None)
    normal_calls = policy.tower_calls - calls
    policy.bind_ranks(RankBinding(invariant="calls"))
    try:
        calls, items = policy.tower_calls, policy.vision_calls
        got, got_grads = _logps_and_grads(policy, seqs)
        # one tower call per pass (the shared-prefix pass 1 here): every media item in it, or the dummy
        assert policy.tower_calls - calls == 1
        assert policy.vision_calls - items == (3 if batch == "media" else 0)  # the dummy is no media item
    finally:
        policy.bind_ranks(RankBinding(invariant=None))
    assert normal_calls == (1 if batch == "media" else 0)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # every parameter that had a gradient has the same one; the tower gets (zero) gradients without media too
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)
    if batch == "text only":
        tower = {n for n in got_grads if ".visual." in f".{n}"}
        assert tower and all(not got_grads[n].any() for n in tower)


def test_padded_lm_head_calls_change_no_value_or_gradient(policy) -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, policy.model.config.text_config.hidden_size, generator=g, requires_grad=True)
    targets = torch.randint(0, 100, (5,), generator=g)
    head = policy.model.lm_head
    calls = []
    handle = head.register_forward_hook(lambda *_: calls.append(1))
    try:
        outs = []
        for pad in (0, 6):  # 5 rows in chunks of 2: 3 calls, or padded to 6
            calls.clear()
            hidden.grad = None
            lp, _ = _token_logprobs(head, hidden, targets, 1.0, with_entropy=False, entropy_grad=False, chunk=2,
                                   calls=pad)
            forward = len(calls)
            lp.sum().backward()  # each chunk's logits are recomputed: the same calls again, dummies included
            outs.append((lp.detach(), hidden.grad.clone(), forward, len(calls) - forward))
    finally:
        handle.remove()
    (lp0, g0, c0, b0), (lp1, g1, c1, b1) = outs
    assert (c0, b0) == (3, 3) and (c1, b1) == (6, 6)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=0)


def test_one_tower_call_encodes_images_and_videos_as_one_at_a_time_does(policy, tmp_path: Path) -> None:
    """The batched tower call (all of a pass's media at once) gives each item's features as its own call."""
    fam = policy.family
    items = [video(fam, "va", frames=4), image(fam, "ia"), video(fam, "vb", frames=8, seed=2)]
    prompt(policy, items, "?")
    with torch.no_grad():
        calls = policy.tower_calls
        together = policy.vision_features([m.key for m in items])
        assert policy.tower_calls - calls == 1
        policy.configure(cache_vision_features=False)
        try:
            alone = {m.key: policy.vision_features([m.key])[m.key] for m in items}
        finally:
            policy.configure(cache_vision_features=True)
    for key in together:
        torch.testing.assert_close(together[key][0], alone[key][0], rtol=1e-4, atol=1e-5)
