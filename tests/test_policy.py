"""The policy wrapper on real tiny Qwen-VL models (all three families), real images and real MP4 videos.

* vision features once: the tower runs once per unique media item per forward / ``generate`` call, the
  log-probs and the vision-tower gradients equal those of one tower run per sequence;
* M-RoPE: positions of a right-padded mixed batch equal the ones the model computes itself for each
  sequence alone (Qwen2.5-VL with seconds-per-grid != 1 included), and so do the log-probs;
* training log-probs equal the log-probs recorded while generating (sampled and greedy);
* vision placeholders are never generated; ``load_policy`` errors name the folder and what is missing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from synthetic_media import RopeProbe

from mmrl.model import FAMILIES, MediaInput, Policy, TokenSeq, load_policy
from mmrl.toy.tiny_models import make_tiny
from mmrl_common.errors import MmrlError
from video import sample_video
from video.writer import write_mp4

G = 4


# ------------------------------------------------------------------------------------------------ media
def moving_video(path: Path, seed: int, frames: int = 16, size: int = 64, fps: float = 4.0) -> Path:
    """A real H.264 MP4: a coloured square moving over a coloured background with a gradient."""
    rng = np.random.default_rng(seed)
    bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    _, xx = np.mgrid[0:size, 0:size]
    out = np.empty((frames, size, size, 3), np.uint8)
    for i in range(frames):
        img = (bg[None, None, :] * 0.6 + (xx[..., None] * 0.4 * 255 / size)).astype(np.uint8)
        x, y = (5 * i + 11 * seed) % (size - 16), (3 * i + 7 * seed) % (size - 16)
        img[y:y + 16, x:x + 16] = fg
        out[i] = img
    return write_mp4(path, out, fps)


def pattern_image(seed: int, w: int, h: int) -> Image.Image:
    rng = np.random.default_rng(100 + seed)
    arr = np.zeros((h, w, 3), np.uint8)
    arr[...] = rng.integers(0, 256, 3)
    arr[h // 4: 3 * h // 4, w // 3: 2 * w // 3] = rng.integers(0, 256, 3)
    arr[:, ::7] = rng.integers(0, 256, 3)
    return Image.fromarray(arr)


def patch_of(family: str) -> int:
    return 16 if family.startswith("qwen3") else 14


def video_item(path: Path, family: str, key: str, fps: float = 2.0) -> MediaInput:
    f = 2 * patch_of(family)
    data = sample_video(path, "qwen", fps=fps, min_frames=4, max_frames=8, min_pixels=4 * f * f,
                        max_pixels=16 * f * f, image_patch_size=patch_of(family))
    return MediaInput(key=key, kind="video", data=data, timestamps=list(data.timestamps))


def image_item(family: str, key: str, seed: int, w: int = 3, h: int = 2) -> MediaInput:
    f = 2 * patch_of(family)
    return MediaInput(key=key, kind="image", data=pattern_image(seed, w * f, h * f))


def render(policy: Policy, media: list[MediaInput], question: str) -> str:
    content: list[dict[str, Any]] = [{"type": m.kind} for m in media]
    content.append({"type": "text", "text": question})
    return policy.render([{"role": "user", "content": content}])


def completions(policy: Policy, n: int, seed: int) -> list[list[int]]:
    """``n`` different completions of different lengths (ordinary text tokens, then <|im_end|>)."""
    rng = np.random.default_rng(seed)
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [rng.integers(40, 250, size=3 + 2 * i).tolist() + [end] for i in range(n)]


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("policy-models")
    return {family: make_tiny(family, root / family, seed=0) for family in FAMILIES}


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("policy-videos")
    return [moving_video(root / f"v{i}.mp4", seed=i) for i in range(2)]


@pytest.fixture(scope="module")
def policies(model_dirs: dict[str, Path]) -> dict[str, Policy]:
    out = {}
    for family, path in model_dirs.items():
        policy = load_policy(path)
        policy.model.eval()
        out[family] = policy
    return out


@pytest.fixture
def policy_of(policies: dict[str, Policy]):
    """A family's policy, reset: sharing on, everything trainable, no registered media, no grads."""
    def get(family: str) -> Policy:
        p = policies[family]
        p.configure(share_vision_features=True)
        p.set_trainable()
        p.media.clear()
        p.model.zero_grad(set_to_none=True)
        return p
    return get


# ------------------------------------------------------------------------------------------------ sharing
def group_batch(policy: Policy, family: str, videos: list[Path]) -> list[TokenSeq]:
    """2 prompts with different videos, each extended with G different completions (8 sequences)."""
    seqs = []
    for i, path in enumerate(videos):
        item = video_item(path, family, key=f"video-{i}")
        prompt = policy.encode(render(policy, [item], f"Which way does the square move? ({i})"), [item])
        assert prompt.media == [f"video-{i}"]
        seqs += [prompt.extend(c, trained=True) for c in completions(policy, G, seed=i)]
    return seqs


def vision_grads(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in policy.base.visual.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_tower_runs_once_per_unique_video(policy_of, videos, family: str) -> None:
    policy = policy_of(family)
    seqs = group_batch(policy, family, videos)
    assert len(seqs) == 2 * G and len(policy.media) == 2
    results = {}
    for shared in (True, False):
        policy.configure(share_vision_features=shared)
        policy.model.zero_grad(set_to_none=True)
        before = policy.vision_calls
        logp, _, mask = policy.forward_logprobs(seqs)
        calls = policy.vision_calls - before
        (logp * mask).sum().backward()
        results[shared] = (calls, logp.detach(), vision_grads(policy))
    assert results[True][0] == 2, "shared: one tower call per unique video"
    assert results[False][0] == 2 * G, "unshared: one tower call per sequence"
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0, atol=1e-6)
    grads_shared, grads_unshared = results[True][2], results[False][2]
    n_params = sum(1 for _ in policy.base.visual.parameters())
    assert len(grads_shared) == n_params and set(grads_shared) == set(grads_unshared)
    assert any(g.abs().sum() > 0 for g in grads_shared.values())
    for name, g in grads_shared.items():  # same sum, accumulated in a different order
        torch.testing.assert_close(g, grads_unshared[name], rtol=1e-4, atol=1e-5 * float(g.abs().max()))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_frozen_vision_gets_no_gradient(policy_of, videos, family: str) -> None:
    policy = policy_of(family)
    seqs = group_batch(policy, family, videos)
    policy.set_trainable(vision=False, merger=False)
    logp, _, mask = policy.forward_logprobs(seqs)
    (logp * mask).sum().backward()
    assert all(p.grad is None for p in policy.base.visual.parameters())
    assert policy.model.lm_head.weight.grad is not None and policy.model.lm_head.weight.grad.abs().sum() > 0
    policy.set_trainable()


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_runs_tower_once_per_unique_item(policy_of, videos, family: str) -> None:
    policy = policy_of(family)
    items = [video_item(videos[0], family, "v0"), image_item(family, "img", seed=3)]
    seqs = [policy.encode(render(policy, [items[0]], "What moves?"), [items[0]]),
            policy.encode(render(policy, [items[1]], "What colour?"), [items[1]])]
    before = policy.vision_calls
    torch.manual_seed(0)
    out = policy.generate(seqs, max_new_tokens=4, temperature=1.0, num_return_sequences=G)
    assert policy.vision_calls - before == 2
    assert [len(gens) for gens in out] == [G, G]
    assert all(len(g.token_ids) == len(g.logprobs) > 0 for gens in out for g in gens)


# ------------------------------------------------------------------------------------------------ M-RoPE
def processor_inputs(policy: Policy, text: str, media: list[MediaInput]) -> dict[str, Any]:
    kw: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    images = [m.data for m in media if m.kind == "image"]
    videos = [m.data for m in media if m.kind == "video"]
    if images:
        kw["images"] = images
    if videos:
        kw.update(videos=[v.frames for v in videos], video_metadata=[v.metadata for v in videos],
                  do_sample_frames=False)
    return dict(policy.processor(**kw))


def own_positions(policy: Policy, inputs: dict[str, Any]) -> torch.Tensor:
    """(3, L) positions the model computes itself for one unpadded sequence (its own forward)."""
    probe = RopeProbe(policy)
    try:
        policy.base.rope_deltas = None
        with torch.no_grad():
            policy.model(**inputs, use_cache=False)
    finally:
        probe.close()
    assert len(probe.seen) == 1
    pos = probe.seen[0]
    assert pos.shape[:2] == (3, 1), pos.shape
    return pos[:, 0]


def mixed_batch(policy: Policy, family: str, videos: list[Path]):
    """(text, media, completion) for image, video, image+video, two-image and text-only sequences."""
    v_slow = video_item(videos[0], family, "v-slow", fps=1.0)  # 2 s per temporal grid step
    v_fast = video_item(videos[1], family, "v-fast", fps=2.0)
    img_a, img_b = image_item(family, "img-a", 1, 3, 2), image_item(family, "img-b", 2, 2, 4)
    cases = [
        ([img_a], "What is in the image?"),
        ([v_slow], "Which way does it move?"),
        ([img_b, v_fast], "Does the image match the video?"),
        ([], "Name a colour."),
        ([v_fast, img_a], "Video then image: which is brighter? Answer in a few words please."),
        ([img_a, img_b], "Two images."),
    ]
    comps = completions(policy, len(cases), seed=9)
    return [(render(policy, media, q), media, c) for (media, q), c in zip(cases, comps)]


@pytest.mark.parametrize("family", FAMILIES)
def test_mrope_positions_of_padded_batch_match_model_per_sequence(policy_of, videos, family: str) -> None:
    policy = policy_of(family)
    cases = mixed_batch(policy, family, videos)
    seqs = [policy.encode(text, media).extend(comp, trained=True) for text, media, comp in cases]
    lengths = [len(s) for s in seqs]
    assert len(set(lengths)) == len(lengths), "sequences of different lengths, so the batch is padded"
    batch = policy.pad(seqs, left=False)
    positions = policy.position_ids(batch, seqs)
    assert positions.shape == (3, len(seqs), max(lengths))
    for i, ((text, media, comp), seq) in enumerate(zip(cases, seqs)):
        inputs = processor_inputs(policy, text, media)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], torch.tensor([comp])], dim=1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"], torch.zeros(1, len(comp), dtype=torch.long)], dim=1)
        assert inputs["input_ids"][0].tolist() == seq.ids
        expected = own_positions(policy, inputs)
        assert torch.equal(positions[:, i, :len(seq)], expected), f"sequence {i} ({[m.kind for m in media]})"
        if family == "qwen2_5_vl" and any(m.key == "v-slow" for m in media):
            assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(2.0)
            assert policy.media["v-slow"].second_per_grid == pytest.approx(2.0)
            # the seconds-per-grid matter: with 1 s per grid step the positions would differ
            wrong, _ = policy.base.get_rope_index(
                inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                video_grid_thw=inputs["video_grid_thw"], second_per_grid_ts=torch.tensor([1.0]))
            assert not torch.equal(wrong[:, 0], expected)

    # log-probs of each sequence in the padded batch equal its log-probs alone
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs(seqs)
        for i, seq in enumerate(seqs):
            alone, _, mask_alone = policy.forward_logprobs([seq])
            assert torch.equal(mask[i, :len(seq)], mask_alone[0])
            torch.testing.assert_close(logp[i, :len(seq)], alone[0], rtol=0, atol=1e-5)
            assert torch.all(logp[i, len(seq):] == 0)


# ------------------------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_training_logprobs_equal_generation_logprobs(policy_of, videos, family: str, greedy: bool) -> None:
    policy = policy_of(family)
    items = [image_item(family, "img", seed=4), video_item(videos[1], family, "vid")]
    prompts = [policy.encode(render(policy, [items[0]], "What colour is the box?"), [items[0]]),
               policy.encode(render(policy, [items[1]], "Where does the square go?"), [items[1]])]
    temperature = 1.0 if greedy else 0.7
    torch.manual_seed(1)
    gens = policy.generate(prompts, max_new_tokens=8, temperature=temperature, do_sample=not greedy,
                           num_return_sequences=1 if greedy else 3)
    seqs, recorded = [], []
    for prompt, group in zip(prompts, gens):
        for g in group:
            assert len(g.token_ids) == len(g.logprobs) > 0
            seqs.append(prompt.extend(g.token_ids, trained=True))
            recorded.append(torch.tensor(g.logprobs))
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs(seqs, temperature=temperature)
    for i, rec in enumerate(recorded):
        got = logp[i][mask[i].bool()]
        assert got.shape == rec.shape
        torch.testing.assert_close(got, rec, rtol=0, atol=1e-4)
    if greedy:  # greedy tokens are the argmax: their log-prob is the largest one, so > log(1/V)
        assert all(float(r.min()) > -np.log(policy.model.config.text_config.vocab_size) for r in recorded)


@pytest.mark.parametrize("family", FAMILIES)
def test_policy_never_emits_vision_placeholders(policy_of, family: str) -> None:
    policy = policy_of(family)
    item = image_item(family, "img", seed=5)
    prompt = policy.encode(render(policy, [item], "Describe."), [item])
    banned = sorted(policy.suppress_ids)
    tok = policy.tokenizer
    assert {tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                    "<|vision_end|>")} <= set(banned)
    # Push the model towards the placeholders: point their LM-head rows along the mean hidden state, so
    # that without suppression a placeholder is the most likely next token everywhere.
    hidden: list[torch.Tensor] = []
    hook = policy.model.lm_head.register_forward_hook(lambda _m, args, _o: hidden.append(args[0].detach()))
    try:
        with torch.no_grad():
            policy.forward_logprobs([prompt.extend(completions(policy, 1, seed=5)[0], trained=True)])
    finally:
        hook.remove()
    h = hidden[0]
    head = policy.model.lm_head.weight
    saved = head[banned].clone()
    try:
        with torch.no_grad():
            direction = h.mean(0) / h.mean(0).norm()
            head[banned] = 20 * direction
            assert set(policy.model.lm_head(h).argmax(-1).tolist()) <= set(banned)
        torch.manual_seed(2)
        gens = policy.generate([prompt], max_new_tokens=10, temperature=1.0, num_return_sequences=6)[0]
    finally:
        with torch.no_grad():
            head[banned] = saved
    emitted = [t for g in gens for t in g.token_ids]
    assert len(emitted) >= 6
    assert not set(banned) & set(emitted)


# ------------------------------------------------------------------------------------------------ loading
def test_load_policy_errors(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(MmrlError, match="not found") as exc:
        load_policy(missing)
    assert str(missing) in str(exc.value)

    no_proc = tmp_path / "weights-only"
    no_proc.mkdir()
    src = model_dirs["qwen2_5_vl"]
    for f in src.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            shutil.copy(f, no_proc / f.name)
    with pytest.raises(MmrlError) as exc:
        load_policy(no_proc)
    msg = str(exc.value)
    assert str(no_proc) in msg and "processor" in msg and "\n" not in msg

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MmrlError, match="config.json") as exc:
        load_policy(empty)
    assert str(empty) in str(exc.value)
