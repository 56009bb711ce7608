"""Reasoning traces for the toy world's questions: what a reasoning cold start (``sft.target: reasoning``) writes
inside ``<think></think>`` before the answer.

A real Qwen-VL arrives at RL already writing reasoning of varying length (and Video-R1, ARES and ACRE start
RL from a chain-of-thought cold start). The toy base model only names what it sees, so methods that act on
the reasoning (ARES's length and entropy shaping, ACRE's re-answer from the model's own reasoning) have
nothing to act on. This module gives each toy record a set of *true* observation sentences built from the
record's own facts (``meta`` and the answer) -- "I count the discs: one, two, three.", "The first flash is
red." -- and :func:`toy_rationale` draws a trace of random length from them: 0 to ``max_looks`` look steps
("I watch the frames again."), then a random non-empty subset of the facts in their given order. Every
sentence is true of the video; nothing is a guess. Lengths therefore vary from one draw to the next for the same question, and
the enumerations make harder counts longer, which is what RL then shapes.

Records of your own carry ``meta.rationale`` (a string: used as written; a list of sentences: drawn from the
same way) -- see :func:`mmrl.engine.sft.reasoning_target`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight")
LOOK = ("I look at the video.", "I watch the frames again.", "I check the frames once more.")

Facts = Callable[[Mapping[str, Any], str], list[str]]


def _count(meta: Mapping[str, Any], answer: str) -> list[str]:
    n = int(meta.get("count", answer))
    seen = ", ".join(NUMBER_WORDS[:n])
    return [f"I count the discs: {seen}.", f"There {'is' if n == 1 else 'are'} {answer} disc{'s' * (n != 1)}."]


# toy task -> true sentences about one record, from its meta and its answer (the option text)
TOY_FACTS: dict[str, Facts] = {
    "color": lambda m, a: [f"The moving object is {a}.", f"It is a {m['shape']}."] if "shape" in m
    else [f"The moving object is {a}."],
    "shape": lambda m, a: [f"The moving object is a {a}.", f"It is {m['color']}."] if "color" in m
    else [f"The moving object is a {a}."],
    "count": _count,
    "motion": lambda m, a: ["The square starts on one side.", f"The square moves {a}."],
    "order": lambda m, a: [f"The first flash is {m.get('first', a)}.", f"The second flash is {m['second']}."]
    if "second" in m else [f"The first flash is {a}."],
    "needle": lambda m, a: ["Most frames show only the grey background.", f"A {a} square appears briefly."],
    "color_image": lambda m, a: [f"The object is {a}."],
}


def toy_facts(task: str, meta: Mapping[str, Any], answer: str) -> list[str]:
    """The true sentences about one toy record (``answer``: the option text, e.g. ``red``); [] for a task
    without any."""
    fn = TOY_FACTS.get(task)
    return fn(meta, answer) if fn is not None else []


def draw_trace(facts: Sequence[str], rng: random.Random, *, max_looks: int = 2) -> str:
    """A reasoning trace of random length: 0..``max_looks`` look steps, then a random non-empty subset of
    ``facts`` (all of them half of the time, so the answer is often stated), each kept in its given order."""
    looks = [LOOK[i % len(LOOK)] for i in range(rng.randint(0, max_looks))]
    if not facts:
        return " ".join(looks)
    if rng.random() < 0.5:
        keep = list(facts)
    else:
        k = rng.randint(1, len(facts))
        picked = sorted(rng.sample(range(len(facts)), k))
        keep = [facts[i] for i in picked]
    return " ".join(looks + keep)


def toy_rationale(sample: Any, rng: random.Random, *, max_looks: int = 2) -> str | None:
    """A random-length reasoning trace for a toy record, or None when ``sample`` is not a toy record this
    module knows."""
    meta = sample.meta or {}
    if meta.get("source") != "toy" or meta.get("task") not in TOY_FACTS:
        return None
    return draw_trace(toy_facts(meta["task"], meta, sample.answer_text()), rng, max_looks=max_looks)
