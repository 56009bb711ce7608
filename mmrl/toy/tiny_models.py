"""Tiny random-weight Qwen-VL models, built offline.

``mmrl models make-tiny`` (and :func:`make_tiny` / :func:`ensure_tiny`) writes an ordinary Hugging Face model
directory for one of the real Qwen-VL architectures, small enough to train and generate on a CPU in seconds:

* ``config.json`` + ``model.safetensors`` + ``generation_config.json``: a
  ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` /
  ``Qwen3VLForConditionalGeneration`` / ``Qwen3VLMoeForConditionalGeneration`` / ``Qwen3_5ForConditionalGeneration``
  / ``Qwen3_5MoeForConditionalGeneration`` (Qwen3.5: Gated DeltaNet layers with a full-attention layer closing
  every group of four, or of the depth when smaller; MoE: every decoder layer a sparse
  mixture of experts, 4 experts of which each token takes 2 by default) with random weights (seeded; same seed => byte-identical weights),
  float32, a 2-layer text model and a depth-2 vision tower by default (about 1-2M parameters).
* a byte-level BPE tokenizer (``Qwen2Tokenizer`` class, same pre-tokenizer as Qwen) trained here on a small
  built-in corpus (toy-world words, digits, punctuation, ``<think>``/``<answer>`` tags, option letters),
  about 1.5k tokens, followed by the Qwen special tokens with the real strings and in the real order
  (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ..., ``<|vision_start|>``, ``<|image_pad|>``,
  ``<|video_pad|>``); eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos, like the Instruct checkpoints.
* the family's real image processor, video processor and processor classes (patch 14 for Qwen2/2.5-VL and
  16 for Qwen3-VL, merge 2, temporal patch 2) with small pixel budgets, and a Qwen-VL style chat template.

Nothing is downloaded. :func:`ensure_tiny` builds once into ``cache_dir()/models/<family>-<hash>`` (the hash
covers every setting, the mmrl and transformers versions and :data:`BUILDER_VERSION`) and reuses it; builds
go to a temporary folder that is renamed into place, so an interrupted build never leaves half a model.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmrl import __version__ as MMRL_VERSION
from mmrl.config.tiny_size import (
    MERGE,
    MOE_DEFAULTS,
    PARTIAL_ROTARY,
    PATCH,
    SIZE_HELP,
    TinySize,
    check_family,
    layer_types,
    resolve_size,
    rotary_dim,
)
from mmrl.model.families import FAMILIES, dense_family, is_moe, media_family
from mmrl_common.errors import ConfigError, MmrlError
from mmrl_common.paths import cache_dir

# Bump whenever the files this module writes change for the same settings (invalidates ensure_tiny caches).
BUILDER_VERSION = 1

# Special tokens, in the order (and with the strings) of the real tokenizers; ids follow the BPE vocabulary.
# (token, special) -- "special" tokens are dropped by decode(skip_special_tokens=True).
_QWEN2_VL_SPECIALS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
)
_QWEN2_5_EXTRA: tuple[tuple[str, bool], ...] = (
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
_QWEN3_EXTRA: tuple[tuple[str, bool], ...] = (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
SPECIAL_TOKENS: dict[str, tuple[tuple[str, bool], ...]] = {
    "qwen2_vl": _QWEN2_VL_SPECIALS,
    "qwen2_5_vl": _QWEN2_VL_SPECIALS + _QWEN2_5_EXTRA,
    "qwen3_vl": _QWEN2_VL_SPECIALS + _QWEN2_5_EXTRA + _QWEN3_EXTRA,
}
# the others (MoE, Qwen3.5) carry the specials of the family whose processor they take
SPECIAL_TOKENS.update({f: SPECIAL_TOKENS[media_family(f)] for f in FAMILIES if f not in SPECIAL_TOKENS})

_DEFAULT_SYSTEM = {
    "qwen2_vl": "You are a helpful assistant.",
    "qwen2_5_vl": "You are a helpful assistant.",
    "qwen3_vl": None,
}

# Per-family fixed architecture facts (those of the real checkpoints; patch size by the media family).
_TEMPORAL_PATCH = 2
_ROPE_THETA = {"qwen2_vl": 1_000_000.0, "qwen2_5_vl": 1_000_000.0, "qwen3_vl": 5_000_000.0, "qwen3_5": 10_000_000.0}
_MAX_POSITIONS = {"qwen2_vl": 32768, "qwen2_5_vl": 128000, "qwen3_vl": 262144, "qwen3_5": 262144}
_LINEAR_HEAD_DIM = 128
_ROUTER_AUX_LOSS_COEF = 0.001


def _words(text: str) -> list[str]:
    return text.split()


_COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "white", "black", "grey", "pink", "brown"]
_SHAPES = ["circle", "square", "triangle", "star", "cross", "ring", "diamond", "rectangle", "dot", "line"]
_DIRECTIONS = ["left", "right", "up", "down", "clockwise", "counterclockwise", "towards", "away"]
_WORDS = _words(
    "the a an is are was were be been of in on at to from by with without and or not but if then than "
    "this that these those there here it its they them their he she we you your our my me i "
    "what which where when why how many much more most less least first second third last next previous "
    "before after during while until again once twice always never sometimes often "
    "object objects shape shapes colour colours color colors size large small big tiny medium bright dark "
    "moves moving moved move appears appear appeared disappears vanishes stays stops starts ends turns "
    "rotates bounces falls rises grows shrinks changes flashes blinks jumps slides "
    "video image picture frame frames clip scene second seconds minute time times start end middle "
    "beginning event events order sequence count number numbers total all none some each every other "
    "question answer answers option options choice correct wrong true false yes no maybe unknown "
    "think reasoning step steps because so therefore thus hence look see watch find check compare "
    "top bottom side corner centre center edge above below between near far inside outside behind front "
    "scan scans lesion lesions normal abnormal finding findings organ tissue lung liver brain heart bone "
    "left right upper lower region mass nodule fracture fluid clear present absent mild severe patient "
    "doctor report diagnosis medical image images slice contrast density bright spot shadow "
    "one two three four five six seven eight nine ten zero eleven twelve twenty hundred "
    "describe explain identify select choose determine estimate locate tell give write output "
    "please only letter word sentence format tag final box boxes region regions span spans interval "
    "system user assistant helpful you are following below provided given show shows shown "
    "happen happens happened does did do can could would should will must may might "
    "red green blue yellow circle square triangle up down"
)
_LETTERS = ["A", "B", "C", "D", "E"]


def _corpus(n_lines: int = 6000, seed: int = 1234) -> Iterator[str]:
    """Deterministic English-ish training text for the tokenizer (independent of the model seed)."""
    rng = random.Random(seed)
    templates = [
        "What colour is the {shape}?",
        "Which shape is {colour}?",
        "How many {shape}s are there in the {media}?",
        "In which direction does the {colour} {shape} move?",
        "Does the {colour} {shape} appear before the {colour2} {shape2}?",
        "The {colour} {shape} moves {direction} at {num} seconds.",
        "At {num}.{digit} seconds a {colour} {shape} appears in the {media}.",
        "Is there a {colour} {shape} in the {media}? Answer yes or no.",
        "Options: A. {colour} B. {colour2} C. {colour3} D. {colour4} E. none",
        "Options:\nA. {shape}\nB. {shape2}\nC. {shape3}\nD. {shape4}",
        "<think>The {shape} is {colour} and it moves {direction}.</think><answer>{letter}</answer>",
        "<think>I count {num} {shape}s.</think> <answer>{num}</answer>",
        "<answer>{letter}</answer>",
        "<answer>yes</answer>",
        "<answer>no</answer>",
        "The answer is {letter}.",
        "Answer: {letter}",
        "When does the {colour} {shape} {verb}? Give the start and end time in seconds.",
        "[{num}.{digit}, {num2}.{digit}]",
        "From {num} to {num2} seconds the {shape} moves {direction}.",
        "The scan shows a {adj} {finding} in the {side} {organ}.",
        "Is the {organ} normal? {yesno}.",
        "Please think step by step and put the final answer in <answer></answer> tags.",
        "You are a helpful assistant.",
        "Picture {num}: Video {num2}:",
        "{sentence}",
        "{sentence} {sentence2}",
        "{num}{num2}{digit} + {digit} = {num}, {num2}; {num}% ({digit}) - \"{colour}\" 'ok' #{num}!",
    ]
    media = ["video", "image", "picture", "clip", "frame", "scene", "scan"]
    verbs = ["appear", "move", "stop", "flash", "disappear", "turn", "bounce"]
    adjs = ["small", "large", "bright", "dark", "mild", "severe", "round"]
    findings = ["lesion", "mass", "nodule", "spot", "shadow", "fracture", "fluid"]
    organs = ["lung", "liver", "brain", "heart", "bone", "kidney"]
    for _ in range(n_lines):
        t = rng.choice(templates)

        def sentence() -> str:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
            text = " ".join(words)
            return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ",", ";", ":", "..."])

        yield t.format(
            shape=rng.choice(_SHAPES), shape2=rng.choice(_SHAPES), shape3=rng.choice(_SHAPES),
            shape4=rng.choice(_SHAPES), colour=rng.choice(_COLOURS), colour2=rng.choice(_COLOURS),
            colour3=rng.choice(_COLOURS), colour4=rng.choice(_COLOURS), direction=rng.choice(_DIRECTIONS),
            num=rng.randint(0, 120), num2=rng.randint(0, 120), digit=rng.randint(0, 9),
            letter=rng.choice(_LETTERS), media=rng.choice(media), verb=rng.choice(verbs),
            adj=rng.choice(adjs), finding=rng.choice(findings), organ=rng.choice(organs),
            side=rng.choice(["left", "right", "upper", "lower"]), yesno=rng.choice(["Yes", "No"]),
            sentence=sentence(), sentence2=sentence(),
        )


def build_tokenizer(family: str, vocab_size: int = 1536) -> Any:
    """Train a byte-level BPE on the built-in corpus and wrap it as a ``Qwen2Tokenizer`` with Qwen specials.

    The BPE uses exactly the normalizer/pre-tokenizer/decoder that ``Qwen2Tokenizer`` rebuilds on load (NFC,
    Qwen's split regex, byte-level), so the saved files reload to the same tokenizer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken

    if dense_family(family) == "qwen3_5":  # its own class: Qwen2's with a split rule that keeps marks in words
        from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX
        from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer as Qwen2Tokenizer
    else:
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    model_json = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = model_json["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]

    # The specials follow the BPE vocabulary in the real order (<|endoftext|>, <|im_start|>, <|im_end|>, ...).
    specials = SPECIAL_TOKENS[family]
    base = len(vocab)
    added = {
        base + i: AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        for i, (content, special) in enumerate(specials)
    }
    extra = [c for c, special in specials if special and c not in ("<|endoftext|>", "<|im_end|>")]
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=extra,
        added_tokens_decoder=added,
        errors="replace",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=32768,
        add_prefix_space=False,
    )
    got = [tok.convert_tokens_to_ids(c) for c, _ in specials]
    if got != list(range(base, base + len(specials))):  # pragma: no cover - guards a transformers change
        raise RuntimeError(f"special token ids came out as {got}, expected {base}..{base + len(specials) - 1}")
    return tok


def chat_template(family: str) -> str:
    """A Qwen-VL style chat template (written for mmrl).

    ``<|im_start|>role\\n...<|im_end|>\\n`` per message; image items render as
    ``<|vision_start|><|image_pad|><|vision_end|>``, video items as ``<|vision_start|><|video_pad|><|vision_end|>``;
    ``add_generation_prompt`` opens ``<|im_start|>assistant\\n``. Qwen2/2.5-VL add the default system prompt
    "You are a helpful assistant." when the conversation has none (Qwen3-VL does not). ``add_vision_id=True``
    prefixes "Picture n: " / "Video n: ". Assistant turns are wrapped in ``{% generation %}`` so
    ``return_assistant_tokens_mask`` works.
    """
    check_family(family)
    system = _DEFAULT_SYSTEM[media_family(family)]
    default_system = (
        "{% if messages | length == 0 or messages[0]['role'] != 'system' %}"
        "<|im_start|>system\n" + system + "<|im_end|>\n"
        "{% endif %}"
        if system
        else ""
    )
    # No whitespace control ("{%-") anywhere: every newline in the output is a literal "\n" below.
    return (
        "{# mmrl tiny Qwen-VL chat template #}"
        "{% set counts = namespace(image=0, video=0) %}"
        "{% macro render(content) %}"
        "{% if content is string %}{{ content }}"
        "{% else %}{% for item in content %}"
        "{% if item['type'] == 'image' or (item['type'] is not defined and 'image' in item) %}"
        "{% set counts.image = counts.image + 1 %}"
        "{% if add_vision_id %}Picture {{ counts.image }}: {% endif %}"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif item['type'] == 'video' or (item['type'] is not defined and 'video' in item) %}"
        "{% set counts.video = counts.video + 1 %}"
        "{% if add_vision_id %}Video {{ counts.video }}: {% endif %}"
        "<|vision_start|><|video_pad|><|vision_end|>"
        "{% elif 'text' in item %}{{ item['text'] }}"
        "{% endif %}"
        "{% endfor %}{% endif %}"
        "{% endmacro %}"
        + default_system
        + "{% for message in messages %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ render(message['content']) }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
        "{% else %}"
        "{{ render(message['content']) }}<|im_end|>\n"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# ----------------------------------------------------------------------------------------------------------
# Configs, processors, model
# ----------------------------------------------------------------------------------------------------------


def mrope_section(family: str, head_dim: int) -> list[int]:
    """Split the rotated dimensions' ``rotary_dim/2`` frequencies over (temporal, height, width) like the real
    checkpoints.

    Qwen2/2.5-VL use [16, 24, 24] of 64 (chunked); Qwen3-VL uses [24, 20, 20] of 64 (interleaved T,H,W,...);
    Qwen3.5 [11, 11, 10] of 32 (a quarter of its 256-wide heads, interleaved). The tiny split keeps those
    proportions; the sum is always ``rotary_dim // 2``.
    """
    half = rotary_dim(family, head_dim) // 2
    if dense_family(family) == "qwen3_5":
        w = max(1, round(half * 10 / 32))
        h = max(1, min(round(half * 11 / 32), half - w - 1))
        return [half - h - w, h, w]
    share = 24 / 64 if dense_family(family) in ("qwen2_vl", "qwen2_5_vl") else 20 / 64
    hw = max(1, round(half * share))
    if half - 2 * hw < 1:
        hw = (half - 1) // 2
    return [half - 2 * hw, hw, hw]


def _full_attention_blocks(depth: int) -> list[int]:
    """Qwen2.5-VL: alternate windowed / full attention blocks (real 32-block towers use every 8th)."""
    return list(range(1, depth, 2)) or [depth - 1]


def _deepstack_indexes(depth: int) -> list[int]:
    """Qwen3-VL: taps at ~1/4, 1/2, 3/4 of the tower (real: [8, 16, 24] of 27 blocks), all below depth."""
    return sorted({min(depth - 1, (depth * k) // 4) for k in (1, 2, 3)})


def special_token_ids(family: str, tokenizer: Any) -> dict[str, int]:
    """Ids of the family's special/added tokens in ``tokenizer`` (content -> id)."""
    return {content: tokenizer.convert_tokens_to_ids(content) for content, _ in SPECIAL_TOKENS[family]}


def build_config(family: str, size: TinySize, tokenizer: Any) -> Any:
    """The model config of the real family class, with tiny sizes and token ids taken from ``tokenizer``."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2VLConfig,
        Qwen3_5Config,
        Qwen3_5MoeConfig,
        Qwen3VLConfig,
        Qwen3VLMoeConfig,
    )

    ids = special_token_ids(family, tokenizer)
    dense = dense_family(family)
    vocab = len(tokenizer)
    head_dim = size.hidden_size // size.heads
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(size.rope_theta) if size.rope_theta else _ROPE_THETA[dense],
        "mrope_section": mrope_section(family, head_dim),
    }
    if media_family(family) == "qwen3_vl":
        rope["mrope_interleaved"] = True
    if dense in PARTIAL_ROTARY:
        rope["partial_rotary_factor"] = PARTIAL_ROTARY[dense]
    text: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
        "max_position_embeddings": _MAX_POSITIONS[dense],
        "rope_parameters": rope,
        "rms_norm_eps": 1e-6,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": torch.float32,
    }
    common = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": size.tie_word_embeddings,
        "dtype": torch.float32,
    }
    patch = PATCH[media_family(family)]
    # fields every family's vision config shares; the Qwen2.5/Qwen3 towers also share the width fields
    grid = {"depth": size.vision_depth, "num_heads": size.vision_heads, "patch_size": patch,
            "spatial_merge_size": MERGE, "temporal_patch_size": _TEMPORAL_PATCH}
    widths = {"hidden_size": size.vision_hidden_size, "intermediate_size": size.vision_intermediate_size,
              "out_hidden_size": size.hidden_size}
    if family == "qwen2_vl":
        vision = {
            **grid,
            "embed_dim": size.vision_hidden_size,
            "hidden_size": size.hidden_size,
            "mlp_ratio": max(1, size.vision_intermediate_size // size.vision_hidden_size),
            "hidden_act": "quick_gelu",
        }
        return Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen2_5_vl":
        vision = {
            **grid, **widths,
            "tokens_per_second": 2,
            "window_size": 2 * patch * MERGE,  # 2x2 merged tokens per window (real: 112 px = 4x4)
            "fullatt_block_indexes": _full_attention_blocks(size.vision_depth),
            "hidden_act": "silu",
        }
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    text["head_dim"] = head_dim
    text["attention_bias"] = False
    vision = {
        **grid, **widths,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": _deepstack_indexes(size.vision_depth),
        "hidden_act": "gelu_pytorch_tanh",
    }
    if dense == "qwen3_5":
        # Qwen3.5: no deepstack taps; Gated DeltaNet layers with the real 128-wide heads (vLLM's CPU kernel,
        # chunk_gated_delta_rule_cpu, takes no other width), half as many key heads as value heads (Qwen3.5-9B:
        # 16 and 32), a 4-tap convolution
        del vision["deepstack_visual_indexes"]
        text.update({"layer_types": layer_types(family, size.layers), "linear_conv_kernel_dim": 4,
                     "linear_key_head_dim": _LINEAR_HEAD_DIM, "linear_value_head_dim": _LINEAR_HEAD_DIM,
                     "linear_num_key_heads": max(1, size.heads // 4), "linear_num_value_heads": max(2, size.heads // 2)})
        if not is_moe(family):
            return Qwen3_5Config(text_config=text, vision_config=vision, **common)
        # Qwen3.5-35B-A3B: every layer sparse with a gated shared expert beside the routed ones
        text.update({"num_experts": size.experts, "num_experts_per_tok": size.experts_per_token,
                     "moe_intermediate_size": size.moe_intermediate_size,
                     "shared_expert_intermediate_size": size.moe_intermediate_size,
                     "router_aux_loss_coef": _ROUTER_AUX_LOSS_COEF, "output_router_logits": False})
        return Qwen3_5MoeConfig(text_config=text, vision_config=vision, **common)
    if is_moe(family):  # every decoder layer sparse, as in Qwen3-VL-30B-A3B (decoder_sparse_step 1)
        text.update({"num_experts": size.experts, "num_experts_per_tok": size.experts_per_token,
                     "moe_intermediate_size": size.moe_intermediate_size, "decoder_sparse_step": 1,
                     "mlp_only_layers": [], "router_aux_loss_coef": _ROUTER_AUX_LOSS_COEF,
                     "output_router_logits": False,
                     # as the released config.json: transformers' router always renormalises the top-k weights
                     # (its config class has no such field) and vLLM 0.32 reads it
                     "norm_topk_prob": True})
        return Qwen3VLMoeConfig(text_config=text, vision_config=vision, **common)
    return Qwen3VLConfig(text_config=text, vision_config=vision, **common)


def build_processor(family: str, size: TinySize, tokenizer: Any) -> Any:
    """The family's real processor (image + video processor + tokenizer + chat template), tiny budgets."""
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    patch = PATCH[media_family(family)]
    geometry = {"patch_size": patch, "temporal_patch_size": _TEMPORAL_PATCH, "merge_size": MERGE}
    image_size = {"shortest_edge": size.image_min_pixels, "longest_edge": size.image_max_pixels}
    video_size = {"shortest_edge": size.video_min_pixels, "longest_edge": size.video_max_pixels}
    if media_family(family) == "qwen3_vl":  # the MoE and Qwen3.5 models take Qwen3-VL's (as the real ones do)
        half = [0.5, 0.5, 0.5]
        image_processor = Qwen2VLImageProcessor(size=image_size, image_mean=half, image_std=half, **geometry)
        video_processor = Qwen3VLVideoProcessor(
            size=video_size, image_mean=half, image_std=half, cap_pixels_per_frame=True, **geometry
        )
        cls = Qwen3VLProcessor
    else:
        image_processor = Qwen2VLImageProcessor(size=image_size, **geometry)
        video_processor = Qwen2VLVideoProcessor(size=video_size, cap_pixels_per_frame=True, **geometry)
        cls = Qwen2VLProcessor if family == "qwen2_vl" else Qwen2_5_VLProcessor
    return cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template(family),
    )


def build_model(family: str, config: Any, seed: int, *, dtype: Any = None, device: Any = "cpu") -> Any:
    """A random-weight model of ``config`` (fp32 unless ``dtype``), initialised on ``device`` (a GPU builds a
    billion-parameter model in seconds)."""
    import torch
    from transformers import (
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLForConditionalGeneration,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeForConditionalGeneration,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeForConditionalGeneration,
    )

    cls = {
        "qwen2_vl": Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": Qwen3VLForConditionalGeneration,
        "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration,
        "qwen3_5": Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    }[family]
    dtype = dtype or torch.float32
    cuda = torch.device(device).type == "cuda"
    with torch.random.fork_rng(devices=[torch.device(device)] if cuda else []), torch.device(device):
        torch.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)
        model = cls(config)
    return model.to(dtype).eval()


def count_parameters(model: Any) -> int:
    """Unique parameters (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------

INFO_FILE = "mmrl_tiny.json"


def settings(family: str, seed: int = 0, **size: Any) -> dict[str, Any]:
    """Every input that determines the files of a tiny model (what :func:`ensure_tiny` hashes)."""
    import transformers

    resolved = resolve_size(family, **size)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    return {
        "family": family,
        "seed": seed,
        # rope_theta came later: at its default it stays out, so every earlier model keeps its key
        # so do the MoE sizes of the dense families (always 0 there)
        "size": {k: v for k, v in dataclasses.asdict(resolved).items()
                 if v or k not in ("rope_theta", *MOE_DEFAULTS)},
        "mmrl": MMRL_VERSION,
        "builder": BUILDER_VERSION,
        "transformers": transformers.__version__,
    }


def settings_hash(family: str, seed: int = 0, **size: Any) -> str:
    blob = json.dumps(settings(family, seed, **size), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _write(family: str, seed: int, size: TinySize, target: Path, **build: Any) -> dict[str, Any]:
    """Build everything and save into ``target`` (an existing empty folder)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bars from a build
    try:
        return _write_files(family, seed, size, target, **build)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _write_files(family: str, seed: int, size: TinySize, target: Path, *, dtype: Any = None,
                 device: Any = "cpu", config_overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    from transformers import GenerationConfig

    from mmrl.model.weights import save_pretrained

    started = time.perf_counter()
    tokenizer = build_tokenizer(family, size.vocab_size)
    config = build_config(family, size, tokenizer)
    for part, values in (config_overrides or {}).items():  # e.g. {"text_config": {"vocab_size": 151936}}
        for key, value in values.items():
            setattr(getattr(config, part) if part else config, key, value)
    model = build_model(family, config, seed, dtype=dtype, device=device)
    ids = special_token_ids(family, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    save_pretrained(target, model)  # the family's published names and layout (what vLLM loads)
    processor = build_processor(family, size, tokenizer)
    processor.save_pretrained(target)
    info = {
        **settings(family, seed, **dataclasses.asdict(size)),
        "parameters": count_parameters(model),
        "tokenizer_size": len(tokenizer),
        "special_tokens": ids,
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    # Build time varies; keep it out of the byte-identical files (it is printed by the CLI instead).
    (target / INFO_FILE).write_text(
        json.dumps({k: v for k, v in info.items() if k != "build_seconds"}, indent=2, sort_keys=True) + "\n"
    )
    return info


def make_sized(family: str, out: str | os.PathLike[str], *, size: dict[str, Any], seed: int = 0,
               dtype: Any = None, device: Any = "cpu", config_overrides: dict[str, dict[str, Any]] | None = None,
               overwrite: bool = False) -> Path:
    """A random-weight model of ``family`` at any size (``size``: :class:`TinySize` fields; ``config_overrides``:
    attributes set on the config's parts after it is built, e.g. a real model's vocabulary rows and vision
    window), initialised on ``device`` and saved in ``dtype``, with mmrl's tokenizer and processor: the
    real architecture at a real size, for memory and speed checks (``python -m perf.gpu_check``)."""
    path, _ = _make(family, out, seed=seed, overwrite=overwrite, build={
        "dtype": dtype, "device": device, "config_overrides": config_overrides}, **size)
    return path


def make_tiny(family: str, out: str | os.PathLike[str], *, seed: int = 0, overwrite: bool = False,
              **size: Any) -> Path:
    """Build a tiny random-weight model of ``family`` into ``out`` and return its path.

    ``size`` keywords are the fields of :class:`TinySize` (``hidden_size``, ``layers``, ``heads``,
    ``kv_heads``, ``intermediate_size``, ``vision_depth``, ``vision_hidden_size``, ``vision_heads``,
    ``vision_intermediate_size``, ``vocab_size``, pixel budgets, ``tie_word_embeddings``). The folder is
    written atomically (temporary sibling, then rename). An existing non-empty ``out`` is an error unless
    ``overwrite=True``.
    """
    path, _ = _make(family, out, seed=seed, overwrite=overwrite, **size)
    return path


def _make(family: str, out: str | os.PathLike[str], *, seed: int = 0, overwrite: bool = False,
          build: dict[str, Any] | None = None, **size: Any) -> tuple[Path, dict[str, Any]]:
    check_family(family)
    resolved = resolve_size(family, **size)
    settings(family, seed, **dataclasses.asdict(resolved))  # validates the seed
    out = Path(out).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise MmrlError(f"{out}: already exists and is not empty; pass --force / overwrite=True to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        info = _write(family, seed, resolved, tmp, **(build or {}))
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out, info


def tiny_dir(family: str, seed: int = 0, **size: Any) -> Path:
    """Where :func:`ensure_tiny` keeps the model for these settings (it may not exist yet)."""
    return cache_dir() / "models" / f"{check_family(family)}-{settings_hash(family, seed, **size)}"


def ensure_tiny(family: str, seed: int = 0, **size: Any) -> Path:
    """Return the cached tiny model for these settings, building it first if needed.

    Safe under concurrent callers (e.g. pytest-xdist workers): each builds into its own temporary folder
    and the first rename wins; the others discard their copy.
    """
    final = tiny_dir(family, seed, **size)
    if (final / INFO_FILE).is_file():
        return final
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    _sweep_stale(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _write(family, seed, resolve_size(family, **size), tmp)
        if final.exists() and not (final / INFO_FILE).is_file():
            # Not ours (builds only ever appear by rename): a hand-made or damaged copy; replace it.
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / INFO_FILE).is_file():  # another process won the race -> use its copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _sweep_stale(root: Path, older_than_s: float = 3600.0) -> None:
    """Remove temporary build folders left by killed builds."""
    now = time.time()
    for p in root.glob(".*.tmp-*"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------

_DESCRIPTION = """\
Build a tiny random-weight Qwen-VL model offline, as an ordinary Hugging Face directory that loads with
AutoModelForImageTextToText.from_pretrained and AutoProcessor.from_pretrained.

It writes the real architecture of the family (Qwen2VLForConditionalGeneration,
Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration,
Qwen3_5ForConditionalGeneration with both Gated DeltaNet and full-attention layers, or
Qwen3_5MoeForConditionalGeneration) with seeded random float32 weights
(same seed => byte-identical model.safetensors), a byte-level BPE tokenizer trained here on a small built-in
corpus that carries the Qwen special tokens (<|im_start|>, <|im_end|>, <|vision_start|>, <|image_pad|>,
<|video_pad|>, ...), the family's real image/video processors with small pixel budgets, and a Qwen-VL style
chat template. Defaults give about 1-2M parameters. Nothing is downloaded.
"""


def add_parser(subparsers: Any) -> tuple[argparse.ArgumentParser, Any]:
    """Add ``mmrl models`` with its ``make-tiny`` sub-command; returns the parser and its sub-commands (where
    :func:`mmrl.toy.base.add_models_parser` adds ``make-toy-base``)."""
    parser = subparsers.add_parser(
        "models",
        help="build tiny Qwen-VL models offline (random weights or the toy base)",
        description="Model utilities.",
    )
    sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    make = sub.add_parser(
        "make-tiny",
        help="build a tiny random-weight Qwen-VL model directory",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    make.add_argument("--family", required=True, metavar="FAMILY",
                      help=f"model family: one of {', '.join(FAMILIES)}")
    make.add_argument("--out", required=True, metavar="DIR", help="output directory (must be empty or new)")
    make.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    make.add_argument("--force", action="store_true", help="replace a non-empty --out directory")
    add_size_options(make)
    make.set_defaults(func=_cmd_make_tiny)
    parser.set_defaults(func=lambda args: _print_help(parser))
    return parser, sub


def add_size_options(parser: argparse.ArgumentParser,
                      title: str = "size options (defaults in brackets; pixel budgets 0 = family default)") -> None:
    """One ``--kebab-case`` option per :class:`TinySize` field (None when not given)."""
    defaults = TinySize()
    group = parser.add_argument_group(title)
    for field in dataclasses.fields(TinySize):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "tie_word_embeddings":
            group.add_argument(flag, action="store_true", default=None, help=SIZE_HELP[field.name])
            continue
        group.add_argument(flag, type=int, default=None, metavar="N",
                           help=f"{SIZE_HELP[field.name]} [{getattr(defaults, field.name)}]")


def size_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`TinySize` options given on the command line."""
    size = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(TinySize)}
    return {k: v for k, v in size.items() if v is not None}


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    path, info = _make(args.family, args.out, seed=args.seed, overwrite=args.force, **size_options(args))
    ids = info["special_tokens"]
    print(
        f"built {args.family} in {path} ({info['parameters']:,} parameters, "
        f"{info['build_seconds']:.1f}s; {info['tokenizer_size']} tokens, "
        f"image_token_id {ids['<|image_pad|>']}, video_token_id {ids['<|video_pad|>']})"
    )
    return 0
