"""The temporal-grounding recipe prompts as Temporal-R1's released TVG code (issue 48).

appletea233/Temporal-R1: examples/run_qwen2_5_vl_3b_tvg.sh sets SYSTEM_PROMPT (below, as bash makes it: the
triple quotes are empty strings around one double-quoted string with a line break) and passes it as
``data.system_prompt="${SYSTEM_PROMPT}"``; verl/trainer/main.py reads the command line with
``OmegaConf.from_cli``, which parses each value with ``yaml.load``, folding the line break and the next line's
leading space into one space. verl/utils/dataset_video.py builds ``[{"role": "system", "content": system_prompt},
{"role": "user", "content": [{"type": "video", ...}, {"type": "text", "text": problem}]}]``: the record's problem
text alone after the video, no instruction added. The expected messages here are built from those lines, not from
mmrl's template, and rendered with the model's own chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_runs import as_7b, module_cache, own_model  # noqa: F401 (module_cache: a fixture)
from transformers import AutoProcessor

from data_pipelines.schema import MediaItem, Sample
from mmrl import cli
from mmrl.cli.compare import load_spec
from mmrl.config import CONFIG_DIR, load_run_config
from mmrl.engine.prompts import build_messages, user_text
from mmrl.toy.tiny_models import ensure_tiny

SCRIPT_VALUE = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
                "answer.\n The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                "MUST BE put in <answer> </answer> tags. Output the final answer in JSON format.")
SYSTEM = yaml.safe_load(SCRIPT_VALUE)  # OmegaConf.from_cli's yaml.load of the command-line value
PROBLEM = ('To accurately pinpoint the event "a person opens the door" in the video, determine the precise time '
           "period of the event.")
GROUNDING = Sample("g", "temporal_grounding", PROBLEM, [2.0, 4.5], None, [MediaItem("video", "clip.mp4")])


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, module_cache: None) -> Path:  # noqa: F811
    return as_7b(own_model(tmp_path_factory.mktemp("big") / "model"))


def _trained(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The config ``mmrl train ARGV`` hands to its run (the run itself not started)."""
    import mmrl.run

    seen: list[Any] = []
    monkeypatch.setattr(mmrl.run, "train", lambda cfg, **_: seen.append(cfg) or {})
    assert cli.main(["train", *argv]) == 0
    (cfg,) = seen
    return cfg


def test_the_folded_system_prompt() -> None:
    assert SYSTEM == ("You FIRST think about the reasoning process as an internal monologue and then provide the "
                      "final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final "
                      "answer MUST BE put in <answer> </answer> tags. Output the final answer in JSON format.")


def test_temporal_grounding_with_a_model_prompts_as_the_released_code(big: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _trained(["--task", "temporal-grounding", "--model", str(big), "--out", str(tmp_path / "run")], monkeypatch)
    assert cfg.model.dtype == "bf16"  # the real-model preset applied and left the prompt as published
    ours = build_messages(GROUNDING, cfg.prompt, ["video"])
    code = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": PROBLEM}]}]
    processor = AutoProcessor.from_pretrained(ensure_tiny("qwen2_5_vl"))  # the folder's chat template (its
    # config.json here has 7B sizes the model class refuses)
    rendered = processor.apply_chat_template(ours, tokenize=False, add_generation_prompt=True)
    assert rendered == processor.apply_chat_template(code, tokenize=False, add_generation_prompt=True)
    assert "Think briefly" not in rendered and rendered.count("JSON format") == 1


def test_the_recipe_without_a_model_prompts_alike() -> None:
    cfg = load_run_config("temporal-grounding")
    assert cfg.prompt.system == SYSTEM
    assert user_text(GROUNDING, cfg.prompt) == PROBLEM


def test_the_toy_compare_arms_keep_the_prompt_they_were_measured_with() -> None:
    """configs/compare/select-variance.yaml's measurements used mmrl's default template and no system prompt."""
    spec = load_spec(CONFIG_DIR / "compare" / "select-variance.yaml")
    for arm in spec.arms.values():
        cfg = load_run_config(arm.task, arm.config, [*arm.all_overrides, "train.seed=0"])
        assert cfg.prompt.system in (None, "") and cfg.prompt.template == "default", arm.name
        assert user_text(GROUNDING, cfg.prompt) == (
            f"{PROBLEM}\nReply with the time span as [start, end] in seconds inside <answer></answer>.")
