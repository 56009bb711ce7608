"""Video-R1's T-GRPO (arXiv 2503.21776): the ``t_grpo`` plug-in, the ``shuffled_frames`` evaluation check and
the ``eval_shuffled_frames`` plug-in; ``imports: [mmrl.methods.tgrpo]``.

The plug-in draws, for every group whose prompt shows a video, ``G/2`` more rollouts through the rollout
service from the same frames in a random order and adds the temporal bonus to the ordered rollouts; the bonus
itself, the length bonus and Temporal-R1's reward are pure formulas in :mod:`rewards.temporal` (read there for
the method and its settings; importing this module registers them too). The check answers every held-out
video question again from shuffled frames (``mmrl eval --check shuffled_frames``; ``metrics["shuffled_frames"]``:
the accuracy with shuffled frames, the ordered accuracy on the same questions and the gap, overall and per task).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmrl.engine.evaluate import register_check, reward_columns, score_text
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.engine.service import Ask, RolloutService
from mmrl.model import MediaInput
from mmrl_common.errors import ConfigError
from rewards import get_reward
from rewards.consistency import draw_permutation
from rewards.registry import CombinedReward
from rewards.temporal import has_video, temporal_bonus
from video.shuffle import shuffle_frames


def shuffled_media(preparer: Any, sample: Any, rng: random.Random, *, exclude_identity: bool = False) -> list[Any]:
    """The sample's decoded media with every video's frames in a random order (images unchanged)."""
    out = []
    for m in preparer.prepare(sample):
        if m.kind != "video":
            out.append(m)
            continue
        perm = draw_permutation(int(m.data.frames.shape[0]), rng, exclude_identity=exclude_identity)
        out.append(MediaInput(key=f"{m.key}|frames:{','.join(map(str, perm))}", kind="video",
                              data=shuffle_frames(m.data, perm), timestamps=m.timestamps))
    return out


@register_plugin("t_grpo")
class TGRPO(Callback):
    """Video-R1's temporal contrast (see the module docstring); ``plugins: {t_grpo: {alpha: 0.3, mu: 0.8}}``."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"alpha": 0.3, "mu": 0.8, "correct_threshold": 0.1, "shuffled_size": None,
                                "accuracy": "accuracy", "exclude_identity": False, "seed": 0}
    SETTINGS = tuple(DEFAULTS)

    def __init__(self, ctx: Any, **settings: Any):
        super().__init__(ctx, **{**self.DEFAULTS, **settings})
        s = self.settings
        for key in ("alpha", "mu", "correct_threshold"):
            if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or not math.isfinite(s[key]):
                raise ConfigError(f"plugins.t_grpo.{key} must be a number, got {s[key]!r}")
        g = ctx.cfg.rollout.group_size
        self.n_shuffled = int(s["shuffled_size"] or max(1, g // 2))
        if self.n_shuffled < 1:
            raise ConfigError(f"plugins.t_grpo.shuffled_size must be >= 1, got {s['shuffled_size']!r}")
        self._reset()

    def _reset(self) -> None:
        self.seen: dict[str, list[float]] = {"ordered": [], "shuffled": [], "bonus": []}

    def _accuracy_reward(self):
        label = self.settings["accuracy"]
        for spec in self.ctx.reward_specs:
            if spec.display_name == label:
                return CombinedReward([spec])
        raise ConfigError(f"plugins.t_grpo: no reward labelled {label!r} among the run's rewards "
                          f"({', '.join(self.ctx.reward_labels)}); set plugins.t_grpo.accuracy")

    def after_rewards(self, batch: Any) -> None:
        groups = [rows for rows in batch.groups() if has_video(batch.samples[rows[0]])]
        if not groups:
            return
        acc_reward = self._accuracy_reward()
        acc = batch.component(self.settings["accuracy"])
        samples = [batch.samples[rows[0]] for rows in groups]
        step = self.ctx.step
        asks = [Ask(media=shuffled_media(self.ctx.service.preparer, s,
                                         random.Random(f"tgrpo:{self.settings['seed']}:{step}:{s.id}:{k}"),
                                         exclude_identity=bool(self.settings["exclude_identity"])))
                for k, s in enumerate(samples)]
        r = self.ctx.cfg.rollout
        answers = self.ctx.service.generate(samples, asks, n=self.n_shuffled, greedy=False,
                                                temperature=r.temperature, max_new_tokens=r.max_new_tokens)
        flat = [s for s in samples for _ in range(self.n_shuffled)]
        texts = [a.text for group in answers for a in group]
        scores = acc_reward.compute(texts, reward_columns(flat)).total
        bonus = torch.zeros(len(batch))
        for k, rows in enumerate(groups):
            ordered = [float(acc[i]) for i in rows]
            shuffled = scores[k * self.n_shuffled:(k + 1) * self.n_shuffled]
            b = temporal_bonus(ordered, shuffled, alpha=float(self.settings["alpha"]), mu=float(self.settings["mu"]),
                               correct_threshold=float(self.settings["correct_threshold"]))
            bonus[rows] = torch.tensor(b)
            self.seen["ordered"].append(sum(ordered) / len(ordered))
            self.seen["shuffled"].append(sum(shuffled) / len(shuffled))
            self.seen["bonus"].append(float(any(b)))
        batch.rewards = batch.rewards + bonus
        batch.reward_components["temporal_bonus"] = bonus

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        if self.seen["ordered"]:
            n = len(self.seen["ordered"])
            stats["tgrpo/ordered_accuracy"] = sum(self.seen["ordered"]) / n
            stats["tgrpo/shuffled_accuracy"] = sum(self.seen["shuffled"]) / n
            stats["tgrpo/bonus_groups"] = sum(self.seen["bonus"]) / n
            stats["tgrpo/video_groups"] = n
        self._reset()


# --------------------------------------------------------------------------------------------------------
# The evaluation check and its plug-in
# --------------------------------------------------------------------------------------------------------


@register_check("shuffled_frames", summarize=lambda predictions: summarize_shuffled_frames(predictions),
                describe=lambda section: describe_shuffled_frames(section))
def shuffled_frames_check(service: RolloutService, samples: Sequence[Any], rows: list[dict[str, Any]], *,
                          max_new_tokens: int = 64, seed: int = 0, exclude_identity: bool = True) -> None:
    """Video-R1's temporal contrast on held-out questions: every question with a video is answered again,
    greedy, from the same frames in a random order (one permutation per question, from ``seed`` and the id;
    never the original order unless ``exclude_identity=False``); its prediction row gains
    ``shuffled_frames_score``."""
    todo = [i for i, s in enumerate(samples) if has_video(s)]
    if not todo:
        return
    asks = [Ask(media=shuffled_media(service.preparer, samples[i], random.Random(f"frames:{seed}:{samples[i].id}"),
                                     exclude_identity=exclude_identity)) for i in todo]
    answers = service.generate([samples[i] for i in todo], asks, max_new_tokens=max_new_tokens)
    texts = [a[0].text for a in answers]
    scores = get_reward("accuracy")(texts, **reward_columns([samples[i] for i in todo]))
    for i, text, score in zip(todo, texts, scores):
        rows[i]["shuffled_frames_completion"] = text
        rows[i]["shuffled_frames_score"] = float(score or 0.0)


def describe_shuffled_frames(sf: dict[str, Any]) -> list[str]:
    """The check's lines of the ``mmrl eval`` table."""
    f = score_text
    if not sf["n"]:
        return []
    rows = [(f"video questions with shuffled frames: accuracy {f(sf['accuracy'])} (ordered "
             f"{f(sf['ordered_accuracy'])}, gap {f(sf['gap'])}) on {sf['n']} questions")]
    rows += [f"  task {k:<17} shuffled {f(sf['by_task'][k])}  gap {f(v)}" for k, v in sf["gap_by_task"].items()]
    return rows


def summarize_shuffled_frames(predictions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with ordered and with shuffled frames on the video questions, overall and per task, and the
    gap (ordered - shuffled): how much the answers depend on the order of the frames."""
    rows = [p for p in predictions if "shuffled_frames_score" in p]

    def acc(key: str, rs: Sequence[dict[str, Any]]) -> float | None:
        return sum(r[key] for r in rs) / len(rs) if rs else None

    tasks = sorted({str(r["task"]) for r in rows if r["task"] is not None})
    by = {t: [r for r in rows if str(r["task"]) == t] for t in tasks}
    ordered, shuffled = acc("score", rows), acc("shuffled_frames_score", rows)
    return {"n": len(rows), "ordered_accuracy": ordered, "accuracy": shuffled,
            "gap": None if ordered is None else ordered - shuffled,
            "by_task": {t: acc("shuffled_frames_score", rs) for t, rs in by.items()},
            "gap_by_task": {t: acc("score", rs) - acc("shuffled_frames_score", rs) for t, rs in by.items()}}


@register_plugin("eval_shuffled_frames")
class EvalShuffledFrames(Callback):
    """``plugins: {eval_shuffled_frames: {}}``: every held-out evaluation of the run also answers each video
    question from its frames in a random order (:func:`shuffled_frames_check`; settings ``seed`` (0),
    ``exclude_identity`` (true)); ``metrics["shuffled_frames"]`` holds the accuracy with shuffled frames, the
    ordered accuracy on the same questions and the gap, overall and per task
    (``eval_after_rl.shuffled_frames.gap`` in summary.json)."""

    SETTINGS = ("seed", "exclude_identity")

    def __init__(self, ctx: Any, **settings: Any):
        super().__init__(ctx, **settings)
        ctx.service.evaluation.setdefault("checks", {})["shuffled_frames"] = dict(settings)
