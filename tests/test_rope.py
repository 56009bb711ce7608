"""M-RoPE positions by the rule the Qwen-VL models were pre-trained with (issue 11, item 2).

Text after a vision block resumes at the block's largest position + 1 (the original Qwen releases, vLLM).
transformers 5.23 resumes at ``start + max(H, W)`` for Qwen2-VL / Qwen2.5-VL, ignoring a video's temporal
extent. Real tiny models (random weights), real processors:

* a video with more temporal than spatial extent (16 frames at 56 px: merged grid 8 x 2 x 2): every
  position pinned to numbers derived by hand, in ``Policy.position_ids`` and in the model's own forward;
* a padded batch (left or right) gets each sequence's own positions and rope deltas;
* greedy ``generate`` decodes at the hand-derived positions and its log-probs equal ``forward_logprobs``;
* images are positioned as before (transformers' rule is already the original one for them).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from synthetic_media import RopeProbe, image, prompt, video

from mmrl.model import FAMILIES, MediaInput, Policy, TokenSeq, inputs, load_policy
from mmrl.toy.tiny_models import make_tiny

VIDEO_FRAMES = 16  # temporal patch 2 -> 8 temporal grid steps
# hand-derived: merged temporal index t' of each of the 8 temporal patches. Qwen2.5-VL: t' = floor(t x
# seconds-per-grid x tokens-per-second) = t x 1 s x 2 (frames at 2 fps, temporal patch 2, tiny config 2/s)
VIDEO_T = {"qwen2_vl": [0, 1, 2, 3, 4, 5, 6, 7], "qwen2_5_vl": [0, 2, 4, 6, 8, 10, 12, 14]}
# text after the video resumes at start + (largest t' + 1); transformers 5.23 would give start + 2
RESUME = {"qwen2_vl": 8, "qwen2_5_vl": 15}


def long_video(family: str, key: str, fps: float = 2.0, frames: int = VIDEO_FRAMES, seed: int = 0) -> MediaInput:
    """``frames`` frames of 4 x 4 patches (a 2 x 2 merged grid) sampled at ``fps``."""
    return video(family, key, frames=frames, side=4, fps=fps, seed=seed)


def answer(policy: Policy, n: int) -> list[int]:
    return list(range(100, 100 + n)) + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, end) of each run of ``token`` in ``ids``."""
    out, i = [], 0
    while i < len(ids):
        if ids[i] == token:
            j = i
            while j < len(ids) and ids[j] == token:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def positions_of(policy: Policy, seqs: list[TokenSeq], *, left: bool = False) -> torch.Tensor:
    return policy.position_ids(policy.pad(seqs, left=left), seqs)


def own_forward_positions(policy: Policy, seq: TokenSeq) -> torch.Tensor:
    """(3, L) positions the model computes itself in a plain forward (no position ids passed)."""
    batch = policy.pad([seq], left=False)
    grid = inputs.grid_kwargs(policy, [seq])
    probe = RopeProbe(policy)
    try:
        policy.base.rope_deltas = None
        with torch.no_grad():
            policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         mm_token_type_ids=batch["mm_token_type_ids"],
                         pixel_values_videos=torch.cat([policy.media[k].pixel_values for k in seq.media]),
                         use_cache=False, **grid)
    finally:
        probe.close()
    assert len(probe.seen) == 1
    return probe.seen[0][:, 0]


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Policy]:
    root: Path = tmp_path_factory.mktemp("rope-models")
    out = {}
    for family in FAMILIES:
        policy = load_policy(make_tiny(family, root / family, seed=0))
        policy.model.eval()
        out[family] = policy
    return out


@pytest.fixture
def policy_of(policies: dict[str, Policy]):
    def get(family: str) -> Policy:
        p = policies[family]
        p.media.clear()
        return p
    return get


# ------------------------------------------------------------------------------------------------ (a) video
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_text_after_a_long_video_resumes_after_its_largest_position(policy_of, family: str) -> None:
    policy = policy_of(family)
    seq = prompt(policy, [long_video(family, "v")], "What happens?").extend(answer(policy, 5), trained=True)
    assert policy.media["v"].grid_thw.tolist() == [8, 4, 4]  # 8 temporal steps, 2 x 2 merged tokens each
    if family == "qwen2_5_vl":
        assert policy.media["v"].second_per_grid == pytest.approx(1.0)
    (s, e), = runs(seq.ids, policy.video_token_id)
    assert e - s == 32
    n = len(seq)
    expected = torch.zeros(3, n, dtype=torch.long)
    expected[:, :s] = torch.arange(s)  # text before the video
    for k in range(32):  # video tokens in (t, h, w) order, each axis offset by the start s
        t, h, w = k // 4, (k // 2) % 2, k % 2
        expected[:, s + k] = torch.tensor([s + VIDEO_T[family][t], s + h, s + w])
    expected[:, e:] = s + RESUME[family] + torch.arange(n - e)  # text after: largest + 1, then +1 per token
    assert int(expected[0, e]) == s + RESUME[family] and int(expected.max()) == n - 1 - (32 - RESUME[family])

    got = positions_of(policy, [seq])[:, 0]
    assert torch.equal(got, expected), (got[:, e - 2:e + 3], expected[:, e - 2:e + 3])
    # the model's own forward (positions computed inside, from the grids and seconds per grid) agrees
    assert torch.equal(own_forward_positions(policy, seq), expected)
    # and the rope delta the model caches for decoding is largest position + 1 - length
    _, delta = policy.base.get_rope_index(
        policy.pad([seq], left=False)["input_ids"], mm_token_type_ids=policy.pad([seq], left=False)[
            "mm_token_type_ids"], **inputs.grid_kwargs(policy, [seq]))
    assert delta.tolist() == [[RESUME[family] - 32]]


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_video_frame_groups_each_resume_after_their_largest_position(policy_of, family: str) -> None:
    """Qwen3-VL (and Qwen3-VL MoE, which positions as Qwen3-VL): one block per temporal patch (a timestamp
    before each), each 2 x 2 tokens, so each advances the text positions by 2 (what transformers does too)."""
    policy = policy_of(family)
    seq = prompt(policy, [long_video(family, "v")], "What happens?").extend(answer(policy, 5), trained=True)
    assert policy.media["v"].grid_thw.tolist() == [8, 4, 4]
    blocks = runs(seq.ids, policy.video_token_id)
    assert [e - s for s, e in blocks] == [4] * 8
    got = positions_of(policy, [seq])[:, 0]
    assert torch.equal(own_forward_positions(policy, seq), got)
    batch = policy.pad([seq], left=False)  # transformers' own (class) rule agrees for Qwen3-VL videos
    hf, _ = type(policy.base).get_rope_index(policy.base, batch["input_ids"], mm_token_type_ids=batch[
        "mm_token_type_ids"], attention_mask=batch["attention_mask"], **inputs.grid_kwargs(policy, [seq]))
    assert torch.equal(hf[:, 0], got)
    shift = 0  # positions lost so far: each block of 4 tokens takes 2 positions
    for s, e in blocks:
        start = s - shift
        assert torch.equal(got[:, s], torch.arange(s - shift, s - shift + 1).expand(3)), "text before a block"
        assert got[0, s:e].tolist() == [start] * 4
        assert got[1, s:e].tolist() == [start, start, start + 1, start + 1]
        assert got[2, s:e].tolist() == [start, start + 1, start, start + 1]
        assert got[:, e].tolist() == [start + 2] * 3  # the timestamp / vision_end after it
        shift += 2
    n = len(seq)
    assert got[:, -1].tolist() == [n - 1 - 16] * 3


# ------------------------------------------------------------------------------------------------ (b) batch
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_batch_positions_equal_each_sequence_alone(policy_of, family: str, left: bool) -> None:
    policy = policy_of(family)
    slow = long_video(family, "slow", fps=1.0, frames=12, seed=1)  # Qwen2.5-VL: 2 s per grid step
    fast = long_video(family, "fast", seed=2)
    img = image(family, "img", 3, 2)
    cases = [
        ([fast], "What happens?"),
        ([img], "What is it?"),
        ([], "Name a colour."),
        ([slow, img], "Video then image: does the image show a frame of it? Answer briefly please."),
        ([img, fast, slow], "Two videos after an image."),
    ]
    seqs = [prompt(policy, media, q).extend(answer(policy, 2 + i), trained=True) for i, (media, q) in enumerate(cases)]
    assert len({len(s) for s in seqs}) == len(seqs)
    if family == "qwen2_5_vl":
        assert policy.media["slow"].second_per_grid == pytest.approx(2.0)
    batch = policy.pad(seqs, left=left)
    together = policy.position_ids(batch, seqs)
    _, deltas = policy.base.get_rope_index(batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                                           attention_mask=batch["attention_mask"], **inputs.grid_kwargs(policy, seqs))
    width = batch["input_ids"].shape[1]
    for i, seq in enumerate(seqs):
        alone = positions_of(policy, [seq])[:, 0]
        cols = slice(width - len(seq), width) if left else slice(0, len(seq))
        assert torch.equal(together[:, i, cols], alone), f"sequence {i}"
        assert int(alone.max()) == int(alone[0, -1])  # the last token holds the largest position
        assert int(deltas[i, 0]) == int(alone.max()) + 1 - len(seq)


# ------------------------------------------------------------------------------------------------ (c) generate
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_decodes_at_the_rule_positions_and_matches_training(policy_of, family: str) -> None:
    policy = policy_of(family)
    prompts = [prompt(policy, [long_video(family, "v", seed=3)], "What happens?"),
               prompt(policy, [long_video(family, "v2", seed=4, frames=8)], "What happens in this one, briefly?")]
    # hand-derived position of the first generated token: prompt length minus the positions the video saves
    # (32 tokens; Qwen2-VL 8 positions, Qwen2.5-VL 15; Qwen3-VL 8 blocks x 2; the 8-frame video: 4 temporal
    # steps, so 4 / 7 / 4 x 2 positions for 16 tokens; Qwen3.5 positions as Qwen3-VL)
    saved = {"qwen2_vl": (32 - 8, 16 - 4), "qwen2_5_vl": (32 - 15, 16 - 7), "qwen3_vl": (32 - 16, 16 - 8),
             "qwen3_vl_moe": (32 - 16, 16 - 8), "qwen3_5": (32 - 16, 16 - 8), "qwen3_5_moe": (32 - 16, 16 - 8)}[family]
    first = [len(p) - d for p, d in zip(prompts, saved)]
    probe = RopeProbe(policy)
    try:
        gens = policy.generate(prompts, max_new_tokens=6, do_sample=False, with_logprobs=True)
    finally:
        probe.close()
    # the prefill, then one (3, B, 1) call per new token: step k decodes at first + k - 1 for every row
    steps = probe.seen[1:]
    assert all(p.shape[-1] == 1 for p in steps)
    for row, start in enumerate(first):
        for k, pos in enumerate(steps):
            assert pos[:, row, 0].tolist() == [start + k] * 3, (family, row, k)
    # the cached rope deltas agree with the same positions: token index + delta
    assert policy.base.rope_deltas[:, 0].tolist() == [f - len(p) for f, p in zip(first, prompts)]

    seqs = [p.extend(g[0].token_ids, trained=True) for p, g in zip(prompts, gens)]
    full = positions_of(policy, seqs)
    for row, (p, seq) in enumerate(zip(prompts, seqs)):
        assert full[:, row, len(p):len(seq)].tolist() == [list(range(first[row], first[row] + len(seq) - len(p)))] * 3
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs(seqs)
    for row, g in enumerate(gens):
        assert len(g[0].token_ids) == len(g[0].logprobs) > 0
        torch.testing.assert_close(logp[row][mask[row].bool()], torch.tensor(g[0].logprobs), rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------------------ (d) images
@pytest.mark.parametrize("family", FAMILIES)
def test_image_positions_are_unchanged(policy_of, family: str) -> None:
    policy = policy_of(family)
    a, b = image(family, "a", 3, 2), image(family, "b", 2, 4, seed=1)
    seqs = [prompt(policy, [a], "What is it?").extend(answer(policy, 3), trained=True),
            prompt(policy, [a, b], "Two images.").extend(answer(policy, 2), trained=True)]
    assert policy.media["a"].grid_thw.tolist() == [1, 4, 6] and policy.media["b"].grid_thw.tolist() == [1, 8, 4]
    batch = policy.pad(seqs, left=False)
    got = policy.position_ids(batch, seqs)
    # transformers' own (class) get_rope_index, not the rule installed on this instance
    before, _ = type(policy.base).get_rope_index(
        policy.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
        attention_mask=batch["attention_mask"], **inputs.grid_kwargs(policy, seqs))
    assert torch.equal(got, before)
    # by hand: a 3 x 2 image takes 3 positions (its width), a 2 x 4 image 4 (its height)
    (s, e), = runs(seqs[0].ids, policy.image_token_id)
    assert got[:, 0, e].tolist() == [s + 3] * 3 and got[:, 0, len(seqs[0]) - 1].tolist() == [len(seqs[0]) - 1 - 3] * 3
    (s1, e1), (s2, e2) = runs(seqs[1].ids, policy.image_token_id)
    assert got[:, 1, e1].tolist() == [s1 + 3] * 3 and got[:, 1, s2].tolist() == [s2 - 3] * 3
    assert got[:, 1, e2].tolist() == [s2 - 3 + 4] * 3


def test_the_rule_is_installed_on_the_policy_model_and_its_copies_only(policies, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    policy = policies["qwen2_vl"]
    assert policy.base.get_rope_index.__self__ is policy.base
    ref = copy.deepcopy(policy.model)  # a KL reference: the copy's rule is bound to the copy
    assert ref.model.get_rope_index.__self__ is ref.model
    assert ref.model.get_rope_index.__func__ is policy.base.get_rope_index.__func__
    policy.model.save_pretrained(tmp_path / "m")
    plain = AutoModelForImageTextToText.from_pretrained(tmp_path / "m")  # not wrapped by a Policy
    assert "get_rope_index" not in vars(plain.model)
