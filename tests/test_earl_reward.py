"""EARL's evidence rewards by hand: the gated correctness table, the action and relevance terms, the step and
linear schedules, gold from spans / grid frames / video frames, round-2 selections mapped through time, and
the components logged separately through the reward combiner."""

from __future__ import annotations

import pytest

from mmrl.engine.evaluate import RewardState
from mmrl_common.errors import ConfigError, DataError
from rewards import CombinedReward
from rewards.evidence import evidence_action, evidence_correct, evidence_relevance, weight

GRID = [0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0]  # 8 initial frames; frame k's cell is [4k - 2, 4k + 2] s
SPAN = {"gold_span": [8.5, 9.5]}  # inside frame 3's cell (0-based 2)
RIGHT, WRONG = "<answer>A</answer>", "<answer>B</answer>"


def info(*rounds: list[float]) -> dict:
    """env_info of an episode whose k-th selection picked frames at these timestamps."""
    return {"initial_timestamps": GRID, "rounds": len(rounds), "frames_shown": 8 + 16 * len(rounds),
            "invalid_actions": 0, "extra_calls": 0,
            "selections": [{"round": r + 1, "indices": [], "timestamps": ts} for r, ts in enumerate(rounds)]}


def columns(infos: list[dict], meta: dict | None = None, step: int = 20, **extra) -> dict:
    n = len(infos)
    return {"problem_type": ["multiple_choice"] * n, "answer": ["A"] * n, "options": [["r", "g", "b", "y"]] * n,
            "meta": [dict(meta if meta is not None else SPAN)] * n, "env_info": infos,
            "trainer_state": RewardState(step, 100, "default"), **extra}


def test_gated_correctness_table() -> None:
    infos = [info([8.0]), info([8.0, 12.0]), info([8.0, 12.0, 16.0]), info([8.0]), info()]
    texts = [RIGHT, RIGHT, RIGHT, WRONG, RIGHT]
    # IoU: {2} vs {2} = 1; {2,3} = 1/2 (meets the 0.5 gate); {2,3,4} = 1/3 (below); wrong; no selection = 0
    assert evidence_correct(texts, **columns(infos)) == [1.0, 1.0, 0.5, -1.0, 0.5]
    table = {"correct_reward": 2.0, "partial_reward": 0.25, "wrong_reward": -0.5, "iou_threshold": 0.6}
    assert evidence_correct(texts, **columns(infos), **table) == [2.0, 0.25, 0.25, -0.5, 0.25]


def test_action_and_relevance_terms_follow_the_schedule() -> None:
    infos = [info([8.0]), info([8.0, 12.0]), info()]
    early, late = columns(infos, step=20), columns(infos, step=50)  # progress 0.2 <= P = 0.3 < 0.5
    assert evidence_action([RIGHT] * 3, **early) == [0.2, 0.2, 0.0]
    assert evidence_action([RIGHT] * 3, **late) == [0.05, 0.05, 0.0]
    assert evidence_relevance([WRONG] * 3, **early) == pytest.approx([0.2, 0.1, 0.0])
    assert evidence_relevance([WRONG] * 3, **late) == pytest.approx([0.5, 0.25, 0.0])
    # linear: from the early value at progress 0 to the late one at P; progress 0.15 is half-way
    assert evidence_action([RIGHT], **columns(infos[:1], step=15, schedule="linear")) == [pytest.approx(0.125)]
    assert weight(0.15, 0.2, 0.5, 0.3, "linear") == pytest.approx(0.35)
    assert weight(0.3, 0.2, 0.5, 0.3, "step") == 0.2 and weight(0.31, 0.2, 0.5, 0.3, "step") == 0.5
    no_state = {k: v for k, v in columns(infos[:1]).items() if k != "trainer_state"}
    assert evidence_action([RIGHT], **no_state) == [0.05]  # outside training: progress 1, the late weights


def test_round_two_selections_map_to_the_nearest_initial_frame() -> None:
    # round 1 picks frame 3 (8 s); round 2 picks a re-sampled frame at 9 s (nearest initial frame: 8 s) or
    # at 10.5 s (nearest: 12 s, so the union is {2, 3} and IoU 1/2)
    infos = [info([8.0], [9.0]), info([8.0], [10.5]), info([4.0], [9.0])]
    assert evidence_relevance([RIGHT] * 3, **columns(infos, step=50)) == pytest.approx([0.5, 0.25, 0.25])


def test_gold_from_grid_frames_video_frames_and_none() -> None:
    grid = {"gold_frames": [2, 3]}
    assert evidence_relevance([RIGHT], **columns([info([8.0])], grid, step=50)) == [0.25]
    video = {"gold_frames": [36, 37], "video": {"fps": 4.0}}  # 9.0-9.25 s: initial frame 2
    assert evidence_relevance([RIGHT], **columns([info([8.0])], video, step=50, gold_frames_on="video")) == [0.5]
    both = {"gold_frames": [5], "gold_span": [8.5, 9.5]}  # spans win with gold: auto; frames with gold: frames
    assert evidence_relevance([RIGHT], **columns([info([8.0])], both, step=50)) == [0.5]
    assert evidence_relevance([RIGHT], **columns([info([8.0])], both, step=50, gold="frames")) == [0.0]
    # no gold: relevance does not apply and correctness is not gated
    assert evidence_relevance([RIGHT], **columns([info()], {}, step=50)) == [None]
    assert evidence_correct([RIGHT], **columns([info()], {}, step=50)) == [1.0]
    with pytest.raises(DataError, match="outside the 8 initial frames"):
        evidence_relevance([RIGHT], **columns([info([8.0])], {"gold_frames": [8]}))
    with pytest.raises(ConfigError, match="schedule"):
        evidence_action([RIGHT], **columns([info()], schedule="cosine"))


def test_components_are_logged_separately() -> None:
    anchor = {"alpha_early": 0.2, "beta_early": 0.2}
    combined = CombinedReward([{"name": "evidence_correct", "kwargs": anchor},
                               {"name": "evidence_action", "kwargs": anchor},
                               {"name": "evidence_relevance", "kwargs": anchor}])
    metrics: dict[str, float] = {}
    infos = [info([8.0]), info([8.0, 12.0, 16.0]), info()]
    cols = columns(infos, log_metric=metrics.__setitem__)
    result = combined.compute([RIGHT, RIGHT, WRONG], cols)
    assert result.components["evidence_correct"] == [1.0, 0.5, -1.0]
    assert result.components["evidence_action"] == [0.2, 0.2, 0.0]
    assert result.components["evidence_relevance"] == pytest.approx([0.2, 0.2 / 3, 0.0])
    assert result.total == pytest.approx([1.4, 0.5 + 0.2 + 0.2 / 3, -1.0])
    assert metrics["evidence/iou"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert metrics["evidence/iou_selected"] == pytest.approx((1 + 1 / 3) / 2)
    assert metrics["evidence/selected"] == pytest.approx(2 / 3)
    assert metrics["evidence/rounds"] == pytest.approx(2 / 3) and metrics["evidence/alpha"] == 0.2
