"""The ``format`` reward: 1.0 when a completion has the configured structure, else 0.0.

Modes (kwarg ``mode``):

* ``"think_answer"`` (default, the R1 format): ``<think>…</think>``, optional whitespace, ``<answer>…</answer>``,
  and nothing else.
* ``"answer"``: the whole completion is one ``<answer>…</answer>`` block.
* ``"think_optional"``: either of the above.
* ``"think_boxed"``: ARES's and EasyR1's math format reward (shawn0728/ARES and hiyouga/EasyR1,
  examples/reward_function/math.py, for the ``ares-math`` prompt): the completion, with the whitespace around
  ``<``, ``>`` and ``/`` removed as their ``compute_score`` does first, is ``<think>…</think>`` then any text
  holding ``\\boxed{…}`` (``re.fullmatch`` of ``<think>.*</think>.*\\\\boxed\\{.*\\}.*``, across lines). It
  starts with the think block; ``strip`` and ``allow_empty_answer`` do not apply; ``think_tag`` renames the
  tag.
* ``"tvg_json"``: Temporal-R1's format reward (appletea233/Temporal-R1, ``verl/utils/reward_score/tvg.py``,
  ``tvg_format_reward``): the whole completion, not stripped, is ``<think>…</think>``, optional whitespace, then
  an ``<answer>`` block holding only the JSON object ``{"start_time": "S", "end_time": "E"}`` with S and E quoted
  strings of digits and dots (whitespace allowed around the braces, colons and comma; ``re.fullmatch``, across
  lines). Unquoted numbers, other keys, a span in another form or any text after the block: 0.
* ``"mmr1"``: MMR1's format reward (LengSicong/MMR1, ``verl/utils/reward_score/openr1_rewards_batch.py``,
  ``format_reward_batch``): exactly one ``<think>…</think>`` that starts a line (whitespace before it allowed)
  and exactly one ``<answer>…</answer>`` that ends a line (whitespace after it allowed), counted by
  ``re.findall`` with ``^``/``$`` at every line; text between the blocks, before the think block's line and
  after the answer's line is allowed. It is not stripped.

As in ``think_boxed``, ``strip`` and ``allow_empty_answer`` do not apply to ``tvg_json`` and ``mmr1`` (the
released rules are taken as they are); ``think_tag`` / ``answer_tag`` rename their tags.

``think_tag`` / ``answer_tag`` rename the tags (``"reasoning"``, ``"final"``, ...). ``strip=True`` (default)
ignores whitespace around the whole completion (VideoChat-R1 strips, Video-R1 does not; pass
``strip=False`` for the strict form). ``allow_empty_answer=False`` (default) rejects an answer block with
nothing but whitespace. A tag may appear once only: a block containing another ``<think>``/``<answer>`` tag
(opening or closing) fails. ``pattern`` replaces all of this with a custom regular expression that must match
the whole completion (``re.DOTALL``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from rewards.registry import normalize_completions, register_reward

__all__ = ["check_format", "format_reward"]

_MODES = ("think_answer", "answer", "think_optional", "think_boxed", "tvg_json", "mmr1")
_SPACED_MARK = re.compile(r"\s*(<|>|/)\s*")


@lru_cache(maxsize=64)
def _compiled(mode: str, think_tag: str, answer_tag: str):
    if mode not in _MODES:
        raise ValueError(f"format mode must be one of {', '.join(_MODES)}; got {mode!r}")
    t, a = re.escape(think_tag), re.escape(answer_tag)
    if mode == "think_boxed":
        return re.compile(rf"<{t}>.*</{t}>.*\\boxed\{{.*\}}.*", re.DOTALL), None
    if mode == "tvg_json":  # tvg.py's pattern: quoted digit-and-dot times, nothing around the two blocks
        return re.compile(rf'<{t}>.*?</{t}>\s*<{a}>\s*{{\s*"start_time"\s*:\s*"[\d.]+"\s*,\s*"end_time"\s*:'
                          rf'\s*"[\d.]+"\s*}}\s*</{a}>', re.DOTALL), None
    if mode == "mmr1":  # format_reward_batch's two patterns, each to be found exactly once
        flags = re.MULTILINE | re.DOTALL
        return re.compile(rf"^\s*<{t}>.*?</{t}>", flags), re.compile(rf"<{a}>.*?</{a}>\s*$", flags)
    think = rf"<{t}>(?P<think>.*?)</{t}>\s*"
    answer = rf"<{a}>(?P<answer>.*?)</{a}>"
    body = {"think_answer": think + answer, "answer": answer, "think_optional": f"(?:{think})?{answer}"}[mode]
    any_tag = re.compile(rf"</?(?:{t}|{a})>", re.IGNORECASE)
    return re.compile(body, re.DOTALL), any_tag


FORMAT_OPTIONS = ("mode", "think_tag", "answer_tag", "strip", "allow_empty_answer", "pattern")


@lru_cache(maxsize=64)
def _custom(pattern: str):
    return re.compile(pattern, re.DOTALL)


def check_format(
    text: str,
    *,
    mode: str = "think_answer",
    think_tag: str = "think",
    answer_tag: str = "answer",
    strip: bool = True,
    allow_empty_answer: bool = False,
    pattern: str | None = None,
) -> bool:
    """Whether ``text`` has the structure described in the module docstring."""
    s = text.strip() if strip else text
    if pattern is not None:
        return _custom(pattern).fullmatch(s) is not None
    block, any_tag = _compiled(mode, think_tag, answer_tag)
    if mode == "think_boxed":
        return block.fullmatch(_SPACED_MARK.sub(r"\1", text)) is not None
    if mode == "tvg_json":
        return block.fullmatch(text) is not None
    if mode == "mmr1":  # here the pair is (think pattern, answer pattern)
        return _count(block, text) == 1 and _count(any_tag, text) == 1
    m = block.fullmatch(s)
    if m is None:
        return False
    for part in ("think", "answer"):
        content = m.groupdict().get(part)
        if content is not None and any_tag.search(content):
            return False
    return allow_empty_answer or bool(m.group("answer").strip())


def _count(pattern: re.Pattern[str], text: str) -> int:
    """How many non-overlapping matches ``re.findall`` would return (at most 2: only "exactly one" is asked)."""
    n = 0
    for _ in pattern.finditer(text):
        n += 1
        if n > 1:
            break
    return n


@register_reward("format")
def format_reward(completions: list[Any], **columns: Any) -> list[float]:
    """1.0 per completion with the configured structure, else 0.0 (see the module docstring). The reward's
    kwargs are :func:`check_format`'s options (``mode``, ``think_tag``, ``answer_tag``, ``strip``,
    ``allow_empty_answer``, ``pattern``)."""
    options = {k: columns[k] for k in FORMAT_OPTIONS if k in columns}
    return [float(check_format(text, **options)) for text in normalize_completions(completions)]
