"""Prefill once per group (issue 37, part A): ``Policy.generate`` with ``prefill_once`` on runs each prompt
(vision tokens included) through the model once and decodes its G samples from copies of its KV cache,
through transformers' own ``generate`` (its sampling, logits processors, stop strings and logits output).

Real tiny models of all three families (random weights), real processors, image and video prompts, compared
with the plain call (``prefill_once`` off: ``generate`` repeats each prompt G times before its prefill):

* the same tokens under a fixed torch seed, sampled and greedy (``top_k=1`` through the sampling path, and
  ``do_sample=False``), the same texts and ``finished`` flags, log-probs and entropies within fp32 round-off,
  for a batch of prompts of different lengths (left padding) with G > 1, images and videos mixed with a
  text-only prompt, and Qwen2.5-VL seconds-per-grid != 1;
* the language model sees each prompt's tokens (and vision placeholders) once, not G times; the vision tower
  still runs once per media item for the call;
* every decode step gets the positions of the plain call (M-RoPE by the pre-training rule) and the model's
  cached rope deltas end up the same;
* stop strings end the same rows at the same tokens;
* ``rollout.prefill_once`` is a config field, on by default, and reaches the policy through the backend.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from synthetic_media import RopeProbe, image, prompt, video

from mmrl.config import RolloutConfig
from mmrl.model import FAMILIES, Generation, Policy, PolicyOptions, TokenSeq, load_policy
from mmrl.toy.tiny_models import make_tiny

G = 4


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Policy]:
    root: Path = tmp_path_factory.mktemp("prefill-once-models")
    return {family: load_policy(make_tiny(family, root / family, seed=0), device="cpu") for family in FAMILIES}


@pytest.fixture
def policy_of(policies: dict[str, Policy]):
    def get(family: str) -> Policy:
        p = policies[family]
        p.media.clear()
        p.configure(prefill_once=True)
        return p
    return get


def prompts_of(policy: Policy, family: str, kind: str) -> list[TokenSeq]:
    """Two prompts of different lengths over ``kind`` media (the batch is left-padded)."""
    if kind == "video":
        # 1 fps: Qwen2.5-VL's seconds per grid is 2, so its temporal positions are spread out
        a = prompt(policy, [video(family, "a", frames=8, fps=1.0, seed=1)], "What happens in this video, briefly?")
        b = prompt(policy, [video(family, "b", frames=4, side=6, seed=2)], "Why?")
    else:
        a = prompt(policy, [image(family, "a", seed=1)], "What is it?")
        b = prompt(policy, [image(family, "b", w=4, h=3, seed=2), image(family, "c", w=2, h=2, seed=3)],
                   "Compare the two pictures, please, in one short sentence.")
    assert len(a) != len(b)
    return [a, b]


def generate(policy: Policy, seqs: list[TokenSeq], once: bool, seed: int, **kw: Any) -> list[list[Generation]]:
    policy.configure(prefill_once=once)
    torch.manual_seed(seed)
    try:
        with policy.inference():
            return policy.generate(seqs, **{"max_new_tokens": 8, "with_entropies": True, **kw})
    finally:
        policy.configure(prefill_once=True)


def assert_same(got: list[list[Generation]], ref: list[list[Generation]]) -> None:
    assert [len(g) for g in got] == [len(r) for r in ref]
    for gens, refs in zip(got, ref):
        for g, r in zip(gens, refs):
            assert g.token_ids == r.token_ids
            assert g.text == r.text and g.finished == r.finished
            assert len(g.logprobs) == len(g.token_ids) > 0 and len(g.entropies) == len(g.token_ids)
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(r.logprobs), rtol=0, atol=1e-5)
            torch.testing.assert_close(torch.tensor(g.entropies), torch.tensor(r.entropies), rtol=0, atol=1e-5)


class PromptCounter:
    """Tokens and vision placeholders through the language model's embedding."""

    def __init__(self, policy: Policy):
        self.tokens = self.placeholders = 0
        ids = (policy.image_token_id, policy.video_token_id)

        def on_embed(_m: Any, args: tuple) -> None:
            self.tokens += args[0].numel()
            self.placeholders += sum(int((args[0] == i).sum()) for i in ids)

        self.handle = policy.base.language_model.embed_tokens.register_forward_pre_hook(on_embed)

    def close(self) -> None:
        self.handle.remove()


def placeholders(policy: Policy, seqs: list[TokenSeq]) -> int:
    return sum(1 for s in seqs for t in s.ids if t in (policy.image_token_id, policy.video_token_id))


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_same_samples_as_the_plain_call(policy_of, family: str, kind: str) -> None:
    """Sampled under a fixed seed and greedy (top_k=1 through the sampling path): tokens, texts, finished
    flags, log-probs and entropies of the plain call; each prompt's tokens through the model once; the
    vision tower once per media item."""
    policy = policy_of(family)
    seqs = prompts_of(policy, family, kind)
    width, n_new = max(len(s) for s in seqs), 8
    for sampling in ({"temperature": 0.9, "top_p": 0.95}, {"temperature": 1.0, "top_k": 1}):
        ref = generate(policy, seqs, False, 7, num_return_sequences=G, **sampling)
        counter = PromptCounter(policy)
        calls = policy.vision_calls
        policy.configure(cache_vision_features=False)  # count the tower within the call
        try:
            got = generate(policy, seqs, True, 7, num_return_sequences=G, **sampling)
        finally:
            policy.configure(cache_vision_features=True)
            counter.close()
        assert_same(got, ref)
        assert policy.vision_calls - calls == len(policy.media)  # each item once for the G samples
        # the prompts (but their last token) once, then the B*G last tokens and at most n_new - 1 steps
        assert counter.placeholders == placeholders(policy, seqs)
        assert len(seqs) * (width - 1 + G) <= counter.tokens <= len(seqs) * (width - 1 + G * (n_new + 1))
        if "top_k" in sampling:  # greedy: the G samples of a prompt agree
            assert all(g.token_ids == gens[0].token_ids for gens in got for g in gens)
        else:  # sampled: they differ (so the rows do not all read one another's cache)
            assert all(len({tuple(g.token_ids) for g in gens}) > 1 for gens in got)
    # greedy proper: one row per prompt (already computed once), copied G times
    greedy = generate(policy, seqs, True, 0, num_return_sequences=G, do_sample=False)
    for gens, top1 in zip(greedy, got):
        assert all(g.token_ids == top1[0].token_ids for g in gens)


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch_positions_and_rope_deltas(policy_of, family: str) -> None:
    """A video prompt, an image prompt and a text-only prompt in one batch: every call's positions in the
    prefill-once path are the plain call's (the prompts' columns, the last prompt token, each decode step), and
    the model's cached rope deltas are the same afterwards."""
    policy = policy_of(family)
    text = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "Hi there."}]}]))
    seqs = [prompt(policy, [video(family, "v", frames=8, fps=1.0, seed=4)], "What happens?"),
            prompt(policy, [image(family, "i", seed=5)], "Colour?"), text]
    runs: dict[bool, tuple[list[list[Generation]], list[torch.Tensor], torch.Tensor]] = {}
    for once in (False, True):
        probe = RopeProbe(policy)
        try:
            gens = generate(policy, seqs, once, 11, num_return_sequences=3, max_new_tokens=6, temperature=1.2)
        finally:
            probe.close()
        runs[once] = (gens, probe.seen, policy.base.rope_deltas.clone())
    (ref, ref_pos, ref_deltas), (got, pos, deltas) = runs[False], runs[True]
    assert_same(got, ref)
    assert torch.equal(deltas, ref_deltas)
    # plain: one (3, B*G, L) prefill, then a (3, B*G, 1) call per new token; prefill-once: a (3, B, L - 1)
    # prefill of the distinct prompts, the (3, B*G, 1) last prompt token, then the same decode steps
    assert ref_pos[0].shape[1] == 9 and pos[0].shape[1] == 3 and pos[1].shape[1] == 9
    assert torch.equal(pos[0], ref_pos[0][:, ::3, :-1])
    assert torch.equal(pos[1], ref_pos[0][..., -1:])
    assert len(pos) == len(ref_pos) + 1
    for a, b in zip(pos[2:], ref_pos[1:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_strings(policy_of, family: str) -> None:
    """A stop string that the plain call's samples contain ends the same rows at the same tokens (the rows it
    stops are padded and marked finished)."""
    policy = policy_of(family)
    seqs = prompts_of(policy, family, "video")
    free = generate(policy, seqs, False, 3, num_return_sequences=G, max_new_tokens=10)
    # two ASCII letters or digits from one sample's text, past its first character
    stop = next(g.text[i:i + 2] for gens in free for g in gens for i in range(1, len(g.text) - 1)
                if g.text[i:i + 2].isascii() and g.text[i:i + 2].isalnum())
    ref = generate(policy, seqs, False, 3, num_return_sequences=G, max_new_tokens=10, stop=[stop])
    got = generate(policy, seqs, True, 3, num_return_sequences=G, max_new_tokens=10, stop=[stop])
    assert_same(got, ref)
    stopped = [g for gens in got for g in gens if stop in g.text]
    assert stopped and all(g.finished for g in stopped)  # (its last token may run past the stop string)
    assert any(g.token_ids[-1] not in policy.eos_ids for g in stopped)  # ended by the stop string


def test_one_sample_per_prompt_is_the_plain_call(policy_of) -> None:
    """n = 1 has nothing to share: the plain call (the prompt's prefill computes its last token too)."""
    policy = policy_of("qwen2_5_vl")
    seqs = prompts_of(policy, "qwen2_5_vl", "image")
    probe = RopeProbe(policy)
    try:
        got = generate(policy, seqs, True, 5, num_return_sequences=1)
    finally:
        probe.close()
    assert probe.seen[0].shape[1:] == (2, max(len(s) for s in seqs))
    assert_same(got, generate(policy, seqs, False, 5, num_return_sequences=1))


def test_plain_call_where_prefill_once_does_not_apply(policy_of) -> None:
    """A prompt that ends on a vision token (its last token would need the features) and a checkpoint whose
    generation config names a cache implementation take the plain call: the prompt G times."""
    policy = policy_of("qwen2_vl")
    p = prompt(policy, [image("qwen2_vl", "a", seed=1)], "What is it?")
    end = max(i for i, t in enumerate(p.mm_types) if t != 0) + 1
    cut = replace(p, ids=p.ids[:end], mm_types=p.mm_types[:end], loss_mask=p.loss_mask[:end])
    ok = prompt(policy, [image("qwen2_vl", "b", seed=2)], "And this?")
    cfg = policy.model.generation_config
    for seqs, cache in (([cut, ok], None), ([ok], "dynamic")):
        old, cfg.cache_implementation = cfg.cache_implementation, cache
        counter = PromptCounter(policy)
        try:
            got = generate(policy, seqs, True, 9, num_return_sequences=G)
        finally:
            counter.close()
            cfg.cache_implementation = old
        assert counter.placeholders == G * placeholders(policy, seqs)
        assert_same(got, generate(policy, seqs, False, 9, num_return_sequences=G))


def test_config_key_reaches_the_policy(policy_of, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.config import load_run_config
    from mmrl.engine.rollout import backend_from_config

    assert RolloutConfig().prefill_once is True
    assert PolicyOptions.prefill_once is True
    policy = policy_of("qwen2_5_vl")
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    off = load_run_config("video-qa", overrides=["rollout.prefill_once=false"])
    assert off.rollout.prefill_once is False
    backend_from_config(off, policy)
    assert policy.options.prefill_once is False
    backend_from_config(load_run_config("video-qa"), policy)
    assert policy.options.prefill_once is True


def test_no_processor_for_neutral_settings(policy_of, monkeypatch: pytest.MonkeyPatch) -> None:
    """min_p and min_new_tokens that the checkpoint leaves unset stay unset (their neutral values would add a
    min-p warper and a min-length check at every step that change nothing); a checkpoint's own min_p or
    min_new_tokens is still overridden by the neutral value."""
    policy = policy_of("qwen2_5_vl")
    model = policy.model
    seen: list[list[Any]] = []
    real = type(model)._get_logits_processor

    def spy(self: Any, *a: Any, **kw: Any) -> Any:
        out = real(self, *a, **kw)
        seen.append(list(out))
        return out

    monkeypatch.setattr(type(model), "_get_logits_processor", spy)
    seqs = prompts_of(policy, "qwen2_5_vl", "image")
    generate(policy, seqs, True, 1, num_return_sequences=G)
    assert [type(p).__name__ for p in seen[-1]] == ["SuppressTokensLogitsProcessor"]
    cfg = model.generation_config
    monkeypatch.setattr(cfg, "min_p", 0.2)
    monkeypatch.setattr(cfg, "min_new_tokens", 5)
    got = generate(policy, seqs, True, 1, num_return_sequences=G)
    names = [type(p).__name__ for p in seen[-1]]
    assert "MinNewTokensLengthLogitsProcessor" not in names and all(g.token_ids for gens in got for g in gens)
    # present, with the neutral 0.0 (the checkpoint's 0.2 would cut the distribution)
    assert [p.min_p for p in seen[-1] if type(p).__name__ == "MinPLogitsWarper"] == [0.0]
