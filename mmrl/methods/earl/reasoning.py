"""The reasoning text of EARL's cold-start demonstrations (:meth:`.environment.FrameSelectionEnvironment.demonstration`).

EARL's trajectories alternate text reasoning and frame selection, and reason before the answer
(docs/methods/earl.md, Protocol: y = [y1, ..., yn, â], each y_t reasoning or a selection). The paper's 3.8k
action-aware SFT trajectories are not public (same page, Training), so mmrl writes its own: a short
*templated* reasoning grounded in what the shown frames are known to hold. It names the current frames (by
their number and time) that lie inside the record's gold evidence span, or, when none does, the frames nearest
to it, and says what the policy does next: look closer around them, or answer. It is not a free-form chain of
thought (no captioner writes it); what it teaches is the form (reason, then act) and a grounded choice of
frames.

Each function returns the text inside ``<think></think>``.
"""

from __future__ import annotations

from collections.abc import Sequence


def _frames(indices: Sequence[int], times: Sequence[float]) -> str:
    """``frame 3 (12.4 s)`` / ``frames 3 and 4 (10.3 s, 14.8 s)`` for 0-based ``indices`` into ``times``."""
    nums = [str(i + 1) for i in indices]
    at = ", ".join(f"{times[i]:.1f} s" for i in indices)
    if len(nums) == 1:
        return f"frame {nums[0]} ({at})"
    return f"frames {', '.join(nums[:-1])} and {nums[-1]} ({at})"


def inside(times: Sequence[float], spans: Sequence[Sequence[float]]) -> list[int]:
    """0-based indices of the frames at ``times`` that lie inside a gold span."""
    return [k for k, t in enumerate(times) if any(a <= t <= b for a, b in spans)]


def selection_thought(times: Sequence[float], picked: Sequence[int], spans: Sequence[Sequence[float]]) -> str:
    """Reasoning before ``select_frames`` of the 0-based ``picked`` among the current frames at ``times``."""
    seen = inside(times, spans)
    if seen:
        return (f"The moment the question asks about is on {_frames(seen, times)}. I look closer around "
                f"{_frames(picked, times)} for finer detail.")
    return (f"None of the {len(times)} frames shows the moment the question asks about clearly; it lies "
            f"around {_frames(picked, times)}. I look closer around them.")


def answer_thought(times: Sequence[float], spans: Sequence[Sequence[float]], answer: str) -> str:
    """Reasoning before the answer ``answer``, with the current frames at ``times``."""
    seen = inside(times, spans)
    if seen:
        return f"The moment the question asks about is on {_frames(seen, times)}; it shows that the answer is {answer}."
    centre = [(a + b) / 2 for a, b in spans]
    near = min(range(len(times)), key=lambda k: min(abs(times[k] - c) for c in centre))
    return (f"No frame shows the moment clearly; the nearest is {_frames([near], times)}. From the frames I "
            f"have, the answer is {answer}.")
