"""The run configuration of ``mmrl train``, ``mmrl sft`` and ``mmrl eval``.

A task recipe (``configs/<task>.yaml``) fills these dataclasses; a user YAML (``--config``) and dotted
overrides (``train.lr=1e-5``) are merged on top. See :mod:`mmrl.config_io` for the checking rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmrl.config_io import apply_overrides, deep_merge, from_dict, load_yaml
from mmrl.grpo.config import GRPOConfig
from mmrl_common.errors import ConfigError
from rewards.registry import RewardSpec

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class ModelConfig:
    path: str | None = None
    """A Hugging Face model folder (any Qwen2-VL / Qwen2.5-VL / Qwen3-VL). Empty: a tiny model built by mmrl."""
    tiny_family: Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"] = "qwen2_5_vl"
    tiny_seed: int = 0
    tiny_size: dict[str, int] = field(default_factory=dict)
    dtype: Literal["fp32", "bf16"] = "fp32"
    device: str = "auto"
    """`auto` (the first GPU if there is one, else the CPU), `cpu`, `cuda`, `cuda:1`, ..."""
    freeze_vision: bool = False
    freeze_merger: bool = False
    freeze_llm: bool = False
    share_vision_features: bool = True
    """Run the vision tower once per unique media item per forward pass and share it across the group."""
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"


@dataclass
class MediaConfig:
    video_policy: str = "qwen"
    fps: float = 2.0
    nframes: int | None = None
    min_frames: int = 4
    max_frames: int = 16
    video_min_pixels: int = 16 * 28 * 28
    video_max_pixels: int = 64 * 28 * 28
    image_min_pixels: int = 16 * 28 * 28
    image_max_pixels: int = 256 * 28 * 28
    cache_mb: float = 1024
    """Decoded media kept in memory between steps (LRU, megabytes of pixels; 0: no cache)."""


@dataclass
class DataConfig:
    train: str | None = None
    """Training file (JSONL/JSON/Parquet/datasets folder). Empty: the toy world's train split."""
    val: str | None = None
    test: str | None = None
    format: str = "auto"
    columns: dict[str, str] = field(default_factory=dict)
    media_root: str | None = None
    on_bad_sample: Literal["raise", "skip"] = "raise"
    toy_seed: int = 0
    toy_tasks: list[str] = field(default_factory=list)
    """With the toy world: generate only these tasks (empty: all)."""
    toy_size: dict[str, int] = field(default_factory=dict)
    """With the toy world: records per task and split, e.g. {train: 48, val: 10, test: 10} (empty: default)."""
    problem_types: list[str] = field(default_factory=list)
    """Keep only these problem types (empty: all)."""
    sampler: str = "uniform"
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)
    media: MediaConfig = field(default_factory=MediaConfig)


@dataclass
class PromptConfig:
    template: str = "default"
    """Name of a registered prompt template, or a format string with {question} and {options}."""
    system: str | None = None
    answer_format: Literal["think_answer", "answer"] = "think_answer"

    def __post_init__(self) -> None:
        from mmrl.prompts import resolve_template

        resolve_template(self.template)  # a typo of a template name fails when the config loads


@dataclass
class RolloutConfig:
    backend: str = "hf"
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    environment: str | None = None
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 1
    record_logprobs: bool = False
    """Keep the sampling log-probabilities of every rollout token in the batch (``rollout_logprobs``)."""
    record_entropies: bool = False
    """Keep the per-token entropies of every rollout in the batch (``entropies``; rewards see them)."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError(f"rollout.group_size={self.group_size}: GRPO compares the rollouts of a prompt "
                              "with each other, so one rollout per prompt has advantage 0 and never learns; "
                              "use 2 or more (8 is usual)")
        if self.temperature <= 0:
            raise ConfigError(f"rollout.temperature={self.temperature}: training rollouts must be sampled "
                              "(every rollout of a group would be the same greedy answer); use e.g. 1.0")
        if self.max_turns < 1:
            raise ConfigError(f"rollout.max_turns={self.max_turns}: must be >= 1")


@dataclass
class TrainConfig:
    steps: int = 100
    prompts_per_step: int = 8
    micro_batch_size: int = 16
    """Sequences per forward/backward pass; gradients accumulate over the step's micro-batches."""
    lr: float = 1e-6
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_every: int = 0
    save_every: int = 50
    keep_checkpoints: int = 2
    log_rollouts: int = 4
    log_every: int = 10
    """Print a one-line summary every this many steps (0: never)."""
    """Completions per step written to rollouts.jsonl."""


@dataclass
class SFTConfig:
    steps: int = 0
    """Cold-start SFT steps before RL (0: none)."""
    lr: float = 1e-4
    batch_size: int = 16
    warmup_steps: int = 0
    target: Literal["gold", "random_answer"] = "random_answer"
    """`random_answer` teaches the answer format only: the answer inside the tags is drawn at random."""


@dataclass
class EvalConfig:
    split: Literal["val", "test"] = "test"
    limit: int | None = None
    batch_size: int = 16
    max_new_tokens: int | None = None
    before_rl: bool = True
    after_rl: bool = True
    min_options: int = 0
    """Count only multiple-choice questions with at least this many options in the headline accuracy."""


@dataclass
class RunConfig:
    task: str = "video-qa"
    out: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec("accuracy"), RewardSpec("format")])
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Method plugins by registered name (samplers, curricula, callbacks) with their settings."""
    imports: list[str] = field(default_factory=list)
    """Modules or .py files to import first (they register rewards, samplers, plug-ins, shapers, ...)."""


def task_recipe(task: str) -> dict[str, Any]:
    """The YAML recipe of a built-in task (``configs/<task>.yaml``)."""
    path = CONFIG_DIR / f"{task}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown task '{task}': known tasks are {', '.join(known) or '(none)'}")
    return load_yaml(path)


def _with_imports(data: dict[str, Any], base: str | Path | None = None) -> dict[str, Any]:
    """Import the ``imports:`` entries (so their registered names are valid below); store them resolved."""
    from mmrl.imports import import_all

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
    return from_dict(RunConfig, data)


def load_run_config(
    task: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> RunConfig:
    """Task recipe, then the user's YAML, then ``extra`` (from CLI flags), then dotted overrides.

    The ``imports:`` entries are imported before the configuration is checked (a file named in a YAML
    resolves against that YAML's folder, one given as an override against the working directory)."""
    data: dict[str, Any] = {}
    if config_file:
        user = load_yaml(config_file)
        task = task or user.get("task")
    task = task or "video-qa"
    data = deep_merge(task_recipe(task), data)
    if config_file:
        user = _with_imports(load_yaml(config_file), Path(config_file).resolve().parent)
        data = deep_merge(data, user)
    data["task"] = task
    if extra:
        data = deep_merge(data, extra)
    data = _with_imports(apply_overrides(RunConfig, data, list(overrides or [])))
    return from_dict(RunConfig, data)
