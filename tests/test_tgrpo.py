"""T-GRPO: the bonus rule on hand-made groups, frame shuffling, the plug-in inside a real trainer (shuffled
rollouts scored, not trained; the bonus lands in the totals), Video-R1's length bonus by hand, and the
shuffled-frames evaluation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 (module_cache is a fixture)

from mmrl.methods.tgrpo import shuffled_media
from mmrl_common.errors import ConfigError
from rewards.registry import CombinedReward
from rewards.temporal import has_video, temporal_bonus

pytestmark = pytest.mark.usefixtures("module_cache")


def test_bonus_rule_on_hand_made_groups() -> None:
    # p = 0.5, p~ = 0.5: 0.5 >= 0.8 * 0.5, the two correct rollouts get alpha
    assert temporal_bonus([1, 1, 0, 0], [1, 0]) == [0.3, 0.3, 0.0, 0.0]
    # p = 0.25 < 0.8 * 0.5: nothing
    assert temporal_bonus([1, 0, 0, 0], [1, 0]) == [0.0] * 4
    # p = 0.8 = mu * p~ exactly (p~ = 1): the rule is >=, so the bonus is given
    assert temporal_bonus([1, 1, 1, 1, 0], [1, 1]) == [0.3, 0.3, 0.3, 0.3, 0.0]
    # the shuffled group does better by more than 1/mu: no bonus
    assert temporal_bonus([1, 1, 0, 0, 0], [1, 1]) == [0.0] * 5
    # continuous accuracy: only rollouts above correct_threshold (0.1) count as correct
    assert temporal_bonus([0.05, 0.5], [0.0]) == [0.0, 0.3]
    # nobody right anywhere: the condition holds, but no rollout earns the bonus
    assert temporal_bonus([0, 0], [0, 0]) == [0.0, 0.0]
    # other alpha / mu
    assert temporal_bonus([1, 0], [1, 1], alpha=1.0, mu=0.5) == [1.0, 0.0]
    assert temporal_bonus([1, 0], [1, 1], alpha=1.0, mu=0.6) == [0.0, 0.0]


def test_signature_the_bonus_ranks_correct_rollouts_up_only_where_the_order_matters() -> None:
    """T-GRPO's signature on a constructed case, with Video-R1's rewards (accuracy + format, summed): one
    group's rollouts are (correct, out of format), (correct, in format) and two (wrong, in format). Under
    plain GRPO the correct-but-unformatted rollout earns what the wrong ones earn (1 each). When the
    shuffled-frame group fails (the answer needs the order) the bonus lifts every correct rollout, so it now
    outranks the wrong ones; when the shuffled group does as well (a static shortcut: p = 0.5 < 0.8 p~ = 0.8)
    nothing changes and the advantages are plain GRPO's."""
    acc, fmt = [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]

    def advantages(bonus: list[float]) -> list[float]:
        r = torch.tensor([a + f + b for a, f, b in zip(acc, fmt, bonus)])
        return ((r - r.mean()) / (r.std() + 1e-6)).tolist()

    plain = advantages([0.0] * 4)
    assert plain[0] == pytest.approx(plain[2]) == pytest.approx(plain[3])  # correct = wrong when out of format
    order_matters = advantages(temporal_bonus(acc, [0.0, 0.0, 0.0, 0.0]))
    assert order_matters[0] > order_matters[2] == pytest.approx(order_matters[3])
    shortcut = advantages(temporal_bonus(acc, [1.0, 1.0, 1.0, 1.0]))
    assert shortcut == pytest.approx(plain)


def test_shuffle_frames_moves_only_the_frames() -> None:
    from video.sampling import SampledVideo
    from video.shuffle import shuffle_frames

    frames = torch.arange(4).view(4, 1, 1, 1).expand(4, 3, 2, 2).to(torch.uint8)
    v = SampledVideo(frames=frames, indices=[0, 4, 8, 12], timestamps=[0.0, 0.5, 1.0, 1.5], video_fps=8.0,
                     sample_fps=2.0, total_frames=16, duration=2.0, window_frames=16)
    s = shuffle_frames(v, [2, 0, 3, 1])
    assert s.frames[:, 0, 0, 0].tolist() == [2, 0, 3, 1]
    assert s.indices == v.indices and s.timestamps == v.timestamps and s.sample_fps == v.sample_fps
    assert v.frames[:, 0, 0, 0].tolist() == [0, 1, 2, 3]  # the ordered clip is untouched
    with pytest.raises(ValueError, match="not a permutation of the 4"):
        shuffle_frames(v, [0, 1, 2])


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory):
    from mmrl.config import load_run_config
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, "imports=[mmrl.methods.tgrpo]",
                                                 "plugins={t_grpo: {}}"])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), device="cpu")
    return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path_factory.mktemp("tgrpo") / "run", show_progress=False)


def test_shuffled_media_has_the_same_frames_in_another_order(trainer) -> None:
    sample = trainer.train_samples[0]
    assert has_video(sample)
    ordered = trainer.preparer.prepare(sample)[0]
    shuffled = shuffled_media(trainer.preparer, sample, random.Random(1), exclude_identity=True)[0]
    assert shuffled.key != ordered.key
    n = ordered.data.frames.shape[0]
    matches = [[j for j in range(n) if torch.equal(shuffled.data.frames[t], ordered.data.frames[j])] for t in range(n)]
    assert all(matches) and sorted(m[0] for m in matches) == list(range(n))
    assert [m[0] for m in matches] != list(range(n))


def test_plugin_scores_a_shuffled_half_group_and_adds_the_bonus(trainer) -> None:
    plugin = trainer.plugins["t_grpo"]
    assert plugin.n_shuffled == trainer.cfg.rollout.group_size // 2
    calls = trainer.service.calls
    batch = trainer.rollout_round(2)  # hooks on: the plug-in runs after the rewards
    assert trainer.service.calls == calls + 1  # one generate call: both groups' shuffled rollouts
    assert len(batch) == 2 * trainer.cfg.rollout.group_size  # the shuffled rollouts are not in the batch
    assert "temporal_bonus" in batch.reward_components
    # every rollout of group 0 answers correctly: p = 1 >= 0.8 * p~ whatever the shuffled group did
    rows = next(batch.groups())
    batch.completions = [f"<answer>{s.answer}</answer>" if i in rows else "<answer>?</answer>"
                         for i, s in enumerate(batch.samples)]
    trainer.score(batch)
    plain = batch.rewards.clone()
    plugin.after_rewards(batch)
    assert torch.allclose(batch.rewards[rows], plain[rows] + 0.3)
    others = [i for i in range(len(batch)) if i not in rows]
    assert torch.equal(batch.rewards[others], plain[others])  # no correct rollout there
    assert batch.reward_components["temporal_bonus"][rows].tolist() == [pytest.approx(0.3)] * len(rows)
    stats: dict = {}
    plugin.on_step_end(1, stats)
    assert stats["tgrpo/ordered_accuracy"] == pytest.approx((1.0 + 0.0 + 0.0 + 0.0) / 4)  # 2 rounds x 2 groups
    assert 0.0 <= stats["tgrpo/shuffled_accuracy"] <= 1.0 and stats["tgrpo/video_groups"] == 4
    assert stats["tgrpo/bonus_groups"] >= 0.25


def test_plugin_settings_are_checked(trainer) -> None:
    from mmrl.methods.tgrpo import TGRPO

    with pytest.raises(ConfigError, match="unknown setting"):
        TGRPO(trainer.context, beta=1)
    with pytest.raises(ConfigError, match="alpha must be a number"):
        TGRPO(trainer.context, alpha="big")
    bad = TGRPO(trainer.context, accuracy="acc")
    with pytest.raises(ConfigError, match="no reward labelled 'acc'"):
        bad.after_rewards(trainer.rollout_prompts([0], hooks=False))


def test_length_bonus_by_hand() -> None:
    reward = CombinedReward([{"name": "length_bonus", "kwargs": {"min_tokens": 3, "max_tokens": 5}}])
    completions = ["<answer>A</answer>", "<answer>A</answer>", "<answer>A</answer>", "<answer>B</answer>",  # g1
                   "<answer>A</answer>", "<answer>B</answer>"]  # g2: one correct only
    lengths = [3, 6, 5, 4, 4, 4]
    columns = {"id": ["g1"] * 4 + ["g2"] * 2, "problem_type": ["multiple_choice"] * 6, "answer": ["A"] * 6,
               "options": [["x", "y"]] * 6, "completion_ids": [[0] * k for k in lengths]}
    values = reward.compute(completions, columns).components["length_bonus"]
    # g1: three correct (>= 2): lengths 3 and 5 are inside [3, 5], 6 is not; the wrong one gets nothing
    assert values == [0.2, 0.0, 0.2, 0.0, 0.0, 0.0]
    with pytest.raises(Exception, match="completion_ids"):
        reward.compute(completions, {k: v for k, v in columns.items() if k != "completion_ids"})


def test_evaluation_with_shuffled_frames(trainer, tmp_path: Path) -> None:
    from mmrl.engine.evaluate import evaluate

    samples = trainer.train_samples[:3]
    metrics, preds = evaluate(trainer.service, samples, max_new_tokens=4, show_progress=False,
                              checks={"shuffled_frames": {}})
    sf = metrics["shuffled_frames"]
    assert sf["n"] == 3 and all("shuffled_frames_score" in p for p in preds)
    assert sf["gap"] == pytest.approx(sf["ordered_accuracy"] - sf["accuracy"])
    assert set(sf["by_task"]) == {"color"}
