"""The size settings of a tiny model (:class:`TinySize`: every field a ``make_tiny`` keyword, a ``--kebab-case``
option of ``mmrl models make-tiny`` and a key of ``model.tiny_size``) and their checks, with the per-family
facts they depend on (patch size, partial rotary, full-attention interval, MoE defaults). Settings only: the
builders that write the model are :mod:`mmrl.toy.tiny_models`'; the schema checks ``model.tiny_size`` here
without importing them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrl.model.families import FAMILIES, dense_family, has_linear_attention, is_moe, media_family
from mmrl_common.errors import ConfigError

# Per-family fixed architecture facts (those of the real checkpoints; patch size by the media family).
PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}
MERGE = 2
# Qwen3.5 rotates a quarter of each full-attention head (partial_rotary_factor 0.25 in its config.json), and
# one full-attention layer follows every three Gated DeltaNet layers (full_attention_interval 4).
PARTIAL_ROTARY = {"qwen3_5": 0.25}
FULL_ATTENTION_INTERVAL = 4
# Mixture-of-experts defaults of a tiny model (Qwen3-VL-30B-A3B: 128 experts, 8 per token, 768 wide, every
# layer sparse, router_aux_loss_coef 0.001 in its config). Each expert 96 wide, so that no fused expert tensor is
# square at the default hidden size 128 (gate_up 192 x 128, down 128 x 96): a square one reads the same in both
# layouts, and transformers' loader, which tells the published layout from its own by the shape, cannot tell them
# apart (mmrl.model.weights.TRANSPOSED_IN_CHECKPOINTS)
MOE_DEFAULTS = {"experts": 4, "experts_per_token": 2, "moe_intermediate_size": 96}
@dataclasses.dataclass(frozen=True)
class TinySize:
    """Size settings of a tiny model. Every field is a ``make_tiny`` keyword and a ``--kebab-case`` option."""

    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_heads: int = 4
    vision_intermediate_size: int = 256
    vocab_size: int = 1536
    # Pixel budgets (0 = family default). Images: per image. Videos: per frame for Qwen2/2.5-VL, for the
    # whole clip for Qwen3-VL (that is how the real video processors read `size`).
    image_min_pixels: int = 0
    image_max_pixels: int = 0
    video_min_pixels: int = 0
    video_max_pixels: int = 0
    tie_word_embeddings: bool = False
    rope_theta: int = 0
    """Base of the language model's (M-)RoPE (0 = the family's: 1e6, Qwen3-VL 5e6)."""
    # Mixture-of-experts families only (0 = the tiny default: 4 experts, 2 per token, 96 wide)
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0


SIZE_HELP: dict[str, str] = {
    "hidden_size": "text hidden size (= vision out_hidden_size)",
    "layers": "text decoder layers",
    "heads": "text attention heads (head_dim = hidden/heads, even, >= 6)",
    "kv_heads": "text key/value heads (divides --heads)",
    "intermediate_size": "text MLP size",
    "vision_depth": "vision transformer blocks",
    "vision_hidden_size": "vision hidden size",
    "vision_heads": "vision attention heads (vision head_dim divisible by 4)",
    "vision_intermediate_size": "vision MLP size (Qwen2-VL: mlp_ratio = this / vision hidden)",
    "vocab_size": "target size of the trained BPE vocabulary, before the special tokens",
    "image_min_pixels": "image processor min pixels (0 = family default)",
    "image_max_pixels": "image processor max pixels (0 = family default)",
    "video_min_pixels": "video processor min pixels (0 = family default)",
    "video_max_pixels": "video processor max pixels; per frame for Qwen2/2.5-VL, per clip for Qwen3-VL",
    "tie_word_embeddings": "tie lm_head to the input embeddings",
    "rope_theta": "base of the text model's M-RoPE (0 = family default: 1e6, Qwen3-VL 5e6)",
    "experts": "MoE families: experts per layer (0 = 4)",
    "experts_per_token": "MoE families: experts each token is routed to (0 = 2)",
    "moe_intermediate_size": "MoE families: MLP size of each expert (0 = 96)",
}


def default_pixels(family: str) -> dict[str, int]:
    """Small CPU-friendly budgets; ``factor`` = patch * merge (28 or 32 pixels per merged token side)."""
    f = PATCH[media_family(family)] * MERGE
    if media_family(family) == "qwen3_vl":
        # Qwen3VLVideoProcessor compares frames*h*w with the budget: up to 16 frames of 16 tokens each.
        return {
            "image_min_pixels": 4 * f * f,
            "image_max_pixels": 64 * f * f,
            "video_min_pixels": 4 * f * f,
            "video_max_pixels": 16 * 16 * f * f,
        }
    return {
        "image_min_pixels": 4 * f * f,
        "image_max_pixels": 64 * f * f,
        "video_min_pixels": 4 * f * f,
        "video_max_pixels": 16 * f * f,
    }


def resolve_size(family: str, **size: Any) -> TinySize:
    """Validate ``size`` keywords and fill family defaults. Raises :class:`ConfigError` on bad values."""
    check_family(family)
    fields = {f.name for f in dataclasses.fields(TinySize)}
    unknown = sorted(set(size) - fields)
    if unknown:
        raise ConfigError(f"unknown tiny-model size option(s) {unknown}; known: {sorted(fields)}")
    values = {k: v for k, v in size.items() if v is not None}
    try:
        s = TinySize(**values)
    except TypeError as exc:  # pragma: no cover - dataclass signature errors
        raise ConfigError(str(exc)) from exc
    for name in fields - {"tie_word_embeddings"}:
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"tiny-model size option {name} must be a non-negative integer, got {value!r}")
    for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "vision_depth",
                 "vision_hidden_size", "vision_heads", "vision_intermediate_size"):
        if getattr(s, name) < 1:
            raise ConfigError(f"tiny-model size option {name} must be >= 1, got {getattr(s, name)}")
    if s.hidden_size % s.heads:
        raise ConfigError(f"hidden_size {s.hidden_size} is not divisible by heads {s.heads}")
    head_dim = s.hidden_size // s.heads
    if head_dim % 2 or head_dim < 6:
        raise ConfigError(f"text head_dim = hidden_size/heads = {head_dim} must be even and >= 6 (M-RoPE)")
    rotated = rotary_dim(family, head_dim)
    if rotated % 2 or rotated < 6:
        raise ConfigError(f"text head_dim = hidden_size/heads = {head_dim} rotates {rotated} dimensions in {family} "
                          "(a quarter of the head), which must be even and >= 6 (M-RoPE): make head_dim a "
                          "multiple of 8, at least 24")
    if has_linear_attention(family) and s.layers < 2:
        raise ConfigError(f"{family} needs layers >= 2 (a Gated DeltaNet layer and a full-attention layer), "
                          f"got {s.layers}")
    if s.heads % s.kv_heads:
        raise ConfigError(f"heads {s.heads} is not divisible by kv_heads {s.kv_heads}")
    if s.vision_hidden_size % s.vision_heads or (s.vision_hidden_size // s.vision_heads) % 4:
        raise ConfigError(
            f"vision_hidden_size {s.vision_hidden_size} / vision_heads {s.vision_heads} must be an integer "
            "divisible by 4 (2-D vision RoPE)"
        )
    if s.vocab_size < 300:
        raise ConfigError(f"vocab_size {s.vocab_size} is too small: the byte alphabet alone has 256 tokens")
    moe = {k: getattr(s, k) for k in MOE_DEFAULTS}
    if not is_moe(family):
        given = sorted(k for k, v in moe.items() if v)
        if given:
            raise ConfigError(f"tiny-model size option(s) {given} are for mixture-of-experts families "
                              f"({', '.join(f for f in FAMILIES if is_moe(f))}), not {family}")
    else:
        moe = {k: v or MOE_DEFAULTS[k] for k, v in moe.items()}
        if moe["experts_per_token"] > moe["experts"]:
            raise ConfigError(f"tiny-model size option experts_per_token {moe['experts_per_token']} is larger "
                              f"than experts {moe['experts']}")
    pixels = default_pixels(family)
    fixed = {**moe, **{k: (getattr(s, k) or v) for k, v in pixels.items()}}
    for kind in ("image", "video"):
        lo, hi = fixed[f"{kind}_min_pixels"], fixed[f"{kind}_max_pixels"]
        if lo > hi:
            raise ConfigError(f"{kind}_min_pixels {lo} is larger than {kind}_max_pixels {hi}")
    return dataclasses.replace(s, **fixed)


def rotary_dim(family: str, head_dim: int) -> int:
    """How many of a full-attention head's dimensions the (M-)RoPE rotates (all but in Qwen3.5)."""
    return int(head_dim * PARTIAL_ROTARY.get(dense_family(family), 1.0))


def layer_types(family: str, layers: int) -> list[str] | None:
    """Qwen3.5's decoder layer kinds: a full-attention layer closes every group of ``interval`` layers, where the
    interval is the real one (4) or the depth when that is smaller, so that a tiny model has both kinds
    (``["linear_attention", "full_attention"]`` at 2 layers). None for the other families."""
    if not has_linear_attention(family):
        return None
    interval = min(FULL_ATTENTION_INTERVAL, layers)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ConfigError(f"unknown model family {family!r}; choose one of: {', '.join(FAMILIES)}")
    return family


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------
