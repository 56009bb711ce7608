"""Video-R1's regression and numerical scoring (issue 48).

The expected values are written here from Video-R1's released reward (tulerfeng/Video-R1,
src/r1-v/src/open_r1/grpo.py, ``accuracy_reward``), not from mmrl's scorer:

* regression: ``rel = (|pred - gt| + 1e-9) / (|gt| + 1e-9)``, clipped to [0, 1], reward ``1 - rel``; 0 when a
  number does not parse (``float`` of the text without commas);
* numerical: 0 when exactly one of gt / pred contains ``.`` or ``,``; else 1 when ``round(gt, 2) ==
  round(pred, 2)``; 0 when a number does not parse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipelines.loaders import load_samples
from mmrl.config import load_run_config
from mmrl.config.prompt_templates import instruction
from mmrl.engine.evaluate import reward_columns
from mmrl_common.errors import ConfigError
from rewards.accuracy import SCORED_AS
from rewards.registry import CombinedReward, get_reward

EPS = 1e-9  # grpo.py's regression epsilon


def video_r1_regression(pred: float, gt: float) -> float:
    rel = (abs(pred - gt) + EPS) / (abs(gt) + EPS)
    return 1.0 - min(1.0, max(0.0, rel))


def acc(outputs: list[str], ptype: str, gold: str, **kwargs) -> list[float | None]:
    n = len(outputs)
    return get_reward("accuracy")(outputs, problem_type=[ptype] * n, answer=[gold] * n, options=[None] * n,
                                  meta=[{}] * n, id=[f"s{i}" for i in range(n)], **kwargs)


RECORDS = [
    {"problem_id": 1, "problem": "How far did the ball roll, in metres?", "data_type": "video",
     "problem_type": "regression", "options": [], "process": "<think>..</think>",
     "solution": "<answer>2.75</answer>", "path": "./videos/1.mp4", "data_source": "X"},
    {"problem_id": 2, "problem": "How many cars?", "data_type": "image", "problem_type": "numerical",
     "options": [], "solution": "<answer>4</answer>", "path": "./images/2.jpg", "data_source": "CLEVR"},
]


def columns(samples) -> dict:
    """The reward columns the trainer passes (t-grpo's length bonus also reads the completions' token ids)."""
    return {**reward_columns(samples), "completion_ids": [[0] * 8 for _ in samples]}


def write_video_r1(tmp_path: Path) -> Path:
    path = tmp_path / "video_r1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


# ---------------------------------------------------------------------------------------------- regression


def test_regression_scores_by_relative_error() -> None:
    outs = ["<answer>2.5</answer>", "<answer>3.3</answer>", "<answer>2.75</answer>", "<answer>9</answer>"]
    got = acc(outs, "regression", "2.75")
    want = [video_r1_regression(p, 2.75) for p in (2.5, 3.3, 2.75, 9.0)]
    assert got == pytest.approx(want, abs=1e-12)
    assert 0.0 < got[0] < 1.0 and got[3] == 0.0  # partial credit, clipped at 0


def test_regression_without_a_number_scores_zero() -> None:
    assert acc(["<answer>far</answer>", "<answer></answer>"], "regression", "2.75") == [0.0, 0.0]


def test_regression_uses_video_r1_s_epsilons_when_gold_is_zero() -> None:
    # (|0 - 0| + 1e-9) / (|0| + 1e-9) = 1: Video-R1 gives even the exact answer 0 when the gold is 0
    assert acc(["<answer>0</answer>", "<answer>0.5</answer>"], "regression", "0") == [0.0, 0.0]


def test_video_r1_regression_record_imports_as_regression_and_scores_partially(tmp_path: Path) -> None:
    res = load_samples(write_video_r1(tmp_path))
    reg, num = res.samples
    assert reg.problem_type == "regression" and reg.answer == "2.75"
    assert num.problem_type == "numeric"
    reward = CombinedReward(load_run_config("t-grpo").rewards)  # the recipe's rewards, as `mmrl train` builds them
    out = "<think>about 2.5 m</think><answer>2.5</answer>"
    breakdown = reward.compute([out, out], columns([reg, num]))
    assert breakdown.components["accuracy"][0] == pytest.approx(video_r1_regression(2.5, 2.75), abs=1e-12)
    assert breakdown.components["accuracy"][1] == 0.0  # numerical 2.5 vs 4


def test_regression_is_described_and_asks_for_a_number() -> None:
    assert "relative error" in SCORED_AS["regression"]
    assert "a number" in instruction("regression", "think_answer")


# ---------------------------------------------------------------------------------------- numerical rule

VR1 = {"numeric_scoring": "video-r1"}


def test_video_r1_numerical_rule_decimal_marks_must_agree() -> None:
    outs = ["<answer>4</answer>", "<answer>4.0</answer>", "<answer>4 cars</answer>"]
    assert acc(outs, "numeric", "4", **VR1) == [1.0, 0.0, 0.0]  # "4.0": only the prediction has a "."
    assert acc(["<answer>1,000</answer>", "<answer>1000</answer>"], "numeric", "1,000", **VR1) == [1.0, 0.0]
    assert acc(outs, "numeric", "4") == [1.0, 1.0, 1.0]  # mmrl's default tolerance reads them all as 4


def test_video_r1_numerical_rule_rounds_to_two_decimals() -> None:
    outs = ["<answer>3.141</answer>", "<answer>3.15</answer>", "<answer>3.1</answer>"]
    assert acc(outs, "numeric", "3.14", **VR1) == [1.0, 0.0, 0.0]
    assert acc(outs[:1], "numeric", "3.14") == [0.0]  # the default needs the number itself


def test_video_r1_regression_reads_numbers_as_its_code_does() -> None:
    assert acc(["<answer>2.5 m</answer>"], "regression", "2.75", **VR1) == [0.0]  # float("2.5 m") fails
    assert acc(["<answer>2.5 m</answer>"], "regression", "2.75")[0] == pytest.approx(video_r1_regression(2.5, 2.75))


@pytest.mark.parametrize("ptype, gold", [("numeric", "4"), ("regression", "2.75")])
def test_unknown_numeric_scoring_names_the_setting(ptype: str, gold: str) -> None:
    with pytest.raises(ConfigError, match=r"numeric_scoring.*video-r1"):
        acc(["<answer>4</answer>"], ptype, gold, numeric_scoring="videor1")


def test_t_grpo_rewards_with_video_r1_numbers_score_an_imported_file(tmp_path: Path) -> None:
    reg, num = load_samples(write_video_r1(tmp_path)).samples
    user = tmp_path / "run.yaml"  # `mmrl train --task t-grpo --config run.yaml`
    user.write_text("rewards:\n  - {name: accuracy, kwargs: {strict_tags: true, numeric_scoring: video-r1}}\n")
    cfg = load_run_config("t-grpo", config_file=user)
    reward = CombinedReward(cfg.rewards)
    outs = ["<think>..</think><answer>2.5</answer>", "<think>..</think><answer>4.0</answer>",
            "<think>..</think><answer>4</answer>"]
    got = reward.compute(outs, columns([reg, num, num])).components["accuracy"]
    assert got == pytest.approx([video_r1_regression(2.5, 2.75), 0.0, 1.0], abs=1e-12)
