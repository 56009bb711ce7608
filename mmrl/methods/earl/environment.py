"""EARL's frame-selection environment (``rollout.environment: select_frames``; docs/methods/earl.md).

The policy sees the video's initial frames (uniform sampling, numbered 1..N in time order). Instead of
answering it may call ``select_frames([i, j, ...])`` (also accepted: ``select_frames(target_frames=[...])``
and Qwen's ``<tool_call>{"name": "select_frames", "arguments": {"target_frames": [...]}}</tool_call>``)
with 1-based indices into the *current* frames, after its reasoning if it reasons (``<think>...</think>``
then the call: EARL's text reasoning and frame selection alternate). Reasoning is never read as an action:
closed ``<think>...</think>`` blocks, and an unclosed ``<think>`` to the end of the turn, are removed before
the turn is parsed (:func:`action_text`), so reasoning may name ``select_frames`` or frame numbers freely; a
call written only inside the reasoning is no call. The environment then re-samples the source video around
them (:func:`video.resample.resample_video`): each selected frame opens the interval between its previous
and next current frame, the intervals are merged, and up to ``max_new_frames`` frames never shown before
are spread over them in proportion to their length, decoded from the source file at a per-frame pixel
budget at least that of the initial frames. They are shown as one video in a user turn (masked out of the
loss by the rollout loop) whose text lists each new frame as ``index @ seconds``; they replace the current
frames, so the next call's indices refer to them.

Every turn has one defined outcome, appended to ``info["events"]`` (``{"turn", "outcome", ...}``):

======================  ==========================================================================
``answer``              the turn holds ``<answer>``: the episode ends (an answer wins over a call in
                        the same turn).
``no_action``           neither an answer nor a call: the episode ends; the turn is scored as it is.
``selected``            a valid call: new frames are shown (one selection round used).
``no_new_frames``       a valid call whose intervals hold no unseen frame: a round is used, the
                        current frames stay, the policy is told to answer.
``malformed``           ``select_frames``/``<tool_call>`` that does not parse: a format reminder.
``empty``               ``select_frames([])``: told to pick 1..max_select frames or answer.
``too_many``            more than ``max_select`` distinct indices: told the cap.
``out_of_range``        an index outside 1..N (N current frames): told the valid range.
``extra_call``          a call after ``max_rounds`` rounds: not executed; the episode ends
                        (``on_extra_call: end``, default) or the policy is told to answer now
                        (``on_extra_call: answer_now``).
``no_video``            the sample has no video (or it cannot be read again): the episode ends.
======================  ==========================================================================

Rejected calls (malformed, empty, too_many, out_of_range) use no round; they count in
``info["invalid_actions"]``. The rollout's ``max_turns`` still bounds every episode: with
``max_rounds: 2`` use ``rollout.max_turns: 4`` (two selections, the answer, and room for the environment to
see and log a third call).

``info`` (the reward reads it; ``env_info`` column): ``frames`` (every frame shown: ``{"round", "index",
"timestamp"}``, round 0 = the initial frames), ``selections`` (``{"round", "indices", "timestamps"}``,
indices 1-based into that round's frames), ``rounds``, ``frames_shown``, ``initial_timestamps``,
``duration``, ``invalid_actions``, ``extra_calls`` and ``events``.

Defaults (EARL's where the notes give them: at most 2 rounds and 16 new frames; PR's cap of 8 selected
frames): ``max_rounds=2``, ``max_select=8``, ``max_new_frames=16``, ``max_pixels=None`` (the new frames get
exactly the initial frames' size; a number above that lets them be larger), ``allocation="proportional"``,
``edge="mirror"`` (an edge frame's interval mirrors its one neighbour, see :mod:`video.resample`),
``on_extra_call="end"``.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from mmrl.engine.environments import Environment, Observation, register_environment
from mmrl.engine.prompts import media_parts
from mmrl.model import MediaInput
from mmrl.run.report import register_curve
from mmrl_common.errors import ConfigError, MmrlError
from video.resample import cell_of, cells, frames_on_spans  # noqa: F401  (cells: re-exported)

# the report's plots of the evidence rewards' metrics (rewards.evidence logs them)
register_curve("reward_metric/evidence/iou*", "EARL: selection IoU with the gold frames (all episodes / those that "
               "selected)", "earl_iou.png")
register_curve("reward_metric/evidence/selected", "EARL: share of episodes that select frames", "earl_selected.png")
register_curve("reward_metric/evidence/frames_shown", "EARL: frames shown per episode", "earl_frames.png")

ACTION_NAME = "select_frames"
_CALL = re.compile(r"select_frames\s*\(\s*(?:target_frames\s*=\s*)?\[([^\]]*)\]\s*\)")
_TOOL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = "<answer>"
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
OUTCOMES = ("answer", "no_action", "selected", "no_new_frames", "malformed", "empty", "too_many",
            "out_of_range", "extra_call", "no_video")


def action_text(turn: str) -> str:
    """The part of an assistant turn that can act: the turn without its reasoning (``<think>...</think>``
    blocks; an unclosed ``<think>`` runs to the end of the turn)."""
    return _THINK.sub(" ", turn)


def parse_selection(text: str) -> tuple[str, list[int] | None]:
    """``("none", None)`` (no call), ``("ok", indices)`` (1-based, as written; may be empty) or
    ``("malformed", None)`` for a call that does not parse; reasoning in ``text`` is skipped
    (:func:`action_text`)."""
    text = action_text(text)
    tool = _TOOL.search(text)
    if tool is not None:
        try:
            call = json.loads(tool.group(1))
            args = call.get("arguments", {}) if call.get("name") == ACTION_NAME else None
            if isinstance(args, str):
                args = json.loads(args)
            frames = args["target_frames"] if isinstance(args, dict) else None
        except (ValueError, AttributeError, KeyError, TypeError):
            frames = None
        if isinstance(frames, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in frames):
            return "ok", list(frames)
        return "malformed", None
    call = _CALL.search(text)
    if call is not None:
        parts = [p.strip() for p in call.group(1).split(",")]
        if parts == [""]:
            return "ok", []
        if all(re.fullmatch(r"[+-]?\d+", p) for p in parts):
            return "ok", [int(p) for p in parts]
        return "malformed", None
    if ACTION_NAME in text:
        return "malformed", None
    return "none", None


def format_call(indices: Sequence[int]) -> str:
    """The canonical action text: ``select_frames([3, 4])``."""
    return f"{ACTION_NAME}([{', '.join(str(int(i)) for i in indices)}])"


def instructions(max_rounds: int = 2, max_select: int = 8, *, think: bool = False) -> str:
    """A system-prompt paragraph that explains the action (the recipe's ``prompt.system``); ``think``: the
    policy reasons inside ``<think></think>`` before each selection and before the answer."""
    if think:
        return (f"The video frames are numbered 1, 2, ... in time order. Think inside <think></think> about which "
                f"frames hold the evidence; to look closer, then call {ACTION_NAME}([i, j]) with up to "
                f"{max_select} frame numbers: you get new frames around them, numbered again from 1 (at most "
                f"{max_rounds} times). Otherwise think, then give the answer.")
    return (f"The video frames are numbered 1, 2, ... in time order. To look closer, reply only "
            f"{ACTION_NAME}([i, j]) with up to {max_select} frame numbers: you get new frames around them, "
            f"numbered again from 1 (at most {max_rounds} times). Otherwise give the answer.")


class _ResampleCache:
    """Re-sampled frames by (video, current frames, selection, settings), least recently used dropped past
    ``limit_mb``: a demonstration replayed at every SFT epoch, and the rollouts of one prompt that select the
    same frames, decode them once."""

    def __init__(self, limit_mb: float = 256.0):
        self.limit = int(limit_mb * 2**20)
        self.items: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self.bytes = 0

    @staticmethod
    def _size(value: tuple[Any, Any]) -> int:
        video = value[1]
        return 0 if video is None else int(video.frames.numel() * video.frames.element_size())

    def get(self, key: str) -> tuple[Any, Any] | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: str, value: tuple[Any, Any]) -> None:
        size = self._size(value)
        if size > self.limit:
            return
        self.items[key] = value
        self.bytes += size
        while self.bytes > self.limit:
            _, old = self.items.popitem(last=False)
            self.bytes -= self._size(old)


RESAMPLED = _ResampleCache()


@register_environment(ACTION_NAME)
class FrameSelectionEnvironment(Environment):
    """See the module docstring; one instance per episode."""

    def __init__(self, sample: Any, media: list[MediaInput], *, max_rounds: int = 2, max_select: int = 8,
                 max_new_frames: int = 16, max_pixels: int | None = None, allocation: str = "proportional",
                 edge: str = "mirror", on_extra_call: str = "end", **kwargs: Any):
        super().__init__(sample, media)
        if kwargs:
            raise ConfigError(f"rollout.environment_kwargs: unknown setting(s) {sorted(kwargs)} for "
                              f"{ACTION_NAME}; valid: max_rounds, max_select, max_new_frames, max_pixels, "
                              "allocation, edge, on_extra_call")
        for name, value in (("max_rounds", max_rounds), ("max_select", max_select),
                            ("max_new_frames", max_new_frames)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"rollout.environment_kwargs.{name}={value!r}: must be a positive integer")
        if on_extra_call not in ("end", "answer_now"):
            raise ConfigError(f"rollout.environment_kwargs.on_extra_call={on_extra_call!r}: use end or answer_now")
        if allocation not in ("proportional", "equal"):
            raise ConfigError(f"rollout.environment_kwargs.allocation={allocation!r}: use proportional or equal")
        if edge not in ("bound", "mirror"):
            raise ConfigError(f"rollout.environment_kwargs.edge={edge!r}: use mirror or bound")
        self.max_rounds, self.max_select, self.max_new_frames = max_rounds, max_select, max_new_frames
        self.max_pixels, self.allocation, self.edge, self.on_extra_call = max_pixels, allocation, edge, on_extra_call
        self.video = next((m for m in media if m.kind == "video"), None)
        self.turn = 0
        self.info = {"rounds": 0, "frames": [], "selections": [], "frames_shown": 0, "initial_timestamps": [],
                     "duration": None, "invalid_actions": 0, "extra_calls": 0, "events": []}
        if self.video is not None:
            data = self.video.data
            self.current = [float(t) for t in data.timestamps]
            self.shown = list(self.current)
            self.size = (int(data.frames.shape[-2]), int(data.frames.shape[-1]))
            self.info.update(initial_timestamps=list(self.current), duration=float(data.duration),
                             frames_shown=len(self.current),
                             frames=[{"round": 0, "index": i + 1, "timestamp": t} for i, t in enumerate(self.current)])

    # ------------------------------------------------------------------------------------------ demonstrations
    def demonstration(self, answer: str, rounds: int | str = "auto", *, seed: int = 0,
                      answer_format: str = "answer") -> list[str] | None:
        """The assistant turns of an expert episode for action-aware SFT, played on this environment:
        0-``max_rounds`` selections of the current frames whose time cell overlaps the gold evidence (at
        most ``max_select``, nearest to the evidence first), then the answer ``answer`` (the bare answer,
        e.g. ``B``) inside ``<answer></answer>``. ``rounds``: ``auto`` selects until a shown frame lies inside a
        gold span (1 round for point-like gold such as grid ``gold_frames``), ``mix`` draws 0, 1 or 2 (seeded
        by the sample id and ``seed``), or a number. ``answer_format: think_answer`` (EARL's reasoning turns)
        puts a reasoning ``<think>...</think>`` before every call and before the answer
        (:mod:`.reasoning`: templated, grounded in which shown frames hold the evidence); ``answer``: calls
        and the answer alone. None when the sample has no video or no gold evidence."""
        import random

        from rewards.evidence import gold_time_spans

        from .reasoning import answer_thought, selection_thought

        if answer_format not in ("answer", "think_answer"):
            raise ConfigError(f"demonstration answer_format={answer_format!r}: use answer or think_answer")
        if self.video is None:
            return None
        spans = gold_time_spans(self.sample.meta, self.info["initial_timestamps"])
        if not spans:
            return None
        if rounds == "mix":
            rounds = random.Random(f"{self.sample.id}|{seed}").randrange(self.max_rounds + 1)
        if rounds != "auto" and (not isinstance(rounds, int) or not 0 <= rounds <= self.max_rounds):
            raise ConfigError(f"demonstration rounds={rounds!r}: use auto, mix or 0..{self.max_rounds}")
        think = answer_format == "think_answer"
        points = all(a == b for a, b in spans)
        turns: list[str] = []
        for r in range(self.max_rounds):
            if rounds == "auto":
                seen = any(a <= t <= b for t in self.current for a, b in spans)
                if (r >= 1) if points else seen:
                    break
            elif r >= rounds:
                break
            centre = [(a + b) / 2 for a, b in spans]
            hits = sorted(sorted(frames_on_spans(self.current, spans),
                                 key=lambda k: min(abs(self.current[k] - c) for c in centre))[:self.max_select])
            call = format_call([k + 1 for k in hits])
            if think:
                call = f"<think>{selection_thought(self.current, hits, spans)}</think>{call}"
            turns.append(call)
            if self.step(call) is None or self.info["events"][-1]["outcome"] != "selected":
                break
        final = f"<answer>{answer}</answer>"
        if think:
            final = f"<think>{answer_thought(self.current, spans, answer)}</think>{final}"
        return [*turns, final]

    # ------------------------------------------------------------------------------------------ the step
    def _event(self, outcome: str, **extra: Any) -> None:
        self.info["events"].append({"turn": self.turn, "outcome": outcome, **extra})

    def _reject(self, outcome: str, text: str, **extra: Any) -> Observation:
        self.info["invalid_actions"] += 1
        self._event(outcome, **extra)
        return Observation(text=text)

    def step(self, action: str) -> Observation | None:
        self.turn += 1
        action = action_text(action)
        if _ANSWER in action:
            self._event("answer")
            return None
        status, indices = parse_selection(action)
        if status == "none":
            self._event("no_action")
            return None
        if self.video is None:
            self._event("no_video")
            return None
        if self.info["rounds"] >= self.max_rounds:
            self.info["extra_calls"] += 1
            self._event("extra_call")
            if self.on_extra_call == "end":
                return None
            return Observation(text=f"No more selections ({self.max_rounds} used). Answer now inside "
                                    "<answer></answer>.")
        n = len(self.current)
        how = f"Reply {format_call([1, 2])} with 1 to {self.max_select} frame numbers from 1 to {n}, or answer."
        if status == "malformed":
            return self._reject("malformed", f"Could not read the selection. {how}")
        assert indices is not None
        if not indices:
            return self._reject("empty", f"No frame selected. {how}")
        chosen = sorted(set(indices))
        if len(chosen) > self.max_select:
            return self._reject("too_many", f"{len(chosen)} frames selected, at most {self.max_select}. {how}",
                                indices=chosen)
        bad = [i for i in chosen if not 1 <= i <= n]
        if bad:
            return self._reject("out_of_range", f"Frame(s) {', '.join(map(str, bad))} do not exist: the "
                                                f"current frames are 1 to {n}. {how}", indices=chosen)
        return self._resample(chosen)

    def _resample(self, chosen: list[int]) -> Observation | None:
        from video.resample import resample_video

        round_ = self.info["rounds"] + 1
        data = self.video.data
        resize: dict[str, Any]
        h, w = self.size
        if self.max_pixels is None or self.max_pixels <= h * w:
            resize = {"resized_height": h, "resized_width": w}
        else:
            resize = {"min_pixels": h * w, "max_pixels": int(self.max_pixels)}
        try:
            if not data.path:
                raise MmrlError("the video has no source file")
            args = dict(start=data.options.get("start"), end=data.options.get("end"), shown=list(self.shown),
                        allocation=self.allocation, edge=self.edge,
                        image_patch_size=int(data.options.get("image_patch_size", 14)), **resize)
            key = json.dumps([data.path, self.current, chosen, self.max_new_frames, args], sort_keys=True)
            found = RESAMPLED.get(key)
            if found is None:
                with data.reopen() as reader:  # the decoder and timeout the video was first decoded with
                    found = resample_video(reader, self.current, [i - 1 for i in chosen], self.max_new_frames,
                                           **args)
                RESAMPLED.put(key, found)
            res, video = found
        except (MmrlError, ValueError, OSError, RuntimeError) as exc:  # e.g. a frame folder, a moved file
            self._event("no_video", reason=str(exc))
            return None
        self.info["rounds"] = round_
        self.info["selections"].append({"round": round_, "indices": chosen,
                                        "timestamps": [self.current[i - 1] for i in chosen]})
        left = self.max_rounds - round_
        if video is None:
            self._event("no_new_frames", indices=chosen)
            return Observation(text="No unseen frames around those frames. Answer now inside <answer></answer>.")
        self._event("selected", indices=chosen, new_frames=len(res))
        stamps = [float(t) for t in res.timestamps]
        self.shown.extend(stamps)
        self.current = stamps
        self.info["frames_shown"] += len(stamps)
        self.info["frames"].extend({"round": round_, "index": i + 1, "timestamp": t} for i, t in enumerate(stamps))
        key = f"{self.video.key}|{ACTION_NAME}:{','.join(str(i) for i in res.indices)}"
        media = MediaInput(key=key, kind="video", data=video, timestamps=stamps, layout=self.video.layout)
        more = (f"Select again with {format_call([1])} ({left} left) or answer." if left > 0 else "Answer now.")
        if media.layout == "frames":  # labelled one-frame videos, as the prompt shows the initial frames
            parts, items = media_parts([media])
            shown = "".join(p["text"] if p["type"] == "text" else "{video}" for p in parts)
            return Observation(text=f"{len(stamps)} new frames: {shown}\n{more}", media=items)
        labels = ", ".join(f"{i + 1} @ {t:.2f}s" for i, t in enumerate(stamps))
        return Observation(text=f"{{video}}\n{len(stamps)} new frames: {labels}. {more}", media=[media])
