"""The run configuration of ``mmrl train``, ``mmrl sft`` and ``mmrl eval``.

A task recipe (``configs/<task>.yaml``) fills these dataclasses; a user YAML (``--config``) and dotted
overrides (``train.lr=1e-5``) are merged on top. See :mod:`mmrl.config.io` for the checking rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmrl.config.io import apply_overrides, deep_merge, from_dict, load_yaml
from mmrl.config.prompt_templates import resolve_template
from mmrl.config.tiny_size import resolve_size
from mmrl.config.toy import check_overrides
from mmrl.grpo.config import GRPOConfig, check_number, range_words
from mmrl.model.families import DEFAULT_TARGETS, FAMILIES
from mmrl_common.errors import ConfigError
from rewards.registry import RewardSpec
from video.decoders import DECODERS, DEFAULT_DECODE_TIMEOUT, decoder_problem

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class Range:
    """The values a count, size or rate setting may take: a finite number (a whole one with ``whole``) within
    ``low``/``high`` (None: no bound; ``*_open``: the bound itself excluded); null passes where the key allows
    it (off, or derived from the run), as do the words in ``words`` (``auto``). ``why`` replaces the generic
    "must be ..." of the error; ``hint`` is added to it."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False
    why: str = ""
    hint: str = ""
    words: tuple[str, ...] = ()

    def text(self) -> str:
        """The allowed range in words (``a whole number >= 1``, ``a finite number in (0, 1]``)."""
        where = range_words(self.low, self.high, self.low_open, self.high_open)
        return ("a whole number" if self.whole else "a finite number") + (f" {where}" if where else "")

    def ok(self, value: Any) -> bool:
        if value is None or (isinstance(value, str) and value in self.words):
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.whole and not float(value).is_integer():
            return False
        return ((self.low is None or (value > self.low if self.low_open else value >= self.low))
                and (self.high is None or (value < self.high if self.high_open else value <= self.high)))


def _count(low: int = 1, hint: str = "", **kw: Any) -> Range:
    return Range(low, whole=True, hint=hint, **kw)


SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit
_NEW_TOKENS = "a completion needs at least one new token; use e.g. 64 (the toy answers) or 512-1024 (reasoning)"

RANGES: dict[str, Range] = {
    # every count, size and rate setting of the run config and the values it may take; each section checks its
    # own keys when it is built (:func:`check_ranges`), so a bad value is refused when the config loads, before
    # anything else does (`config show` too), in one line naming the key, the value and the range
    "model.tiny_seed": _count(0, high=SEED_MAX),
    "model.router_aux_loss_coef": Range(0, hint="or null: the model config's own; 0: off"),
    "model.lora.r": _count(1, hint="the rank of the adapters, e.g. 16"),
    "model.lora.alpha": Range(0, low_open=True, hint="the update is scaled by alpha / r"),
    "model.lora.dropout": Range(0, 1, high_open=True),
    "data.max_question_chars": _count(1, hint="default 20000"),
    "data.toy_seed": _count(0, high=SEED_MAX),
    "data.media.fps": Range(0, low_open=True, hint="frames sampled per second of video, e.g. 2"),
    "data.media.nframes": _count(1, hint="or null: use fps"),
    "data.media.min_frames": _count(1),
    "data.media.max_frames": _count(1),
    "data.media.video_min_pixels": _count(1),
    "data.media.video_max_pixels": _count(1),
    "data.media.video_total_pixels": _count(0, hint="pixels for the whole video; 0 or null: off"),
    "data.media.image_min_pixels": _count(1),
    "data.media.image_max_pixels": _count(1),
    "data.media.cache_mb": Range(0, hint="0: no cache"),
    "data.media.decode_timeout": Range(0, hint="seconds a video may take to open or to read; 0 or null: no limit"),
    "rollout.group_size": _count(2, why="GRPO compares the rollouts of a prompt with each other, so one rollout per "
                                      "prompt has advantage 0 and never learns; use 2 or more (8 is usual)"),
    "rollout.temperature": Range(0, low_open=True, why="must be a finite number > 0; training rollouts must be "
                                 "sampled (every rollout of a group would be the same greedy answer); use e.g. 1.0"),
    "rollout.top_p": Range(0, 1, low_open=True, hint="1: off"),
    "rollout.top_k": _count(0, hint="0: off"),
    "rollout.max_new_tokens": _count(1, why=_NEW_TOKENS),
    "rollout.max_turns": _count(1),
    "rollout.vllm.gpu_memory_utilization": Range(0, 1, low_open=True),
    "rollout.vllm.max_model_len": _count(16, hint="shorter is too small for any prompt; or null: derived from the run"),
    "rollout.vllm.tensor_parallel_size": _count(1),
    "rollout.vllm.max_num_seqs": _count(1, hint="or null: derived from the run"),
    "rollout.vllm.max_num_batched_tokens": _count(1, hint="or null: derived from the run"),
    "rollout.vllm.kv_cache_gb": _count(1),
    "rollout.vllm.max_media_per_prompt": _count(1, hint="or null: derived from the run"),
    # grpo: GRPOConfig (mmrl.grpo.config) refuses these itself when built; listed so that every key has its range
    "grpo.adv_eps": Range(0),
    "grpo.clip_low": Range(0, 1, high_open=True),
    "grpo.clip_high": Range(0),
    "grpo.dual_clip_c": Range(1, low_open=True, hint="e.g. 3.0, or null: off"),
    "grpo.loss_norm_const": Range(0, low_open=True),
    "grpo.kl_coef": Range(0),
    "grpo.kl_clamp": Range(0, low_open=True, hint="or null: no clamp"),
    "grpo.entropy_coef": Range(hint="a bonus when > 0, a penalty when < 0"),
    "grpo.tis_cap": Range(0, hint="0: off"),
    "grpo.ppo_epochs": _count(1),
    "grpo.ppo_mini_batch_size": _count(1, hint="or null: the whole batch"),
    "grpo.dynamic_sampling_tol": Range(0),
    "grpo.max_draws": _count(0),
    "grpo.max_response_length": _count(1),
    "grpo.overlong_cache": _count(1),
    "grpo.overlong_penalty_factor": Range(0),
    "rewards.weight": Range(hint="the reward's factor in the total"),
    "train.steps": _count(1, hint="RL steps; for a cold start alone use mmrl sft"),
    "train.prompts_per_step": _count(1, hint="each prompt is rolled out rollout.group_size times"),
    "train.micro_batch_size": _count(1),
    "train.sequence_parallel_size": _count(1, hint="1: off; a divisor of the number of ranks"),
    "train.micro_batch_tokens": _count(0, words=("auto",), hint="0: off; auto: sized from the group and media"),
    "train.lr": Range(0, low_open=True, hint="the peak learning rate, e.g. 1e-6"),
    "train.warmup_steps": _count(0),
    "train.min_lr_ratio": Range(0, 1),
    "train.weight_decay": Range(0),
    "train.max_grad_norm": Range(0, low_open=True, hint="gradients are clipped to it; a large value such as 1e9 "
                                                        "hardly clips"),
    "train.max_skipped_updates_frac": Range(0, 1, low_open=True, hint="1: never stop"),
    "train.seed": _count(0, high=SEED_MAX),
    "train.eval_every": _count(0, hint="0: only before and after RL"),
    "train.save_every": _count(0, hint="0: only at the last step"),
    "train.keep_checkpoints": _count(0, hint="0: all"),
    "train.log_rollouts": _count(0),
    "train.log_every": _count(0, hint="0: never"),
    "train.cpu_threads": _count(1, words=("auto",)),
    "train.logprob_chunk_tokens": _count(0, hint="0: all at once"),
    "train.dist_timeout_minutes": Range(0, low_open=True),
    "train.health_window": _count(0, hint="0: off"),
    "sft.steps": _count(0, hint="0: no cold start"),
    "sft.lr": Range(0, low_open=True, hint="the cold start's learning rate, e.g. 1e-4"),
    "sft.batch_size": _count(1),
    "sft.warmup_steps": _count(0),
    "eval.limit": _count(1, hint="or null: every question"),
    "eval.batch_size": _count(1, hint="questions per generate call, e.g. 16"),
    "eval.max_new_tokens": _count(1, why="an answer needs at least one new token; use e.g. 64, or null for "
                                         "rollout.max_new_tokens"),
    "eval.min_options": _count(0, hint="0: every question counts"),
}


def check_value(key: str, value: Any, rng: Range) -> None:
    """A :class:`ConfigError` naming ``key``, ``value`` and the range when ``value`` is outside ``rng``."""
    if rng.ok(value):
        return
    why = rng.why or f"must be {rng.text()}{' or ' + ', '.join(rng.words) if rng.words else ''}"
    raise ConfigError(f"{key}={value!r}: {why}" + (f" ({rng.hint})" if rng.hint and not rng.why else ""))


def check_ranges(section: Any, prefix: str) -> None:
    """Check the keys of config section ``section`` (at ``prefix``, e.g. ``data.media``) against
    :data:`RANGES`."""
    for key, rng in RANGES.items():
        head, _, name = key.rpartition(".")
        if head == prefix:
            check_value(key, getattr(section, name), rng)


LORA_TARGETS = list(DEFAULT_TARGETS)  # Qwen3.5 adds its Gated DeltaNet projections (lora.default_targets)


@dataclass
class LoraSettings:
    r: int = 16
    """Rank of the low-rank update."""
    alpha: float = 32
    """Scale numerator: the update is multiplied by alpha / r."""
    dropout: float = 0.05
    """Dropout on the adapters' input while training."""
    target_modules: list[str] | str = field(default_factory=lambda: list(LORA_TARGETS))
    """Module names under the language model that get adapters (the vision tower and merger never do), or a
    regular expression matched against full module names (e.g. to include the vision tower)."""

    def __post_init__(self) -> None:
        check_ranges(self, "model.lora")
        if not self.target_modules:
            raise ConfigError("model.lora.target_modules is empty: name the modules that get adapters")


@dataclass
class ModelConfig:
    path: str | None = None
    """A Hugging Face model folder (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, their MoE ones). Empty: a tiny model built by
    mmrl."""
    init: Literal["random", "toy_base"] = "random"
    """With model.path empty: `random` (tiny random-weight model) or `toy_base` (the tiny model pre-trained
    to name what it sees in the toy world; built once, cached; `mmrl models make-toy-base`)."""
    tiny_family: Literal[FAMILIES] = "qwen2_5_vl"
    """Architecture of the tiny random-weight model built when model.path is empty."""
    tiny_seed: int = 0
    """Seed of the tiny model's random weights."""
    tiny_size: dict[str, int] = field(default_factory=dict)
    """Size overrides of the tiny model (hidden_size, layers, ...; empty: the default tiny size). With init
    toy_base, the size of the tiny model the toy base is pre-trained from (each size is its own cached base)."""
    toy_base: dict[str, Any] = field(default_factory=dict)
    """With init toy_base: overrides of how the toy base model is pre-trained (mmrl.toy.base.BaseRecipe, e.g.
    {letter_share: 0.5}: half of the requests with a word list posed as lettered options; {pointer_steps: 6000}:
    a text-only phase first that maps a named word to its option's letter). Each variant is
    built once and cached beside the default one; empty: the default base."""
    dtype: Literal["fp32", "bf16"] = "fp32"
    """Weights and compute dtype. bf16: the model runs in bf16 while the optimizer steps fp32 master weights
    (and fp32 moments), so small learning rates (1e-6) still move every weight; checkpoints hold the
    model in bf16 plus the fp32 master in the trainer state."""
    device: str = "auto"
    """`auto` (the first GPU if there is one, else the CPU), `cpu`, `cuda`, `cuda:1`, ..."""
    freeze_vision: bool = False
    """Keep the vision tower's weights fixed."""
    freeze_merger: bool = False
    """Keep the vision-to-language merger (projector) fixed."""
    freeze_llm: bool = False
    """Keep the language model's weights fixed."""
    share_vision_features: bool = True
    """Run the vision tower once per unique media item per forward pass and share it across the group."""
    cache_vision_features: bool = True
    """Reuse vision features across the passes of a step: with a frozen tower (freeze_vision and
    freeze_merger) each media item is encoded once per step (rollout, reference, old log-probs and update);
    with a trainable one the passes without gradient share one encoding per model and weights. Exact."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "varlen"] = "sdpa"
    """Attention kernel: sdpa (PyTorch's), eager, flash_attention_2 (GPUs, needs the flash-attn package: pip
    install 'mmrl[flash-attn]'), or varlen (mmrl.model.varlen: no extra package; the vision tower's windows and
    the packed log-prob rows in one variable-length attention call per layer, through torch's varlen_attn on a
    GPU and one padded sdpa call elsewhere; sdpa makes one call per vision window, 7,232 a forward at 4,096
    vision tokens, and attends over a packed row's whole width). The same results as sdpa within round-off."""
    router_aux_loss_coef: float | None = None
    """Mixture-of-experts models (qwen3_vl_moe): weight of the router's load-balancing loss (transformers'
    load_balancing_loss_func over every token the update's passes route) added to the policy loss and logged as
    router_aux_loss. null: the model config's own text_config.router_aux_loss_coef (Qwen3-VL-30B-A3B: 0.001);
    0: off. A dense model takes null or 0."""
    lora: LoraSettings | dict[str, Any] | None = None
    """LoRA through PEFT (null: off, full fine-tuning). A mapping turns it on: {r, alpha, dropout,
    target_modules}, e.g. model.lora={r: 8} or model.lora={} for the defaults. Only the adapters train; the
    KL reference is the model with the adapters disabled (no copy)."""

    def __post_init__(self) -> None:
        check_ranges(self, "model")
        # transformers' internals mmrl uses (weight conversions, attention registries) at the tested versions
        from mmrl.config.preflight import check_version

        check_version("transformers", setting="model")
        if self.attn_implementation == "flash_attention_2":
            import importlib.util

            if importlib.util.find_spec("flash_attn") is None:
                raise ConfigError("model.attn_implementation=flash_attention_2 needs the flash-attn package "
                                  "(GPUs): pip install 'mmrl[flash-attn]'; or use sdpa")
        if isinstance(self.lora, dict):  # a mapping LoraSettings refused: its own error names the key
            self.lora = from_dict(LoraSettings, self.lora, prefix="model.lora")
        if self.tiny_size:
            try:
                resolve_size(self.tiny_family, **self.tiny_size)
            except ConfigError as exc:
                raise ConfigError(f"model.tiny_size: {exc}") from None
        if self.toy_base:
            check_overrides(self.toy_base, prefix="model.toy_base")


@dataclass
class MediaConfig:
    video_policy: str = "qwen"
    """Frame-sampling policy: qwen (as qwen-vl-utils), uniform, segments, or a registered one."""
    fps: float = 2.0
    """Frames sampled per second of video (before min_frames/max_frames apply)."""
    nframes: int | None = None
    """A fixed number of frames per video instead of fps (null: use fps)."""
    min_frames: int = 4
    """Fewest frames sampled from a video."""
    max_frames: int = 16
    """Most frames sampled from a video."""
    video_min_pixels: int = 16 * 28 * 28
    """Smallest frame size in pixels (frames are resized up to it)."""
    video_max_pixels: int = 64 * 28 * 28
    """Largest frame size in pixels (frames are resized down to it; 28x28 pixels make one visual token)."""
    video_total_pixels: int | None = None
    """Pixel budget of the whole video (qwen-vl-utils' ``total_pixels``): each of the T sampled frames is capped at
    total/T*2 pixels, as qwen_vl_utils.fetch_video does, and at video_max_pixels (0 or null: off)."""
    image_min_pixels: int = 16 * 28 * 28
    """Smallest image size in pixels."""
    image_max_pixels: int = 256 * 28 * 28
    """Largest image size in pixels (28x28 pixels make one visual token)."""
    cache_mb: float = 1024
    """Decoded media kept in memory between steps (LRU, megabytes of pixels; 0: no cache)."""
    decoder: Literal["auto", "decord", "pyav", "torchcodec"] = "auto"
    """Video decoder: auto (decord, falling back to PyAV), decord, pyav, or torchcodec (not installed with mmrl:
    pip install torchcodec, and it needs FFmpeg's shared libraries)."""
    decode_timeout: float | None = DEFAULT_DECODE_TIMEOUT
    """Seconds opening a video, or reading its frames, may take; past it the video is a bad file, named (skipped
    with data.on_bad_sample=skip). 0 or null: no limit."""

    def __post_init__(self) -> None:
        check_ranges(self, "data.media")
        problem = decoder_problem(self.decoder)
        if problem is not None:
            raise ConfigError(f"data.media.decoder={self.decoder}: {problem}" if self.decoder in DECODERS
                              else f"data.media.decoder: {problem}")
        for kind in ("video", "image"):
            lo, hi = getattr(self, f"{kind}_min_pixels"), getattr(self, f"{kind}_max_pixels")
            if lo > hi:
                raise ConfigError(f"data.media.{kind}_min_pixels={lo} is above data.media.{kind}_max_pixels={hi}; "
                                  f"lower {kind}_min_pixels or raise {kind}_max_pixels")
        if self.min_frames > self.max_frames:
            raise ConfigError(f"data.media.min_frames={self.min_frames} is above data.media.max_frames="
                              f"{self.max_frames}")


@dataclass
class DataConfig:
    train: str | None = None
    """Training file (JSONL/JSON/Parquet/datasets folder). Empty: the toy world's train split."""
    val: str | None = None
    """Validation file (empty with the toy world: its val split)."""
    test: str | None = None
    """Test file used by the held-out evaluation (--eval-data; empty with the toy world: its test split)."""
    format: str = "auto"
    """File and/or record format: jsonl, json, parquet, csv, hf; native, video-r1, easyr1, sharegpt (llava); e.g. video-r1+json."""
    columns: dict[str, str] = field(default_factory=dict)
    """Source column -> record field, e.g. {query: question, level: meta.difficulty}."""
    media_root: str | None = None
    """Folder that relative media paths resolve against (empty: the data file's folder)."""
    on_bad_sample: Literal["raise", "skip"] = "raise"
    """A bad record or media file: raise stops at load with every problem listed as FILE:LINE; skip leaves
    those records out and names each one on the console and in the report."""
    check_media: Literal["decode", "exists", "none"] = "decode"
    """Before training, check every media file: decode (open it and decode first/middle/last video frames,
    in parallel, cached by path and a digest of the file's content), exists (present and not empty) or none."""
    max_question_chars: int = 20_000
    """The longest prompt text a record may have: its question plus its options' texts, in characters (about
    5,000 tokens). A longer record is refused at load, named FILE:LINE with its length (skipped with
    on_bad_sample=skip)."""
    toy_seed: int = 0
    """With the toy world: its generation seed."""
    toy_tasks: list[str] = field(default_factory=list)
    """With the toy world: generate only these tasks (empty: all)."""
    toy_size: dict[str, int] = field(default_factory=dict)
    """With the toy world: records per task and split, e.g. {train: 48, val: 10, test: 10} (empty: default)."""
    toy_world: dict[str, int] = field(default_factory=dict)
    """With the toy world: how its videos are drawn, e.g. {motion_trail: 4, needle_frames: 16} (motion_trail:
    fading copies behind the moving square, 0 none; needle_frames: frames a needle video is sampled at, 8).
    A toy base model is pre-trained on the same world. Empty: the world as always drawn."""
    problem_types: list[str] = field(default_factory=list)
    """Keep only these problem types (empty: all)."""
    sampler: str = "uniform"
    """How training prompts are drawn: uniform, or a registered sampler (variance-aware, curricula)."""
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)
    """Settings of the sampler."""
    media: MediaConfig = field(default_factory=MediaConfig)
    """Frame sampling and pixel budgets of images and videos."""

    def __post_init__(self) -> None:
        check_ranges(self, "data")
        if self.toy_world:
            from data_pipelines.toy.registry import world_config
            from mmrl_common.errors import DataError

            try:
                world_config(world=self.toy_world)
            except DataError as exc:
                raise ConfigError(f"data.toy_world: {exc}") from None


@dataclass
class PromptConfig:
    template: str = "default"
    """Name of a registered prompt template, or a format string with {question} and {options}."""
    system: str | None = None
    """A system message (empty: none)."""
    answer_format: Literal["think_answer", "answer"] = "think_answer"
    """What the prompt asks for: think_answer (<think>...</think><answer>...</answer>) or answer only."""
    video_layout: Literal["video", "frames"] = "video"
    """How a video is shown: video (one video, as Qwen-VL takes it) or frames (each sampled frame as a
    one-frame video after its label "Frame k @ t.ts:", as EARL and FrameThinker number frames; an environment
    shows its new frames the same way)."""

    def __post_init__(self) -> None:
        resolve_template(self.template)  # a typo of a template name fails when the config loads


@dataclass
class VLLMConfig:
    """The vLLM engine of ``rollout.backend: vllm``: one per training rank (its own GPU), colocated with
    training, built once from the model folder and fed the policy's weights after every update."""

    gpu_memory_utilization: float = 0.3
    """The share of its GPU's memory the engine may take (weights, activations and KV cache); the rest is the
    trainer's. With enable_sleep_mode the engine gives its KV cache (and weights) back during the update."""
    max_model_len: int | None = None
    """Longest prompt plus completion in tokens (null: a bound from the run's own settings: 2,048 text tokens,
    one video and one image at data.media's budgets, and rollout.max_new_tokens per turn). A prompt over it is
    refused with its sample named; the model's own 128k context would need a KV cache a 7B cannot spare."""
    tensor_parallel_size: int = 1
    """GPUs one engine spans (consecutive ranks form a group and share it; must divide the number of ranks)."""
    enforce_eager: bool | None = None
    """Skip CUDA graphs and compilation (less memory and a faster start, slower decoding); null: on CPUs only."""
    max_num_seqs: int | None = None
    """Sequences the engine decodes at once (null: what one rollout call of the run asks for: the prompts a rank
    rolls out per step times rollout.group_size, or eval.batch_size if larger)."""
    max_num_batched_tokens: int | None = None
    """Tokens the engine schedules in one forward step (null: max_model_len, so a whole prompt with its media
    prefills in one step, and at least max_num_seqs; vLLM's own default grows with the GPU)."""
    enable_sleep_mode: bool = False
    """The engine sleeps after each rollout session and wakes before the next, so the update has its memory
    (CUDA only)."""
    sleep_level: Literal[1, 2] = 1
    """1: the weights move to host memory and the KV cache is dropped; 2: both dropped (the weights are pushed
    again at waking anyway, so 2 saves host memory)."""
    offload_optimizer: bool | Literal["auto"] = "auto"
    """The fp32 master weights and AdamW moments (12 bytes a parameter; a 3B: 45 GB) move to host memory
    (pinned) while the engine is awake and come back for the update, bit for bit, so a one-GPU full fine-tune
    has room for the engine beside its bf16 weights. auto: on for a full fine-tune (no LoRA) with mmrl's own
    AdamW and enable_sleep_mode on a GPU (without sleep mode the engine never gives its memory back and the
    move gains nothing); true: whenever rollout.backend=vllm (CPUs too); false: never. Costs two copies of
    that state a step over the host link. Not with train.deepspeed (its train.offload moves its own state)."""
    kv_cache_gb: int = 1
    """The KV cache on a CPU (VLLM_CPU_KVCACHE_SPACE when not set already); GPUs use gpu_memory_utilization."""
    max_media_per_prompt: int | None = None
    """Images and videos (each) one prompt may carry (null: from the run's data: the most images and videos
    one record holds, a video counted once per frame with prompt.video_layout=frames, and more for each later
    turn with an environment). vLLM sizes its memory profile by it; a prompt with more is refused."""
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    """Settings of the engine's media processor, over the derived ones (empty: the image budget, images_kwargs.
    size, from data.media, the records' sampling hints and the environment's max_pixels, within the model
    folder's processor bounds, so the engine tokenises media as the trainer does and sizes its memory profile
    for the run's images; the video processor keeps the folder's settings)."""

    def __post_init__(self) -> None:
        check_ranges(self, "rollout.vllm")


@dataclass
class RolloutConfig:
    backend: str = "hf"
    """Generation engine: hf (transformers generate) or vllm."""
    group_size: int = 8
    """Rollouts per prompt (G): GRPO compares them with each other."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1: off)."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0: off)."""
    max_new_tokens: int = 64
    """Longest completion in tokens (a completion cut here is truncated; evaluation uses it too)."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion (e.g. ["</answer>"])."""
    environment: str | None = None
    """A registered multi-turn environment (frame selection, zoom-in); empty: single turn."""
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    """Settings of the environment."""
    max_turns: int = 1
    """Most assistant turns per episode with an environment."""
    record_logprobs: bool | None = None
    """Keep the sampling log-probabilities of every rollout token in the batch (``rollout_logprobs``); each step
    then logs rollout_logprob_gap, the mean |training - rollout| log-prob per token, and the run-health check
    warns when it grows. null: on with rollout.backend=vllm at temperature 1 (the engine's numbers are not the
    trainer's: the gap is worth watching), off otherwise."""
    record_entropies: bool = False
    """Keep the per-token entropies of every rollout in the batch (``entropies``; rewards see them)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's settings (rollout.backend: vllm)."""
    seed_per_prompt: bool = False
    """Draw each prompt's rollouts from a random stream of its own (seeded by train.seed, the step and the
    prompt's place in the step's draw): the same rollouts whatever the number of ranks or the batching, so
    a run on N ranks reproduces a single-process run. Costs HF generate its batching across prompts."""
    prefill_once: bool = True
    """HF backend: run each prompt (vision tokens included) through the model once and decode its group_size
    samples from copies of its KV cache, instead of computing the prompt once per sample: the same tokens,
    log-probabilities up to fp32 round-off (false: plain transformers generate; vLLM caches prefixes itself)."""

    def __post_init__(self) -> None:
        check_ranges(self, "rollout")
        if self.record_logprobs is None:  # vLLM's log-probs are exact at temperature 1 only (mmrl.engine.backends.vllm)
            self.record_logprobs = self.backend == "vllm" and self.temperature == 1.0
        if self.backend == "vllm":
            from mmrl.config.preflight import check_sleep_mode_allocator, check_version

            check_version("vllm", setting="rollout.backend=vllm")
            if self.vllm.enable_sleep_mode:
                check_sleep_mode_allocator()
        if self.backend not in ("hf", "vllm"):  # another backend is one an imports: module registered
            from mmrl.config.backends import BACKENDS

            BACKENDS.get(self.backend)  # a ConfigError naming the nearest and the valid backends


@dataclass
class TrainConfig:
    steps: int = 100
    """RL steps (the LR schedule spans them; changing it on --resume reshapes the schedule)."""
    prompts_per_step: int = 8
    """Prompts per step; each is rolled out group_size times."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass; gradients accumulate over the step's micro-batches. Unused by the
    passes while micro_batch_tokens is set (the real-model preset sets it)."""
    micro_batch_tokens: int | Literal["auto"] = 0
    """Micro-batches by a token budget instead of micro_batch_size: sequences join a micro-batch, in order,
    while the tokens its pass computes stay within this, a group's shared prompt counted once (with
    shared_prefix) and each sequence's own tokens after it; a group is never split where it fits whole, and
    a longer sequence is a micro-batch alone. With padding_free a pass costs about its token count, so long
    and short rollouts make evenly sized passes, and on a GPU fewer, larger passes keep it busy (the update
    is host-bound at a few thousand tokens a pass). The loss is the same either way (normalised over the
    whole mini-batch). 0: off (micro_batch_size rows). auto (the real-model preset's), resolved when the
    config loads (`mmrl config show` prints the number): max(16384, one whole group), 16384 being verl's
    default token budget per GPU (ppo_max_token_len_per_gpu) and one group its prompt at the media caps
    (ceil(frames / 2) x video_max_pixels / 784 vision tokens for a video, image_max_pixels / 784 for an
    image: Qwen2.5-VL's 28x28 pixels a token, an upper bound for Qwen3-VL's 32x32; one medium a prompt) plus
    1024 text tokens, and group_size x max_turns x max_new_tokens answer tokens (an environment's own turns
    not counted). At the preset's media (32 frames of 256 tokens: 4,096) and 8 x 768 answer tokens a group
    is 11,264 tokens: 16384."""
    padding_free: bool = True
    """Log-prob passes put their sequences back to back without padding, each with its own positions and
    attending only to itself (flash_attention_2: one row and flash attention's variable-length kernel; sdpa
    and eager: a block-diagonal mask over rows sized by the model's compute costs). The shared-prefix path
    packs its prompt pass. The same log-probs and gradients as padded, within round-off, and faster: on CPU
    (sdpa) a tiny model's forward and backward of 16 rollouts of 35-154 tokens took 140 ms instead of 236 ms.
    Off: right-padded batches."""
    lr: float = 1e-6
    """Peak learning rate (AdamW)."""
    lr_schedule: Literal["cosine", "constant", "linear"] = "cosine"
    """The learning rate after the warm-up, over train.steps: cosine (half-cosine decay to min_lr_ratio of the
    peak at the last step), linear (a straight line to it) or constant (the peak throughout). The default,
    cosine, is what mmrl always did (the toy runs and compare specs keep it); each method recipe sets its
    source's. A curriculum stage that resets the optimizer restarts it (plugins.curriculum)."""
    warmup_steps: int = 0
    """Linear warm-up steps (from peak/warmup_steps to the peak) before the schedule's decay, with any
    lr_schedule."""
    min_lr_ratio: float = 0.0
    """A cosine or linear decay ends at this fraction of the peak learning rate (constant: unused)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    max_skipped_updates_frac: float = 0.5
    """The run stops (exit status 2, the report says why) when more than this fraction of its last 20
    optimizer steps (judged from the 4th) were skipped for a non-finite loss or gradient: such a run is
    diverging (a learning rate far too high, a reward or loss giving NaN) and its checkpoints would only
    hold its last good weights. 1: never stop."""
    seed: int = 0
    """Seed of everything random in the run (sampling order, rollouts, cold start)."""
    eval_every: int = 0
    """Held-out evaluation every this many RL steps (0: only before and after RL)."""
    save_every: int = 50
    """A checkpoint every this many steps (and at the last step; 0: only at the last step)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept (0: all)."""
    log_rollouts: int = 4
    """Completions per step written to rollouts.jsonl."""
    log_every: int = 10
    """Print a one-line summary every this many steps (0: never)."""
    cpu_threads: int | Literal["auto"] = "auto"
    """torch CPU threads. auto: the CPU cores not busy with other processes when the run starts (at least
    1; OMP_NUM_THREADS wins when set). On a shared machine more threads than free cores make every step
    many times slower."""
    deepspeed: str | None = None
    """DeepSpeed ZeRO for data-parallel training under torchrun: `zero2` (optimizer state and gradients
    sharded), `zero3` (parameters too; the KL reference is sharded alike) or a DeepSpeed JSON file (batch
    sizes, clipping and bf16 are filled in from the run's settings). Empty: torch AdamW; under torchrun
    gradients are summed over ranks (plain data parallelism)."""
    offload: Literal["none", "optimizer", "all"] = "none"
    """DeepSpeed CPU offload (train.deepspeed): optimizer (the fp32 masters and Adam moments live in host memory
    and DeepSpeed's CPU Adam steps them: 12 of the 16 bytes a parameter costs leave the GPU) or all (the
    parameters too; ZeRO-3 only). Slower steps, for models that do not fit otherwise."""
    logprob_chunk_tokens: int = 1024
    """Response tokens whose full-vocabulary log-softmax is built at once in log-prob passes (forward and
    backward hold one chunk's; 0: all at once, the most memory)."""
    shared_prefix: bool = True
    """Log-prob passes run each group's common prompt (with its vision tokens) through the language model
    once, the G completions attending to that one encoding: the same log-probs and gradients as the padded
    batch, with far less compute for long (video) prompts and short answers, under activation checkpointing
    too (model.gradient_checkpointing). A token budget (micro_batch_tokens) counts the common prompt once.
    Off: every sequence whole."""
    sequence_parallel_size: int = 1
    """Sequence parallelism under torchrun (mmrl.model.sequence_parallel): blocks of this many consecutive ranks
    each spread every sample's tokens over their ranks in the log-prob passes (Ulysses: an all-to-all over the
    attention heads; the vision tower split by whole frames), data parallelism over the blocks. Must divide the
    ranks and the language model's attention heads; needs model.attn_implementation=varlen; a block rolls out
    its prompts whole on each of its ranks. 1: off."""
    fused_adamw: bool = True
    """Use torch's fused AdamW kernel where torch has one for the device."""
    dist_timeout_minutes: float = 30
    """Under torchrun: how long a collective may wait for the other ranks before the run fails (rank 0 alone
    checks the media and writes checkpoints meanwhile; a hung rank fails the run after this)."""
    health_window: int = 20
    """Steps over which the run-health warnings look (no reward signal, one answer for everything, mostly
    equal-reward groups); each warns once, on the console and in the report. 0: off."""
    report_to: list[str] | str = field(default_factory=list)
    """Experiment trackers that get every step's metrics and the logged rollouts, besides metrics.jsonl and
    rollouts.jsonl (always written): tensorboard (event files in <run>/tensorboard; pip install
    'mmrl[tensorboard]') and/or wandb (a run in <run>/wandb, offline unless an API key is set and wandb's
    server is reachable, or as WANDB_MODE says; WANDB_PROJECT names the project, default mmrl; pip install
    'mmrl[wandb]'). Empty: none."""

    def __post_init__(self) -> None:
        if self.deepspeed:
            from mmrl.config.preflight import check_version

            check_version("deepspeed", setting=f"train.deepspeed={self.deepspeed}")
        if self.offload != "none" and not self.deepspeed:
            raise ConfigError(f"train.offload={self.offload} is DeepSpeed's CPU offload: set train.deepspeed=zero2 "
                              "or zero3 too")
        # a learning rate, count or coefficient that is NaN, infinite or out of range cannot train: refused here,
        # before anything loads (an infinite learning rate made every weight NaN in the first optimizer step)
        check_ranges(self, "train")
        if not isinstance(self.adam_betas, list) or len(self.adam_betas) != 2:
            raise ConfigError(f"train.adam_betas={self.adam_betas!r}: must be two numbers, e.g. [0.9, 0.999]")
        for i, beta in enumerate(self.adam_betas):
            check_number(f"train.adam_betas[{i}]", beta, low=0, high=1, high_open=True)
        if isinstance(self.report_to, str):  # train.report_to=wandb
            self.report_to = [] if self.report_to in ("", "none") else [self.report_to]
        from mmrl.config.preflight import check_trackers

        check_trackers(self.report_to)


@dataclass
class SFTConfig:
    steps: int = 0
    """Cold-start SFT steps before RL (0: none)."""
    lr: float = 1e-4
    """Cold-start learning rate."""
    batch_size: int = 16
    """Sequences per cold-start step."""
    warmup_steps: int = 0
    """Cold-start warm-up steps."""
    lr_schedule: Literal["cosine", "constant", "linear"] = "cosine"
    """The cold start's learning rate after its warm-up, over sft.steps: cosine or linear decay to 0, or
    constant (as train.lr_schedule)."""
    target: str = "random_answer"
    """gold: train on the reference answers. reasoning: a reasoning trace, then the reference answer (the
    record's meta.rationale; the toy world's records get random-length traces of true observations; mmrl.engine.sft).
    random_answer teaches the answer format only (the answer inside the tags is drawn at random), for the toy
    demo's random-weight model: it never runs on a model given with --model / model.path. Methods register
    more (mmrl.engine.sft.register_target)."""
    mc_answer: Literal["letter", "option"] = "letter"
    """How gold and reasoning targets answer a multiple-choice question: the option letter (``B``), or the
    option's text (``green``; for a model that answers in words, such as the toy base model). The rewards
    accept both."""

    def __post_init__(self) -> None:
        check_ranges(self, "sft")


@dataclass
class EvalConfig:
    split: Literal["val", "test"] = "test"
    """The held-out split evaluated before and after RL."""
    limit: int | None = None
    """Evaluate at most this many questions (null: all)."""
    batch_size: int = 16
    """Questions per generate call."""
    max_new_tokens: int | None = None
    """Longest evaluation answer in tokens (null: rollout.max_new_tokens)."""
    before_rl: bool = True
    """Evaluate the starting model before RL."""
    after_rl: bool = True
    """Evaluate the trained model after RL."""
    min_options: int = 0
    """Above 0: the headline accuracy counts only multiple-choice questions with at least this many options
    (0: every question counts); the questions left out are named with the reason."""

    def __post_init__(self) -> None:
        check_ranges(self, "eval")


@dataclass
class RunConfig:
    task: str = "video-qa"
    """The built-in recipe (configs/<task>.yaml) under everything else."""
    out: str | None = None
    """Run folder (empty: runs/<task>-<time>)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec("accuracy"), RewardSpec("format")])
    """Reward entries {name, weight, kwargs, label}: a registered name, trl:NAME (TRL's reward functions) or an
    importable module.function; the total is the weighted sum."""
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Method plugins by registered name (samplers, curricula, callbacks) with their settings."""
    imports: list[str] = field(default_factory=list)
    """Modules or .py files to import first (they register rewards, samplers, plug-ins, shapers, ...)."""

    def __post_init__(self) -> None:
        from rewards.registry import resolve_reward

        if self.rollout.vllm.offload_optimizer is True and self.train.deepspeed:
            raise ConfigError(offload_under_deepspeed(self.train.deepspeed))

        if self.train.micro_batch_tokens == "auto":  # resolved here: config show and config.yaml hold the number
            import dataclasses

            self.train = dataclasses.replace(self.train, micro_batch_tokens=auto_micro_batch_tokens(self)[0])
        check_ranges(self.grpo, "grpo")  # GRPOConfig refuses these itself; a GRPOConfig built elsewhere too
        for i, spec in enumerate(self.rewards):
            if isinstance(spec, RewardSpec):
                check_value(f"rewards[{i}].weight", spec.weight, RANGES["rewards.weight"])
        for i, spec in enumerate(self.rewards):  # a typo fails when the config loads (config show too)
            if isinstance(spec, RewardSpec) and isinstance(spec.name, str):
                resolve_reward(spec.name, where=f"rewards[{i}]")


AUTO_TOKENS_FLOOR = 16384
"""``train.micro_batch_tokens: auto`` is at least this: verl's default token budget per GPU for the actor's
forward and backward (``ppo_max_token_len_per_gpu: 16384``, verl/trainer/config/actor/actor.yaml; its
docs/perf/perf_tuning.rst: at least 2 x (prompt + response), and larger for throughput)."""
PROMPT_TEXT_TOKENS = 1024
"""The text of a prompt (system prompt, question, chat template) that the auto budget allows beside its media."""
PIXELS_PER_VISION_TOKEN = 28 * 28
"""Qwen2.5-VL: 14-pixel patches merged 2 x 2 (Qwen3-VL's 16-pixel patches give fewer tokens: an upper bound)."""


def group_tokens(cfg: RunConfig) -> tuple[int, str]:
    """``(tokens, how)``: what a log-prob pass computes for one whole group at the run's caps, its shared prompt
    once (:func:`mmrl.engine.batch.micro_batch_rows`): the prompt at the media caps (one video or image a prompt) and
    :data:`PROMPT_TEXT_TOKENS` of text, and ``group_size x max_turns x max_new_tokens`` answer tokens."""
    media, rollout = cfg.data.media, cfg.rollout
    frames = media.nframes or media.max_frames
    video = -(-frames // 2) * (media.video_max_pixels // PIXELS_PER_VISION_TOKEN)  # 2 frames a temporal patch
    image = media.image_max_pixels // PIXELS_PER_VISION_TOKEN
    vision = max(video, image)
    answers = rollout.group_size * rollout.max_turns * rollout.max_new_tokens
    group = vision + PROMPT_TEXT_TOKENS + answers
    turns = f" x {rollout.max_turns} turns" if rollout.max_turns > 1 else ""
    return group, (f"{vision:,} vision tokens at the media caps + {PROMPT_TEXT_TOKENS:,} prompt text + "
                   f"{rollout.group_size} x {rollout.max_new_tokens}{turns} answer tokens = {group:,}")


def auto_micro_batch_tokens(cfg: RunConfig) -> tuple[int, str]:
    """``train.micro_batch_tokens: auto``: ``(budget, the rule with its numbers)``: one whole group at the run's
    caps (:func:`group_tokens`), never less than :data:`AUTO_TOKENS_FLOOR`."""
    group, how = group_tokens(cfg)
    return max(AUTO_TOKENS_FLOOR, group), f"max({AUTO_TOKENS_FLOOR}, one group: {how})"


def offload_under_deepspeed(deepspeed: str) -> str:
    """Why ``rollout.vllm.offload_optimizer=true`` is refused with ``train.deepspeed``."""
    return (f"rollout.vllm.offload_optimizer=true with train.deepspeed={deepspeed}: DeepSpeed owns the optimizer "
            "state and moves it itself; use train.offload=optimizer (DeepSpeed's CPU offload, for the whole run) "
            "instead, or leave rollout.vllm.offload_optimizer at auto (off under DeepSpeed)")


def task_names() -> list[str]:
    """The built-in recipes (``configs/*.yaml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


RECORDS = ("published", "inherited")
"""A recipe's record of its sources, not run settings (configs/README.md): ``published:`` maps each dotted key
whose value a source gives to that source; ``inherited:`` maps each key an overlay recipe deliberately takes from
the recipe it names (``task:``) to the reason. The loader leaves both out of the run configuration."""


def settings_file(path: str | Path) -> dict[str, Any]:
    """A recipe or user YAML's run settings: the file without its records (:data:`RECORDS`)."""
    return {k: v for k, v in load_yaml(path).items() if k not in RECORDS}


def is_recipe_file(path: str | Path) -> bool:
    """Whether a ``--config`` file is a recipe rather than a user's own settings: it carries a ``published:`` or
    ``inherited:`` record (a copy of ``configs/<task>.yaml``, configs/README.md). A recipe file is read as the
    recipe, under the real-model preset and everything the user sets, as ``--task`` reads its recipe."""
    return any(recipe_record(path, kind) for kind in RECORDS)


def recipe_record(path: str | Path, kind: str = "published") -> dict[str, str]:
    """A recipe file's own ``published:`` or ``inherited:`` record: dotted key -> source (or reason)."""
    record = load_yaml(path).get(kind) or {}
    if not isinstance(record, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                for k, v in record.items()):
        raise ConfigError(f"{path}: {kind}: expected a mapping of dotted keys to their source, e.g. "
                          f"rollout.max_new_tokens: \"code: data.max_response_length 8192\"")
    return record


def task_recipe(task: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The YAML recipe of a built-in task (``configs/<task>.yaml``). A recipe whose ``task:`` names another
    recipe (``configs/acre.yaml`` says ``task: video-qa``) is an overlay: it is merged over that recipe."""
    path = CONFIG_DIR / f"{task}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown task '{task}': known tasks are {', '.join(task_names()) or '(none)'}")
    data = settings_file(path)
    parent = data.get("task")
    if isinstance(parent, str) and parent != task:
        if parent in _seen:
            raise ConfigError(f"{path}: task '{parent}' leads back to itself ({' -> '.join((*_seen, task, parent))})")
        data = deep_merge(task_recipe(parent, (*_seen, task)), data)
    return data


def task_published(task: str) -> dict[str, str]:
    """The ``published:`` record of a built-in task's recipe, an overlay's (``task: OTHER``) over the one of the
    recipe it overlays for every key it does not set itself: what it inherits keeps its source."""
    path = CONFIG_DIR / f"{task}.yaml"
    if not path.is_file():
        return {}
    own, parent = recipe_record(path), settings_file(path).get("task")
    if not isinstance(parent, str) or parent == task:
        return own
    mine = settings_file(path)

    def set_here(key: str) -> bool:
        try:
            value_at(mine, key)
        except KeyError:
            return False
        return True

    return {**{k: v for k, v in task_published(parent).items() if not set_here(k)}, **own}


def _with_imports(data: dict[str, Any], base: str | Path | None = None) -> dict[str, Any]:
    """Import the ``imports:`` entries (so their registered names are valid below); store them resolved."""
    from mmrl.config.user_modules import import_all

    entries = data.get("imports") or []
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"imports: expected a list of module names or .py files, got {entries!r}")
    return {**data, "imports": import_all(entries, base)} if entries else data


def resume_run_config(saved: str | Path, overrides: list[str] | None = None,
                      extra: dict[str, Any] | None = None) -> RunConfig:
    """The configuration a run was started with (its ``config.yaml``), with new overrides on top."""
    data = load_yaml(saved)
    if extra:
        data = deep_merge(data, extra)
    data = _with_imports(apply_overrides(RunConfig, data, list(overrides or [])))
    return follow_answer_format(from_dict(RunConfig, data))


def follow_answer_format(cfg: RunConfig) -> RunConfig:
    """The ``format`` reward scores the form the prompt asks for: an entry without its own ``mode`` takes
    ``prompt.answer_format`` (``think_answer`` or ``answer``), so ``prompt.answer_format=think_answer`` never
    leaves a reward that pays for the other form. A ``mode`` set in the entry's kwargs wins."""
    for spec in cfg.rewards:
        if spec.name != "format" or "pattern" in spec.kwargs:
            continue
        mode = spec.kwargs.setdefault("mode", cfg.prompt.answer_format)
        if mode in ("answer", "think_answer") and mode != cfg.prompt.answer_format:
            import warnings

            warnings.warn(f"the format reward (mode: {mode}) pays for another form than the prompt asks for "
                          f"(prompt.answer_format={cfg.prompt.answer_format}): output in the asked form earns 0; "
                          "drop the reward's mode to follow the prompt, or use mode: think_optional",
                          UserWarning, stacklevel=2)
    return cfg


def load_run_config(
    task: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    extra: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
    recipe_file: str | Path | None = None,
) -> RunConfig:
    """Task recipe, then ``recipe_file`` (a recipe given as a file: :func:`is_recipe_file`), then ``base`` (the
    real-model preset, a model folder's training settings), then the user's YAML, then ``extra`` (from CLI
    flags), then dotted overrides.

    The ``imports:`` entries are imported before the configuration is checked (a file named in a YAML
    resolves against that YAML's folder, one given as an override against the working directory)."""
    data: dict[str, Any] = {}
    for file in (recipe_file, config_file):
        if file:
            task = task or settings_file(file).get("task")
    task = task or "video-qa"
    data = deep_merge(task_recipe(task), data)
    if recipe_file:
        data = deep_merge(data, _with_imports(settings_file(recipe_file), Path(recipe_file).resolve().parent))
    if base:
        data = deep_merge(data, base)
    if config_file:
        user = _with_imports(settings_file(config_file), Path(config_file).resolve().parent)
        data = deep_merge(data, user)
    data["task"] = task
    if extra:
        data = deep_merge(data, extra)
    data = _with_imports(apply_overrides(RunConfig, data, list(overrides or [])))
    return follow_answer_format(from_dict(RunConfig, data))


def value_at(obj: Any, key: str) -> Any:
    """The value at dotted ``key`` (``train.lr``, ``rewards[1].kwargs.values.consistent_correct``) of a run
    config or a plain mapping: attributes, mapping keys and ``[i]`` list entries. A :class:`KeyError` naming the
    key when there is none."""
    import re

    for part in key.split("."):
        name, *indices = re.findall(r"[^\[\]]+", part)
        try:
            obj = obj[name] if isinstance(obj, dict) else getattr(obj, name)
            for i in indices:
                obj = obj[int(i)]
        except (KeyError, AttributeError, IndexError, TypeError, ValueError):
            raise KeyError(f"no setting {key}") from None
    return obj
