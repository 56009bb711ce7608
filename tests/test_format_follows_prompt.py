"""The format reward scores the form the prompt asks for (issue: prompt.answer_format=think_answer with the
recipe's format reward left at {mode: answer} scored correct output 0)."""

import warnings

import pytest

from mmrl.config import load_run_config
from rewards import get_reward


def _format_scores(cfg, texts):
    spec = next(s for s in cfg.rewards if s.name == "format")
    return get_reward("format")(texts, **spec.kwargs)


@pytest.mark.parametrize("task", ["video-qa", "image-qa"])
def test_the_format_reward_follows_the_prompts_answer_format(task) -> None:
    think = "<think>the ball moves left</think><answer>B</answer>"
    bare = "<answer>B</answer>"
    asked = load_run_config(task, overrides=["prompt.answer_format=think_answer"])
    scores = _format_scores(asked, [think, bare])
    assert scores[0] > scores[1]  # the asked form earns more than the other one
    plain = load_run_config(task, overrides=["prompt.answer_format=answer"])
    scores = _format_scores(plain, [think, bare])
    assert scores[1] > scores[0]


def test_an_explicit_mode_wins_and_a_contradiction_is_said() -> None:
    with pytest.warns(UserWarning, match="pays for another form than the prompt asks for"):
        cfg = load_run_config("video-qa", overrides=[
            "prompt.answer_format=think_answer", "rewards=[{name: accuracy}, {name: format, kwargs: {mode: answer}}]"])
    assert next(s for s in cfg.rewards if s.name == "format").kwargs["mode"] == "answer"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_run_config("video-qa", overrides=[
            "prompt.answer_format=think_answer",
            "rewards=[{name: accuracy}, {name: format, kwargs: {mode: think_optional}}]"])
    assert next(s for s in cfg.rewards if s.name == "format").kwargs["mode"] == "think_optional"
