"""A cold start writes the answer where the run's prompt template asks for it and its reward reads it: inside
``<answer></answer>`` for mmrl's and Video-R1's templates, in ``\\boxed{}`` for ARES's ``ares-math`` (math.jinja),
whose recipe scores the last ``\\boxed{}`` (``answer_from: boxed``) and the ``think_boxed`` format. A cold start
that taught ``<answer>`` tags under ``ares-math`` left every answer unscored (issue 48)."""

from __future__ import annotations

import random

import pytest

import rewards  # noqa: F401 (registers the built-in rewards)
from data_pipelines.schema import Sample
from mmrl.config import load_run_config
from mmrl.engine.sft import SFT_TARGETS, TargetContext


def _sample() -> Sample:
    return Sample(id="mine-1", problem_type="multiple_choice", question="Which cup?", answer="B",
                  options=["left", "right"], meta={"rationale": "The cup is on the right."})


def _rewards(cfg, text: str, sample: Sample) -> dict[str, float]:
    from rewards.registry import get_reward

    row = {"answer": [sample.answer], "options": [sample.options], "problem_type": [sample.problem_type],
           "meta": [sample.meta], "id": [sample.id]}
    out = {}
    for spec in cfg.rewards:
        if spec.name in ("accuracy", "format"):
            out[spec.name] = get_reward(spec.name)([text], **row, **(spec.kwargs or {}))[0]
    return out


@pytest.mark.parametrize("target", ["gold", "reasoning", "random_answer"])
def test_the_ares_recipes_cold_start_is_scored_by_its_own_rewards(target: str) -> None:
    cfg = load_run_config("ares", overrides=[f"sft.target={target}", "sft.mc_answer=letter"])
    assert cfg.prompt.template == "ares-math"
    text = SFT_TARGETS.get(target)(_sample(), TargetContext(cfg, [_sample()], random.Random(0)))
    assert "<answer>" not in text and text.rstrip().endswith("\\boxed{B}"), text
    scores = _rewards(cfg, text, _sample())
    assert scores["format"] == 1.0, text
    if target != "random_answer":
        assert scores["accuracy"] == 1.0, text


def test_mmrls_own_template_keeps_answer_tags() -> None:
    cfg = load_run_config("video-qa", overrides=["sft.target=reasoning", "sft.mc_answer=letter"])
    text = SFT_TARGETS.get("reasoning")(_sample(), TargetContext(cfg, [_sample()], random.Random(0)))
    assert text == "<think>The cup is on the right.</think><answer>B</answer>"
