"""Tiny random-weight Qwen-VL models: build, reload with the Auto classes, generate from images and videos."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmrl import cli
from mmrl.model.types import dense_family, has_linear_attention, media_family
from mmrl.toy.tiny_models import (
    FAMILIES,
    INFO_FILE,
    SPECIAL_TOKENS,
    ensure_tiny,
    make_tiny,
    mrope_section,
    rotary_dim,
    tiny_dir,
)
from mmrl_common.errors import ConfigError, MmrlError

MAX_PARAMS = 5_000_000
EXPECTED_CLASS = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}
EXPECTED_PROCESSOR = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    "qwen3_vl_moe": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),  # the MoE checkpoints ship Qwen3-VL's
    "qwen3_5": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),  # so do Qwen3.5's (processing_auto.py)
    "qwen3_5_moe": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for family in FAMILIES:
        out[family] = make_tiny(family, root / family, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(built: dict[str, Path]) -> dict[str, tuple]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return {
        family: (AutoModelForImageTextToText.from_pretrained(path).eval(), AutoProcessor.from_pretrained(path))
        for family, path in built.items()
    }


def pattern_image(width: int = 112, height: int = 84) -> Image.Image:
    """A checkerboard with a red circle and a blue square: real structure, not zeros."""
    yy, xx = np.mgrid[0:height, 0:width]
    board = (((xx // 7) + (yy // 7)) % 2 * 180 + 40).astype(np.uint8)
    img = Image.fromarray(np.stack([board, board // 2, 255 - board], axis=-1), "RGB")
    draw = ImageDraw.Draw(img)
    draw.ellipse((10, 10, 40, 40), fill=(255, 0, 0))
    draw.rectangle((60, 40, 90, 70), fill=(0, 0, 255))
    return img


def moving_square_video(frames: int = 8, size: int = 56) -> np.ndarray:
    """(T, H, W, 3) uint8: a green square sliding right over a striped background."""
    video = np.zeros((frames, size, size, 3), dtype=np.uint8)
    video[..., 2] = (np.arange(size)[None, :, None] * 4 % 256).astype(np.uint8)
    for t in range(frames):
        x = 2 + 5 * t
        video[t, 20:36, x : x + 16] = (0, 255, 0)
    return video


# ------------------------------------------------------------------------------------------------- structure


@pytest.mark.parametrize("family", FAMILIES)
def test_build_reload_and_config(family: str, built: dict[str, Path], loaded: dict[str, tuple]) -> None:
    model, processor = loaded[family]
    path = built[family]
    assert type(model).__name__ == EXPECTED_CLASS[family]
    assert type(processor).__name__ == EXPECTED_PROCESSOR[family][0]
    assert type(processor.video_processor).__name__ == EXPECTED_PROCESSOR[family][1]
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 < n_params <= MAX_PARAMS
    assert json.loads((path / INFO_FILE).read_text())["parameters"] == n_params
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in path.iterdir()
    }

    cfg = model.config
    tok = processor.tokenizer
    assert cfg.text_config.vocab_size == len(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>") == processor.image_token_id
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>") == processor.video_token_id
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert cfg.text_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]

    head_dim = cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    section = cfg.text_config.rope_parameters["mrope_section"]
    rotated = int(head_dim * cfg.text_config.rope_parameters.get("partial_rotary_factor", 1.0))
    assert sum(section) == rotated // 2 and len(section) == 3 and min(section) >= 1
    vision = cfg.vision_config
    patch = 16 if media_family(family) == "qwen3_vl" else 14
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (patch, 2, 2)
    assert processor.image_processor.patch_size == processor.video_processor.patch_size == patch
    assert processor.image_processor.merge_size == processor.video_processor.merge_size == 2
    if family == "qwen2_5_vl":
        assert vision.fullatt_block_indexes and max(vision.fullatt_block_indexes) < vision.depth
        assert len(vision.fullatt_block_indexes) < vision.depth  # some blocks use window attention
        assert vision.out_hidden_size == cfg.text_config.hidden_size
    if dense_family(family) == "qwen3_vl":
        assert cfg.text_config.rope_parameters["mrope_interleaved"] is True
        assert vision.deepstack_visual_indexes and max(vision.deepstack_visual_indexes) < vision.depth
        assert vision.out_hidden_size == cfg.text_config.hidden_size
    if dense_family(family) == "qwen3_5":  # both layer kinds, a quarter of each attention head rotated
        assert cfg.text_config.rope_parameters["mrope_interleaved"] is True
        assert cfg.text_config.layer_types == ["linear_attention", "full_attention"]
        kinds = {type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__
                 for layer in model.model.language_model.layers}
        assert sorted(k.endswith("GatedDeltaNet") for k in kinds) == [False, True], kinds
        assert rotated == head_dim // 4
        assert not hasattr(vision, "deepstack_visual_indexes") or not getattr(vision, "deepstack_visual_indexes", None)
        assert vision.out_hidden_size == cfg.text_config.hidden_size


def test_mrope_section_sums_to_half_head_dim() -> None:
    for family in FAMILIES:
        for head_dim in (6, 8, 16, 32, 64, 128) if not has_linear_attention(family) else (24, 32, 64, 256):
            section = mrope_section(family, head_dim)
            rotated = rotary_dim(family, head_dim)
            assert sum(section) == rotated // 2 and min(section) >= 1, (family, head_dim, section)
    assert mrope_section("qwen2_vl", 128) == [16, 24, 24]  # the real checkpoints' split
    assert mrope_section("qwen3_vl", 128) == [24, 20, 20]
    assert mrope_section("qwen3_5", 256) == [11, 11, 10]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_special_tokens(family: str, loaded: dict[str, tuple]) -> None:
    tok = loaded[family][1].tokenizer
    assert type(tok).__name__ == ("Qwen3_5Tokenizer" if dense_family(family) == "qwen3_5" else "Qwen2Tokenizer")
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    specials = SPECIAL_TOKENS[family]
    ids = [tok.convert_tokens_to_ids(content) for content, _ in specials]
    base = ids[0]
    assert ids == list(range(base, base + len(specials)))  # same order as the real tokenizers
    assert len(tok) == base + len(specials)
    assert 1000 <= base <= 2100  # trained BPE vocabulary, byte alphabet included
    for content, _ in specials:
        assert tok(content, add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids(content)]
    if media_family(family) == "qwen3_vl":
        assert tok("<think>", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids("<think>")]
    text = "Options: A. red B. green\n<think>The circle moves left.</think><answer>A</answer> 12.5 s, ünï 😀"
    enc = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(enc) == text
    assert len(enc) < len(text.encode()) // 2  # the BPE merges actually compress the toy vocabulary
    assert tok.decode([tok.convert_tokens_to_ids("<|im_start|>"), *enc], skip_special_tokens=True) == text


def test_chat_template_renders_expected_strings(loaded: dict[str, tuple]) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What colour is the circle?"}],
        }
    ]
    body = (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the circle?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for family in FAMILIES:
        processor = loaded[family][1]
        rendered = processor.apply_chat_template(messages, add_generation_prompt=True)
        assert rendered == (body if media_family(family) == "qwen3_vl" else system + body), family

    processor = loaded["qwen2_5_vl"][1]
    conversation = [
        {"role": "system", "content": "Answer with a letter."},
        {"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "Dir?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<answer>B</answer>"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "And?"}]},
    ]
    assert processor.apply_chat_template(conversation, add_vision_id=True) == (
        "<|im_start|>system\nAnswer with a letter.<|im_end|>\n"
        "<|im_start|>user\nVideo 1: <|vision_start|><|video_pad|><|vision_end|>Dir?<|im_end|>\n"
        "<|im_start|>assistant\n<answer>B</answer><|im_end|>\n"
        "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Picture 2: <|vision_start|><|image_pad|><|vision_end|>And?<|im_end|>\n"
    )
    # {% generation %} marks the assistant reply (+ <|im_end|>) for assistant-only losses.
    out = processor.apply_chat_template(
        conversation[:1] + [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [i for i, m in zip(out["input_ids"][0], out["assistant_masks"][0], strict=True) if m]
    assert processor.tokenizer.decode(masked) == "yes<|im_end|>"


# ------------------------------------------------------------------------------------------------ generation


def _prompt(processor: Any, kind: str) -> str:
    messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What do you see?"}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_from_image(family: str, loaded: dict[str, tuple]) -> None:
    model, processor = loaded[family]
    image = pattern_image()
    inputs = processor(text=[_prompt(processor, "image")], images=[image], return_tensors="pt")
    grid = inputs["image_grid_thw"]
    n_pad = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert n_pad == int(grid.prod()) // 4 == 12  # 84x112 -> 6x8 patches -> 12 merged tokens
    assert inputs["pixel_values"].shape[0] == int(grid.prod())
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4
    assert torch.equal(out[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])

    # The vision tower is wired in: a different picture changes the logits.
    flipped = processor(
        text=[_prompt(processor, "image")], images=[image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)],
        return_tensors="pt",
    )
    with torch.no_grad():
        a = model(**inputs).logits[0, -1]
        b = model(**flipped).logits[0, -1]
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_from_video(family: str, loaded: dict[str, tuple]) -> None:
    model, processor = loaded[family]
    video = moving_square_video()
    metadata = {"fps": 4.0, "total_num_frames": 8, "frames_indices": list(range(8)), "duration": 2.0}
    inputs = processor(
        text=[_prompt(processor, "video")],
        videos=[video],
        video_metadata=[metadata],
        do_sample_frames=False,  # frames are already sampled (as qwen-vl-utils does)
        return_tensors="pt",
    )
    grid = inputs["video_grid_thw"]
    assert grid.tolist() == [[4, 4, 4]]  # 8 frames / temporal patch 2; 56 px -> 4 patches (Qwen3: 64 px)
    ids = inputs["input_ids"][0]
    n_pad = int((ids == model.config.video_token_id).sum())
    assert n_pad == int(grid.prod()) // 4 == 16
    text = processor.tokenizer.decode(ids)
    if media_family(family) == "qwen3_vl":
        # One "<t seconds><|vision_start|>...<|vision_end|>" block per temporal patch, inside the template's
        # own <|vision_start|> ... <|vision_end|>; t = mean time of the two frames of the patch.
        for stamp in ("<0.1 seconds>", "<0.6 seconds>", "<1.1 seconds>", "<1.6 seconds>"):
            assert stamp in text
        assert text.count("<|vision_start|>") == 1 + 4
        assert "second_per_grid_ts" not in inputs
    elif family == "qwen2_5_vl":
        assert inputs["second_per_grid_ts"].tolist() == [0.5]  # temporal_patch_size / fps
        assert "seconds>" not in text
    else:
        assert "second_per_grid_ts" not in inputs
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[0] + 4


# ------------------------------------------------------------------------------------------ determinism/cache


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_seed_is_byte_identical_and_seed_changes_weights(built: dict[str, Path], tmp_path: Path) -> None:
    again = _files(make_tiny("qwen2_5_vl", tmp_path / "again", seed=0))
    first = _files(built["qwen2_5_vl"])
    assert again.keys() == first.keys()
    for name in first:
        assert again[name] == first[name], name
    other = _files(make_tiny("qwen2_5_vl", tmp_path / "other", seed=1))
    assert other["model.safetensors"] != first["model.safetensors"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"):
        assert other[name] == first[name], name
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_ensure_tiny_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    first = ensure_tiny("qwen3_vl", layers=1)
    assert first == tiny_dir("qwen3_vl", layers=1)
    assert first.parent == tmp_path / "cache" / "models" and first.name.startswith("qwen3_vl-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny("qwen3_vl", layers=1) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert ensure_tiny("qwen3_vl", seed=0, layers=1, vision_depth=2) == first  # explicit default, same key
    assert ensure_tiny("qwen3_vl", seed=1, layers=1) != first
    assert json.loads((first / "config.json").read_text())["text_config"]["num_hidden_layers"] == 1
    assert sorted(p.name for p in first.parent.iterdir() if ".tmp-" in p.name) == []
    # A damaged cache entry (no completion marker) is replaced by a fresh build.
    (first / INFO_FILE).unlink()
    (first / "model.safetensors").write_bytes(b"half")
    assert ensure_tiny("qwen3_vl", layers=1) == first
    assert (first / "model.safetensors").stat().st_size > 1000


def test_rope_theta_setting(tmp_path: Path) -> None:
    from mmrl.toy.tiny_models import settings_hash

    path = make_tiny("qwen2_5_vl", tmp_path / "rt", layers=1, rope_theta=10000)
    rope = json.loads((path / "config.json").read_text())["text_config"]["rope_parameters"]
    assert rope["rope_theta"] == 10000.0 and rope["mrope_section"] == [4, 6, 6]
    assert settings_hash("qwen2_5_vl", rope_theta=0) == settings_hash("qwen2_5_vl")  # 0: the family's, same key
    assert settings_hash("qwen2_5_vl", rope_theta=10000) != settings_hash("qwen2_5_vl")
    with pytest.raises(ConfigError, match="rope_theta must be a non-negative integer"):
        make_tiny("qwen2_5_vl", tmp_path / "x", rope_theta=-1)


def test_bad_settings_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model family"):
        make_tiny("llava", tmp_path / "x")
    with pytest.raises(ConfigError, match="not divisible by heads"):
        make_tiny("qwen2_vl", tmp_path / "x", hidden_size=100, heads=3)
    with pytest.raises(ConfigError, match="unknown tiny-model size option"):
        make_tiny("qwen2_vl", tmp_path / "x", hiddne_size=64)
    with pytest.raises(ConfigError, match="seed"):
        make_tiny("qwen2_vl", tmp_path / "x", seed=-1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(MmrlError, match="not empty"):
        make_tiny("qwen2_vl", tmp_path / "full")
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["full"]


# ------------------------------------------------------------------------------------------------------- CLI


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["models", "make-tiny", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--family", "--out", "--seed", "--hidden-size", "--layers", "--vision-depth",
                   "--video-max-pixels", "qwen2_5_vl", "Qwen3VLForConditionalGeneration", "byte-level BPE"):
        assert needle in text, needle


def test_cli_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    rc = cli.main(["models", "make-tiny", "--family", "qwen2_vl", "--out", str(out), "--seed", "3",
                   "--layers", "1", "--hidden-size", "64", "--tie-word-embeddings"])
    assert rc == 0
    assert "built qwen2_vl" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 1
    assert config["text_config"]["hidden_size"] == 64
    assert config["tie_word_embeddings"] is True
    assert json.loads((out / INFO_FILE).read_text())["seed"] == 3
    # Same directory again: refused without --force, replaced with it.
    assert cli.main(["models", "make-tiny", "--family", "qwen2_vl", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli.main(["models", "make-tiny", "--family", "qwen2_vl", "--out", str(out), "--force"]) == 0
    assert json.loads((out / INFO_FILE).read_text())["seed"] == 0


def test_cli_bad_family_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["models", "make-tiny", "--family", "llava", "--out", str(tmp_path / "m")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model family 'llava'") and "qwen3_vl" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not os.listdir(tmp_path)
