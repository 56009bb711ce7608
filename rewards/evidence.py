"""EARL's evidence-purity rewards (docs/methods/earl.md, Reward), read from the ``select_frames`` episode.

Three rewards, one per term of ``r = r_correct(answer, IoU) + alpha(t) * 1[selected] + beta(t) * IoU``, so
each is logged as its own component (``reward/evidence_correct``, ``reward/evidence_action``,
``reward/evidence_relevance``); list all three in ``rewards:`` with weight 1 (drop ``evidence_relevance`` for
the "without relevance" ablation). Every one takes the same settings, so one YAML anchor can feed all three:

==================  =========  =============================================================================
setting             default    meaning
==================  =========  =============================================================================
``iou_threshold``   0.5        the purity gate of ``evidence_correct`` (EARL's value)
``correct_reward``  1.0        correct answer and IoU >= threshold (EARL's table)
``partial_reward``  0.5        correct answer, IoU below the threshold (EARL's table)
``wrong_reward``    -1.0       wrong answer (EARL's table)
``correct_at``      0.5        an answer is correct when the ``accuracy`` reward scores it >= this (multiple
                               choice scores 0 or 1; grounding scores a temporal IoU)
``alpha_early``     0.2        action weight while progress <= ``switch_at``  (the paper gives no values:
``alpha_late``      0.05       action weight after it                          docs/methods/earl.md's
``beta_early``      0.2        relevance weight while progress <= ``switch_at`` starting guesses)
``beta_late``       0.5        relevance weight after it
``switch_at``       0.3        P: the fraction of training where the weights change
``schedule``        step       ``step`` (EARL: early weights up to P, late ones after) or ``linear`` (early
                               at progress 0 moving linearly to late at P, late after)
``gold``            auto       where gold evidence comes from: ``auto`` (time spans when the record has
                               them, else ``gold_frames``), ``spans`` or ``frames``
``gold_frames_on``  grid       ``meta.gold_frames`` are 0-based indices on the initial frame grid (``grid``)
                               or frame numbers of the source video (``video``, converted to seconds with
                               ``meta.video.fps``)
==================  =========  =============================================================================

Progress is ``trainer_state.global_step / trainer_state.max_steps`` (1.0 outside training).

**Gold and selections on one grid (the round-2 rule).** The round-0 frames split the video into time
cells: a frame's cell runs from the midpoint with its previous frame to the midpoint with its next one.
Gold is the set of round-0 frames whose cell overlaps a gold time span (``meta.gold_spans`` ``[[s, e],
...]`` or ``meta.gold_span`` ``[s, e]``, seconds), or ``meta.gold_frames`` directly. Every selected frame, of
either round, counts as the round-0 frame whose cell holds its timestamp (a round-1 selection is its own
index; a round-2 frame maps to the coarse frame nearest in time). IoU = |selected ∩ gold| / |selected ∪
gold| over the union of both rounds (docs/methods/earl.md, the round-2 rule). No selection: IoU 0. A record
without gold: ``evidence_relevance`` is not applicable (None) and ``evidence_correct`` is not gated.

Each call also logs ``reward_metric/evidence/<name>`` batch means: ``iou``, ``iou_selected`` (over episodes
that selected), ``selected`` (share of episodes with a selection), ``rounds``, ``frames_shown``,
``invalid_actions``, ``extra_calls``, ``alpha``, ``beta``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from mmrl_common.errors import ConfigError, DataError
from rewards.registry import register_reward
from video.resample import cell_of, frames_on_spans


@dataclass(frozen=True)
class EvidenceSettings:
    iou_threshold: float = 0.5
    correct_reward: float = 1.0
    partial_reward: float = 0.5
    wrong_reward: float = -1.0
    correct_at: float = 0.5
    alpha_early: float = 0.2
    alpha_late: float = 0.05
    beta_early: float = 0.2
    beta_late: float = 0.5
    switch_at: float = 0.3
    schedule: str = "step"
    gold: str = "auto"
    gold_frames_on: str = "grid"

    def __post_init__(self) -> None:
        if self.schedule not in ("step", "linear"):
            raise ConfigError(f"evidence rewards: schedule={self.schedule!r}; use step or linear")
        if self.gold not in ("auto", "spans", "frames"):
            raise ConfigError(f"evidence rewards: gold={self.gold!r}; use auto, spans or frames")
        if self.gold_frames_on not in ("grid", "video"):
            raise ConfigError(f"evidence rewards: gold_frames_on={self.gold_frames_on!r}; use grid or video")
        if not 0.0 <= self.switch_at <= 1.0:
            raise ConfigError(f"evidence rewards: switch_at={self.switch_at} must lie in [0, 1]")

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> EvidenceSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: columns[k] for k in names if k in columns})


def weight(progress: float, early: float, late: float, switch_at: float, schedule: str) -> float:
    """A term's weight at ``progress`` (0..1): ``step``: ``early`` up to ``switch_at``, ``late`` after;
    ``linear``: from ``early`` at 0 to ``late`` at ``switch_at``, ``late`` after."""
    if schedule == "step":
        return early if progress <= switch_at else late
    if switch_at <= 0 or progress >= switch_at:
        return late
    return early + (late - early) * progress / switch_at


def progress_of(trainer_state: Any) -> float:
    """``global_step / max_steps`` of TRL's ``TrainerState`` (1.0 without one)."""
    if trainer_state is None:
        return 1.0
    steps = getattr(trainer_state, "max_steps", 0) or 0
    return min(1.0, max(0.0, getattr(trainer_state, "global_step", 0) / steps)) if steps > 0 else 1.0


def _spans(meta: Mapping[str, Any]) -> list[list[float]] | None:
    spans = meta.get("gold_spans")
    if spans is None and meta.get("gold_span") is not None:
        spans = [meta["gold_span"]]
    if spans is None:
        return None
    if not isinstance(spans, (list, tuple)) or not all(
            isinstance(s, (list, tuple)) and len(s) == 2 and float(s[0]) <= float(s[1]) for s in spans):
        raise DataError(f"meta.gold_spans must be a list of [start, end] seconds (start <= end), got {spans!r}")
    return [[float(a), float(b)] for a, b in spans]


def gold_time_spans(meta: Mapping[str, Any], initial: Sequence[float],
                    settings: EvidenceSettings | None = None) -> list[list[float]] | None:
    """Gold evidence as time spans (seconds): the record's spans, or its ``gold_frames`` as points (grid
    indices: the initial frames' timestamps; video frame numbers: ``[i / fps, (i + 1) / fps]``)."""
    settings = settings or EvidenceSettings()
    spans = _spans(meta) if settings.gold in ("auto", "spans") else None
    if spans is not None:
        return spans
    frames = meta.get("gold_frames") if settings.gold in ("auto", "frames") else None
    if frames is None or not initial:
        return None
    cells_ = gold_cells({"gold_frames": frames, "video": meta.get("video")}, initial,
                        EvidenceSettings(gold="frames", gold_frames_on=settings.gold_frames_on))
    if settings.gold_frames_on == "video":
        fps = float(meta["video"]["fps"])
        return [[i / fps, (i + 1) / fps] for i in frames]
    return [[float(initial[k]), float(initial[k])] for k in sorted(cells_ or ())]


def gold_cells(meta: Mapping[str, Any], initial: Sequence[float], settings: EvidenceSettings) -> set[int] | None:
    """0-based round-0 frames that hold gold evidence (None: the record has no gold)."""
    if not initial:
        return None
    spans = _spans(meta) if settings.gold in ("auto", "spans") else None
    if spans is not None:
        return set(frames_on_spans(initial, spans))
    frames = meta.get("gold_frames") if settings.gold in ("auto", "frames") else None
    if frames is None:
        return None
    if not isinstance(frames, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in frames):
        raise DataError(f"meta.gold_frames must be a list of frame indices, got {frames!r}")
    if settings.gold_frames_on == "video":
        fps = (meta.get("video") or {}).get("fps")
        if not fps:
            raise DataError("gold_frames_on=video needs meta.video.fps to turn frame numbers into seconds")
        return {cell_of(i / float(fps), initial) for i in frames}
    bad = [i for i in frames if not 0 <= i < len(initial)]
    if bad:
        raise DataError(f"meta.gold_frames {bad} are outside the {len(initial)} initial frames (0-based grid "
                        "indices; set gold_frames_on: video for source-video frame numbers)")
    return set(frames)


def selected_cells(info: Mapping[str, Any]) -> set[int]:
    """0-based round-0 frames of every selection in the episode (each selected frame maps to the round-0
    frame nearest in time)."""
    initial = info.get("initial_timestamps") or []
    if not initial:
        return set()
    return {cell_of(float(t), initial) for sel in info.get("selections") or [] for t in sel["timestamps"]}


@dataclass
class EpisodeEvidence:
    correct: bool
    selected: bool
    iou: float | None  # None: no gold


def analyse(completions: Sequence[Any], columns: Mapping[str, Any], settings: EvidenceSettings
            ) -> list[EpisodeEvidence]:
    from rewards import get_reward
    from rewards.registry import normalize_completions

    texts = normalize_completions(completions)
    own = {f.name for f in fields(EvidenceSettings)}
    scores = get_reward("accuracy")(texts, **{k: v for k, v in columns.items() if k not in own})
    infos = columns.get("env_info") or [{}] * len(texts)
    metas = columns.get("meta") or [{}] * len(texts)
    out = []
    for score, info, meta in zip(scores, infos, metas):
        info = info or {}
        gold = gold_cells(meta or {}, info.get("initial_timestamps") or [], settings)
        chosen = selected_cells(info)
        iou = None if gold is None else (len(chosen & gold) / len(chosen | gold) if chosen | gold else 0.0)
        out.append(EpisodeEvidence(correct=score is not None and float(score) >= settings.correct_at,
                                   selected=bool(info.get("selections")), iou=iou))
    return out


def _log(columns: Mapping[str, Any], episodes: list[EpisodeEvidence], alpha: float, beta: float) -> None:
    log = columns.get("log_metric")
    if not callable(log) or not episodes:
        return
    infos = [i or {} for i in (columns.get("env_info") or [])]
    ious = [e.iou for e in episodes if e.iou is not None]
    chosen = [e.iou for e in episodes if e.iou is not None and e.selected]
    values = {"iou": sum(ious) / len(ious) if ious else None,
              "iou_selected": sum(chosen) / len(chosen) if chosen else None,
              "selected": sum(e.selected for e in episodes) / len(episodes), "alpha": alpha, "beta": beta}
    for key in ("rounds", "frames_shown", "invalid_actions", "extra_calls"):
        if infos:
            values[key] = sum(float(i.get(key) or 0) for i in infos) / len(infos)
    for key, value in values.items():
        if value is not None:
            log(f"evidence/{key}", value)


def _run(term: str, completions: Sequence[Any], columns: Mapping[str, Any]) -> list[float | None]:
    s = EvidenceSettings.from_columns(columns)
    episodes = analyse(completions, columns, s)
    p = progress_of(columns.get("trainer_state"))
    alpha = weight(p, s.alpha_early, s.alpha_late, s.switch_at, s.schedule)
    beta = weight(p, s.beta_early, s.beta_late, s.switch_at, s.schedule)
    _log(columns, episodes, alpha, beta)
    if term == "action":
        return [alpha * float(e.selected) for e in episodes]
    if term == "relevance":
        return [None if e.iou is None else beta * e.iou for e in episodes]
    out: list[float | None] = []
    for e in episodes:
        if not e.correct:
            out.append(s.wrong_reward)
        elif e.iou is None or e.iou >= s.iou_threshold:
            out.append(s.correct_reward)
        else:
            out.append(s.partial_reward)
    return out


@register_reward("evidence_correct", locate_errors=False)
def evidence_correct(completions: list[Any], **columns: Any) -> list[float | None]:
    """EARL's gated correctness: 1 (correct, IoU >= 0.5), 0.5 (correct, IoU below), -1 (wrong)."""
    return _run("correct", completions, columns)


@register_reward("evidence_action", locate_errors=False)
def evidence_action(completions: list[Any], **columns: Any) -> list[float | None]:
    """alpha(t) when the episode made at least one frame selection, else 0."""
    return _run("action", completions, columns)


@register_reward("evidence_relevance", locate_errors=False)
def evidence_relevance(completions: list[Any], **columns: Any) -> list[float | None]:
    """beta(t) * IoU(selected, gold) on the round-0 grid (None for records without gold)."""
    return _run("relevance", completions, columns)
