"""The prompt once per group in log-prob passes (issue 11, item 3): ``Policy.forward_logprobs`` with
``shared_prefix`` on runs each group's common prompt through the language model once and the group's
continuations against its KV cache.

Real tiny models of all three families (random weights), real processors, image and video prompts:

* log-probs, entropies (with gradient) and every parameter's gradient (vision tower, merger, language model,
  LM head) equal the padded batch's within fp32 round-off, for micro-batches with two groups of ragged
  completion lengths, a group of one sequence, and a group whose rows also share the start of their answers;
* the prompt's tokens go through the language model once per group (counted at the embedding and the first
  decoder layer), the vision placeholders once per group;
* groups that cannot share (vision tokens after the common part, a micro-batch of singletons) take the
  padded path and give the same results; gradient-free passes (``inference()``) share too;
* under activation checkpointing the shared path still runs and its values and gradients still equal the
  padded batch's (the prefix's keys and values are written once, recomputation reads the same);
* ``train.shared_prefix`` is a config field, on by default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from synthetic_media import image, prompt, video
from test_packing import SHORTCUT_FAMILIES

from mmrl.config import TrainConfig
from mmrl.model import (
    Policy,
    PolicyOptions,
    TokenSeq,
    checkpointing_switch,
    load_policy,
    shared_prefix,
)
from mmrl.toy.tiny_models import make_tiny


def answer(policy: Policy, n: int, seed: int) -> list[int]:
    """``n`` random text tokens and <|im_end|>."""
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(100, 1000, (n,), generator=g).tolist()
    return ids + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def group(policy: Policy, p: TokenSeq, lengths: list[int], seed: int) -> list[TokenSeq]:
    return [p.extend(answer(policy, n, seed + i), trained=True) for i, n in enumerate(lengths)]


def loss_of(logp: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Different weights per token, so a wrong row or position shows in the gradients."""
    w = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape) * mask
    return (logp * w).sum() + 0.3 * (ent * w.flip(-1)).sum()


def run(policy: Policy, seqs: list[TokenSeq], shared: bool, **kw: Any):
    policy.model.zero_grad(set_to_none=True)
    logp, ent, mask = policy.forward_logprobs(seqs, temperature=0.9, with_entropy=True, entropy_grad=True,
                                              shared_prefix=shared, **kw)
    loss_of(logp, ent, mask).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), mask, grads


def assert_same(policy: Policy, seqs: list[TokenSeq], vision: bool = True, **kw: Any) -> None:
    ref_logp, ref_ent, ref_mask, ref_grads = run(policy, seqs, shared=False, **kw)
    logp, ent, mask, got = run(policy, seqs, shared=True, **kw)
    assert torch.equal(mask, ref_mask)
    assert int(mask.sum()) > 0
    scale = float(ref_logp.abs().max())
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5 * float(ref_ent.abs().max()))
    assert got.keys() == ref_grads.keys()
    # the vision tower, its merger, the language model and the head all receive gradients
    if vision:
        assert any(n.startswith("model.visual.") and "merger" not in n for n in got)
        assert any("merger" in n for n in got)
    assert "lm_head.weight" in got
    assert any("language_model.layers.0." in n for n in got)
    for name, g in ref_grads.items():  # fp32 round-off, relative to the gradient's own scale
        err = float((got[name] - g).abs().max())
        assert err <= 1e-5 * float(g.abs().max()) + 1e-9, f"{name}: max error {err}"


class TokenCounter:
    """Tokens through the embedding (all, and vision placeholders) and the first decoder layer."""

    def __init__(self, policy: Policy):
        self.embedded = self.placeholders = self.layer0 = 0
        ids = {policy.image_token_id, policy.video_token_id}
        lm = policy.base.language_model

        def on_embed(_m: Any, args: tuple) -> None:
            self.embedded += args[0].numel()
            self.placeholders += sum(int((args[0] == i).sum()) for i in ids)

        def on_layer(_m: Any, args: tuple, kwargs: dict) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            self.layer0 += h.shape[0] * h.shape[1]

        self.handles = [lm.embed_tokens.register_forward_pre_hook(on_embed),
                        lm.layers[0].register_forward_pre_hook(on_layer, with_kwargs=True)]

    def close(self) -> None:
        for h in self.handles:
            h.remove()


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Policy]:
    root: Path = tmp_path_factory.mktemp("shared-prefix-models")
    out = {}
    for family in SHORTCUT_FAMILIES:
        policy = load_policy(make_tiny(family, root / family, seed=0), device="cpu")
        policy.set_trainable()  # vision tower, merger and language model all train
        policy.model.train()
        out[family] = policy
    return out


@pytest.fixture
def policy_of(policies: dict[str, Policy]):
    def get(family: str) -> Policy:
        p = policies[family]
        p.media.clear()
        return p
    return get


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_shared_prefix_equals_padded_batch(policy_of, family: str, kind: str) -> None:
    """Two groups of ragged completions, then a group of one: values and every gradient as padded."""
    policy = policy_of(family)
    if kind == "video":
        media_a = [video(family, "a", seed=1)]
        media_b = [video(family, "b", frames=4, side=6, seed=2)]
    else:
        media_a = [image(family, "a", seed=1)]
        media_b = [image(family, "b", w=4, h=3, seed=2), image(family, "c", w=2, h=2, seed=3)]
    pa = prompt(policy, media_a, "What happens here?")
    pb = prompt(policy, media_b, "Describe it in one word.")
    pc = prompt(policy, [image(family, "d", seed=4)], "Alone?")
    seqs = group(policy, pa, [3, 9, 1, 5], seed=0) + group(policy, pb, [6, 2, 4], seed=10) \
        + group(policy, pc, [7], seed=20)
    vision = policy.video_token_id if kind == "video" else policy.image_token_id
    assert pa.ids.count(vision) >= 6 and pb.ids.count(vision) >= 6
    assert_same(policy, seqs)
    assert_same(policy, seqs, chunk_tokens=5)  # the chunked head sees the same rows


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_common_answer_start_and_inference(policy_of, family: str) -> None:
    """Rows that also share the start of their answers (the shared part runs past the prompt), a trained
    token right after the shared part, and the gradient-free pass of the reference/old log-probs."""
    policy = policy_of(family)
    p = prompt(policy, [video(family, "v", seed=5)], "Why?")
    start = p.extend(answer(policy, 4, 50)[:4], trained=True)  # four common trained tokens
    seqs = [start.extend(answer(policy, n, 60 + n), trained=True) for n in (2, 5, 3)]
    assert_same(policy, seqs)
    with policy.inference():
        ref = policy.forward_logprobs(seqs, with_entropy=True, shared_prefix=False)
        got = policy.forward_logprobs(seqs, with_entropy=True, shared_prefix=True)
    for a, b in zip(got[:2], ref[:2]):
        assert not a.requires_grad
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_prompt_tokens_once_per_group(policy_of, family: str) -> None:
    """With equal completion lengths (no padding anywhere): the language model sees each group's prompt once
    and each completion once; the padded batch sees the prompt once per row."""
    policy = policy_of(family)
    pa = prompt(policy, [video(family, "a", seed=1)], "What happens here?")
    pb = prompt(policy, [image(family, "b", seed=2)], "Which colour?")
    assert len(pa) > len(pb)
    n_ans = 6  # answer tokens per row (5 + <|im_end|>)
    seqs = group(policy, pa, [5] * 4, seed=0) + group(policy, pb, [5] * 3, seed=10)
    placeholders = sum(1 for t in pa.ids + pb.ids if t in (policy.image_token_id, policy.video_token_id))
    counts = {}
    policy.configure(padding_free=False)  # the padded layouts' counts (padding-free ones: tests/test_packing.py)
    for shared in (False, True):
        counter = TokenCounter(policy)
        try:
            with policy.inference():
                policy.forward_logprobs(seqs, shared_prefix=shared)
        finally:
            counter.close()
        counts[shared] = counter
    policy.configure(padding_free=True)
    padded, once = counts[False], counts[True]
    assert padded.layer0 == 7 * (len(pa) + n_ans)  # every row whole, padded to the longest
    assert padded.placeholders == 4 * pa.ids.count(policy.video_token_id) + 3 * pb.ids.count(policy.image_token_id)
    # pass 1: the two prompts (padded to the longer), pass 2: the seven answers
    assert once.layer0 == 2 * len(pa) + 7 * n_ans
    assert once.embedded == once.layer0
    assert once.placeholders == placeholders  # each group's vision tokens once


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_unshareable_groups_take_the_padded_path(policy_of, family: str) -> None:
    """Vision tokens after the rows' common part (a later turn with an image of its own, a multi-turn episode)
    and all-singleton micro-batches run whole; the results equal the padded batch's (they are it)."""
    policy = policy_of(family)
    p = prompt(policy, [image(family, "a", seed=1)], "Look.")
    turn = prompt(policy, [image(family, "b", seed=2)], "And now?")
    seqs = [p.extend(answer(policy, n, 1 + n), trained=True)
            .extend(turn.ids, trained=False, mm_types=turn.mm_types, media=turn.media)
            .extend(answer(policy, 2 + n, 2 + n), trained=True) for n in (3, 4)]
    assert shared_prefix.prefix_plan(seqs) is None
    assert_same(policy, seqs)
    singles = [p.extend(answer(policy, 3, 4), trained=True),
               prompt(policy, [image(family, "c", seed=3)], "Other.").extend(answer(policy, 2, 5), trained=True)]
    assert shared_prefix.prefix_plan(singles) is None
    # a mixed micro-batch: the shareable group shares, the multi-turn rows run whole in the same pass
    mixed = group(policy, p, [2, 6], seed=30) + seqs
    plan = shared_prefix.prefix_plan(mixed)
    assert plan is not None and [n > 0 for _, n in plan] == [True, False]
    assert_same(policy, mixed)


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_activation_checkpointing(policy_of, family: str) -> None:
    policy = policy_of(family)
    pa = prompt(policy, [video(family, "a", seed=1)], "What happens here?")
    pb = prompt(policy, [image(family, "b", seed=2)], "Which colour?")
    seqs = group(policy, pa, [4, 1, 6], seed=0) + group(policy, pb, [3, 5], seed=10)
    checkpointing_switch(policy.model, True)
    try:
        assert any(getattr(m, "gradient_checkpointing", False) for m in policy.base.language_model.modules())
        counter = TokenCounter(policy)
        try:
            policy.forward_logprobs(seqs, shared_prefix=True)
        finally:
            counter.close()
        assert counter.placeholders == pa.ids.count(policy.video_token_id) + pb.ids.count(policy.image_token_id)
        assert_same(policy, seqs)
    finally:
        checkpointing_switch(policy.model, False)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in policy.base.language_model.modules())
    assert not any("_can_checkpoint_with_cache" in vars(m) for m in policy.model.modules())


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_text_only_groups(policy_of, family: str) -> None:
    """Text-only prompts (plain positions on all three M-RoPE axes), alone and beside an image group."""
    policy = policy_of(family)
    text = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "Count to 3."}]}]))
    other = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "Hi."}]}]))
    seqs = group(policy, text, [4, 2, 7], seed=3) + group(policy, other, [1, 5], seed=9)
    plan = shared_prefix.prefix_plan(seqs)
    assert plan is not None and [rows for rows, _ in plan] == [[0, 1, 2], [3, 4]]
    assert plan[0][1] >= len(text) and plan[1][1] >= len(other)
    assert_same(policy, seqs, vision=False)
    pic = prompt(policy, [image(family, "a", seed=1)], "Look.")
    assert_same(policy, seqs[:3] + group(policy, pic, [3, 6], seed=20))


def test_setting_defaults_on() -> None:
    assert TrainConfig().shared_prefix is True
    assert PolicyOptions.shared_prefix is True
