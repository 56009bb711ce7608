"""Answers in \\boxed{} (ARES's math.jinja prompt, template ``ares-math``) and math-style numbers (issues 48, 50).

The format rule is written here from ARES's / EasyR1's math reward (shawn0728/ARES and hiyouga/EasyR1,
examples/reward_function/math.py): ``re.fullmatch(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", response, re.DOTALL)``
after ``compute_score`` removes the whitespace around ``<``, ``>`` and ``/``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipelines.loaders import load_samples
from mmrl.config import load_run_config
from mmrl.engine.evaluate import reward_columns
from mmrl_common.errors import ConfigError
from rewards.answers import last_boxed
from rewards.format import check_format
from rewards.registry import CombinedReward, get_reward


def acc(outputs: list[str], ptype: str, gold, options=None, **kwargs) -> list[float | None]:
    n = len(outputs)
    return get_reward("accuracy")(outputs, problem_type=[ptype] * n, answer=[gold] * n, options=[options] * n,
                                  meta=[{}] * n, id=[f"s{i}" for i in range(n)], **kwargs)


BOXED = {"answer_from": "boxed"}

# ------------------------------------------------------------------------------------------ \boxed{} answers


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # balanced braces
        (r"first \boxed{1}, then \boxed{2}.", "2"),  # the last box
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not the box's own
        (r"\boxed{3} and a cut-off \boxed{\frac{1", "3"),  # an unclosed box does not count
        ("<answer>7</answer>", ""),
        ("", ""),
    ],
)
def test_last_boxed(text: str, expected: str) -> None:
    assert last_boxed(text) == expected


def test_accuracy_reads_the_last_box() -> None:
    outs = [r"<think>2+2</think> The answer is \boxed{4}.",
            r"<think>hmm</think> \boxed{5} no wait, \boxed{4}",
            "<think>hmm</think><answer>4</answer>",  # no box: nothing to score
            r"<think>hmm</think> \boxed{5}"]
    assert acc(outs, "numeric", "4", **BOXED) == [1.0, 1.0, 0.0, 0.0]
    assert acc(outs[2:3], "numeric", "4") == [1.0]  # the default reads the answer tags
    assert acc([r"<think>.</think> \boxed{B}"], "multiple_choice", "B", ["cat", "dog"], **BOXED) == [1.0]


def test_unknown_answer_from_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"answer_from.*boxed"):
        acc([r"\boxed{4}"], "numeric", "4", answer_from="box")


# -------------------------------------------------------------------------------------------- think_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"<think>2+2=4</think> So the answer is \boxed{4}.", True),
        ("<think>a\nb</think>\n\\boxed{\\frac{1}{2}}", True),
        (r"< think >x< / think > \boxed{4}", True),  # spaces around < > / are removed first (compute_score)
        (r"<think>x</think> the answer is 4", False),  # no box
        (r"\boxed{4}", False),  # no think block
        (r"The answer: <think>x</think> \boxed{4}", False),  # must start with <think>
        ("<think>x</think><answer>4</answer>", False),
    ],
)
def test_think_boxed_format(text: str, expected: bool) -> None:
    assert check_format(text, mode="think_boxed") is expected
    n = 1
    assert get_reward("format")([text] * n, mode="think_boxed") == [float(expected)]


def test_unknown_format_mode_lists_think_boxed() -> None:
    with pytest.raises(ValueError, match="think_boxed"):
        check_format("x", mode="boxed")


def test_ares_math_prompt_with_boxed_rewards_scores_an_imported_file(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"id": "m1", "problem_type": "numeric", "question": "What is 6 times 7?",
                                "answer": "42"}) + "\n")
    (sample,) = load_samples(path).samples
    cfg = load_run_config("ares", overrides=[
        "prompt.template=ares-math",
        "rewards=[{name: accuracy, kwargs: {answer_from: boxed}}, {name: format, kwargs: {mode: think_boxed}}]"])
    reward = CombinedReward(cfg.rewards)
    outs = [r"<think>6*7</think> The answer is \boxed{42}.", "<think>6*7</think><answer>42</answer>",
            r"<think>6*7</think> \boxed{41}"]
    got = reward.compute(outs, reward_columns([sample] * 3)).components
    assert got["accuracy"] == [1.0, 0.0, 0.0]
    assert got["format"] == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------------------ LaTeX numbers (math-verify)


def test_latex_numbers_score_through_the_accuracy_reward() -> None:
    outs = [r"<answer>\frac{1}{2}</answer>", r"<answer>\sqrt{2}</answer>", "<answer>0.5</answer>"]
    assert acc(outs, "numeric", "0.5") == [1.0, 0.0, 1.0]
    assert acc(outs[1:2], "numeric", "1.4142135623730951") == [1.0]  # not 2.0


def test_a_latex_gold_loads_and_a_boxed_fraction_scores(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"id": "m2", "problem_type": "numeric", "question": "Half of one?",
                                "answer": r"\frac{1}{2}"}) + "\n")
    (sample,) = load_samples(path).samples  # the gold passes the numeric answer check
    cfg = load_run_config("ares", overrides=["rewards=[{name: accuracy, kwargs: {answer_from: boxed}}]"])
    outs = [r"<think>1/2</think> \boxed{\frac{1}{2}}", r"<think>.</think> \boxed{0.5}", r"<think>.</think> \boxed{2}"]
    got = CombinedReward(cfg.rewards).compute(outs, reward_columns([sample] * 3)).components["accuracy"]
    assert got == [1.0, 1.0, 0.0]
