"""A run's settings and nothing else: the schema of ``config.yaml`` (:mod:`~mmrl.config.schema`), reading,
merging and printing it (:mod:`~mmrl.config.io`), the names a setting may take (prompt templates, rollout
backends), the toy model's recipe (:mod:`~mmrl.config.toy`), the tested versions of the packages a setting
needs (:mod:`~mmrl.config.preflight`) and the user's own modules a config imports
(:mod:`~mmrl.config.user_modules`).

Importing it starts no torch: ``mmrl --help``, ``mmrl config show`` and ``mmrl data validate`` read settings
without a tensor. It sits above the model's names and the GRPO settings (:mod:`mmrl.grpo.config`) and below
everything that runs. The schema's names are read from here: ``from mmrl.config import RunConfig``.
"""

from __future__ import annotations

from mmrl.config.schema import (
    AUTO_TOKENS_FLOOR,
    CONFIG_DIR,
    LORA_TARGETS,
    PIXELS_PER_VISION_TOKEN,
    PROMPT_TEXT_TOKENS,
    RANGES,
    RECORDS,
    SEED_MAX,
    DataConfig,
    EvalConfig,
    LoraSettings,
    MediaConfig,
    ModelConfig,
    PromptConfig,
    Range,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TrainConfig,
    VLLMConfig,
    auto_micro_batch_tokens,
    check_ranges,
    check_value,
    follow_answer_format,
    group_tokens,
    is_recipe_file,
    load_run_config,
    offload_under_deepspeed,
    recipe_record,
    resume_run_config,
    settings_file,
    task_names,
    task_published,
    task_recipe,
    value_at,
)

__all__ = [
    "AUTO_TOKENS_FLOOR", "CONFIG_DIR", "LORA_TARGETS", "PIXELS_PER_VISION_TOKEN", "PROMPT_TEXT_TOKENS", "RANGES",
    "RECORDS", "SEED_MAX", "DataConfig", "EvalConfig", "LoraSettings", "MediaConfig", "ModelConfig", "PromptConfig",
    "Range", "RolloutConfig", "RunConfig", "SFTConfig", "TrainConfig", "VLLMConfig", "auto_micro_batch_tokens",
    "check_ranges", "check_value", "follow_answer_format", "group_tokens", "is_recipe_file", "load_run_config",
    "offload_under_deepspeed", "recipe_record", "resume_run_config", "settings_file", "task_names",
    "task_published", "task_recipe", "value_at",
]
