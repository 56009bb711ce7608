"""ACRE's answer consistency (arXiv 2510.10104): the cases, their values and the option-shuffling consistency,
as pure formulas. The reward ``acre`` and the evaluation check that ask the policy again live in
:mod:`mmrl.methods.acre` (they need the rollout service); what follows describes them.

After the policy answers a multiple-choice question (with its reasoning, when the prompt asks for one), the
options are shuffled and the **current policy answers again from the same reasoning trace**: the second
prompt is the first one with the options in the new order, and the assistant turn is forced to start with
``<think>TRACE</think><answer>`` (``<answer>`` alone when the completion has no reasoning or
``reuse_trace=False``). Its answer is a letter of the shuffled list and is mapped back to the original
lettering through the permutation. With ``c1``/``c2`` = first/second answer correct and ``agree`` = both
name the same option, five cases remain (``c1 and agree`` implies ``c2``):

================================  ==  ==  =====  =======
case                              c1  c2  agree  default
================================  ==  ==  =====  =======
``consistent_correct``            1   1   1      1.0
``correct_then_wrong``            1   0   0      0.5
``wrong_then_correct``            0   1   0      0.0
``consistent_wrong``              0   0   1      0.0
``inconsistent_wrong``            0   0   0      0.0
================================  ==  ==  =====  =======

plus ``unanswered`` (the first completion names no option: no second pass; default 0.0). A second answer
that names no option counts as a different, wrong option.

What the paper fixes and what it leaves open (its abstract, arXiv 2510.10104, and OpenReview reviews): the
full reward goes **only** to a rollout whose two answers are correct and agree, every other case gets "a lower
reward" through three consistency-shaping coefficients (Eq. 3, named alpha_1.., values not public). A rollout
whose trained (first) answer is wrong earns nothing for a lucky re-answer: ``wrong_then_correct`` defaults to
0 (a setting: an earlier mmrl placeholder was 0.25). ``correct_then_wrong`` = 0.5 (alpha_1) is a placeholder,
**not published: our choice**. Also not published, our choices: the second pass is greedy
(``greedy``) and gradient-free -- it is scored, not trained (``train_second_pass: false``). The switch,
``train_second_pass: true``, runs the re-answer as the episode's second turn instead (the ``acre_reanswer``
environment of :mod:`mmrl.methods.acre`, ``rollout.max_turns: 2``): sampled like the first turn and trained
with the episode's advantage.
Every value is a setting (``values: {case: value}``).

The reward ``acre`` (kwargs, all optional):

* ``values``: the case values above (a partial mapping overrides the defaults);
* ``mode``: ``replace`` (default: the reward is the case value, so it replaces the accuracy reward; keep
  ``accuracy`` in the config with weight 0 to log it) or ``add`` (accuracy of the first answer + value);
* ``exclude_identity``: never draw the unshuffled order (default ``False``: a uniform permutation, as the
  paper's reviewers say it allows);
* ``train_second_pass`` (default ``False``): see above;
* ``reuse_trace`` (default ``True``), ``greedy`` (default ``True``), ``max_new_tokens`` (of the second pass;
  default the service's evaluation length), ``shuffle_seed`` (default 0): one permutation per rollout, drawn
  from ``(shuffle_seed, step, sample id, rollout index)`` so a resumed run draws the same ones;
* ``think_tag`` / ``answer_tag`` (``think`` / ``answer``).

Samples that are not multiple choice (or have fewer than two options) get the plain accuracy. Logged per
step (``reward_metric/acre/...``): ``oscr`` (option-shuffling consistency rate: the share of answered
rollouts whose two answers agree), the share of each case, and ``shuffled_accuracy``.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from mmrl_common.errors import ConfigError
from rewards.answers import choice_letters, extract_answer, extract_choice

__all__ = [
    "CASES",
    "DEFAULT_VALUES",
    "case_shares",
    "consistency_case",
    "draw_permutation",
    "from_shuffled_letter",
    "inverse_permutation",
    "reasoning_trace",
    "resolve_values",
    "shuffle_options",
    "to_shuffled_letter",
]

CASES = ("consistent_correct", "correct_then_wrong", "wrong_then_correct", "consistent_wrong",
         "inconsistent_wrong")
UNANSWERED = "unanswered"
DEFAULT_VALUES: dict[str, float] = {"consistent_correct": 1.0, "correct_then_wrong": 0.5,
                                    "wrong_then_correct": 0.0, "consistent_wrong": 0.0,
                                    "inconsistent_wrong": 0.0, UNANSWERED: 0.0}
MODES = ("replace", "add")


# --------------------------------------------------------------------------------------------------------
# Permutations (perm[j] = the original index of the option shown in slot j)
# --------------------------------------------------------------------------------------------------------


def draw_permutation(n: int, rng: random.Random, *, exclude_identity: bool = False) -> list[int]:
    """A uniform permutation of ``range(n)``; with ``exclude_identity`` (and ``n >= 2``) never the identity
    (uniform over the other ``n! - 1``)."""
    perm = list(range(n))
    while True:
        rng.shuffle(perm)
        if not exclude_identity or n < 2 or perm != sorted(perm):
            return list(perm)


def shuffle_options(options: Sequence[Any], perm: Sequence[int]) -> list[Any]:
    """The options in the shuffled order: slot ``j`` shows ``options[perm[j]]``."""
    if sorted(perm) != list(range(len(options))):
        raise ValueError(f"{list(perm)} is not a permutation of the {len(options)} options")
    return [options[p] for p in perm]


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    """``inv`` with ``inv[perm[j]] == j``: the slot where each original option is shown."""
    inv = [0] * len(perm)
    for j, p in enumerate(perm):
        inv[p] = j
    return inv


def from_shuffled_letter(letter: str | None, perm: Sequence[int]) -> str | None:
    """The original letter of the option named ``letter`` in the shuffled list (None stays None)."""
    if letter is None:
        return None
    j = ord(letter) - ord("A")
    if not 0 <= j < len(perm):
        raise ValueError(f"letter {letter!r} is not one of the {len(perm)} shuffled options")
    return chr(ord("A") + perm[j])


def to_shuffled_letter(letter: str | None, perm: Sequence[int]) -> str | None:
    """The letter in the shuffled list of the option whose original letter is ``letter``."""
    if letter is None:
        return None
    return chr(ord("A") + inverse_permutation(perm)[ord(letter) - ord("A")])


# --------------------------------------------------------------------------------------------------------
# Cases and values
# --------------------------------------------------------------------------------------------------------


def consistency_case(first: str | None, second: str | None, gold: str) -> str:
    """The case of a first answer, a second answer (both in the original lettering) and the gold letter."""
    if first is None:
        return UNANSWERED
    c1, c2, agree = first == gold, second == gold, second is not None and second == first
    if c1:
        return "consistent_correct" if agree else "correct_then_wrong"
    if c2:
        return "wrong_then_correct"
    return "consistent_wrong" if agree else "inconsistent_wrong"


def resolve_values(values: Mapping[str, Any] | None) -> dict[str, float]:
    """The case values: the defaults, overridden by ``values``; a clear error for unknown cases."""
    out = dict(DEFAULT_VALUES)
    if values is None:
        return out
    if not isinstance(values, Mapping):
        raise ConfigError(f"acre reward: values must be a mapping of case -> number, got {values!r}")
    for k, v in values.items():
        if k not in out:
            raise ConfigError(f"acre reward: unknown case {k!r} in values; the cases are "
                              f"{', '.join(out)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"acre reward: values.{k} must be a number, got {v!r}")
        out[k] = float(v)
    return out


def case_shares(cases: Sequence[str]) -> dict[str, float]:
    """The share of each case among the answered ones (``unanswered`` shared over all)."""
    counts = Counter(cases)
    answered = sum(counts[c] for c in CASES)
    out = {c: counts[c] / answered if answered else 0.0 for c in CASES}
    out[UNANSWERED] = counts[UNANSWERED] / len(cases) if cases else 0.0
    return out


def oscr(cases: Sequence[str]) -> float | None:
    """Option-shuffling consistency rate: the share of answered questions whose two answers agree."""
    answered = [c for c in cases if c != UNANSWERED]
    if not answered:
        return None
    return sum(c in ("consistent_correct", "consistent_wrong") for c in answered) / len(answered)


# --------------------------------------------------------------------------------------------------------
# The second pass
# --------------------------------------------------------------------------------------------------------


def reasoning_trace(text: str, think_tag: str = "think") -> str | None:
    """The content of the completion's first ``<think>`` block (None when there is none)."""
    t = re.escape(think_tag)
    m = re.search(rf"<{t}>(.*?)</{t}>", text, re.DOTALL | re.IGNORECASE)
    return m.group(1) if m else None


def second_pass_prefix(text: str, *, reuse_trace: bool = True, think_tag: str = "think",
                       answer_tag: str = "answer") -> str:
    """The forced start of the second answer: the first completion's reasoning, then the answer tag."""
    trace = reasoning_trace(text, think_tag) if reuse_trace else None
    head = f"<{think_tag}>{trace}</{think_tag}>" if trace is not None else ""
    return f"{head}<{answer_tag}>"


def is_multiple_choice(sample: Any) -> bool:
    return getattr(sample, "problem_type", None) == "multiple_choice" and len(sample.options or []) >= 2


def first_answer(text: str, options: Sequence[Any], *, answer_tag: str = "answer",
                 think_tag: str = "think") -> str | None:
    """The option letter a completion names, read as the accuracy reward reads it."""
    return extract_choice(extract_answer(text, tag=answer_tag, think_tag=think_tag), list(options))


def rollout_rng(seed: int, step: int, sample_id: Any, index: int) -> random.Random:
    """The random stream of one rollout's permutation (a string seed hashes the same in every process)."""
    return random.Random(f"acre:{seed}:{step}:{sample_id}:{index}")


def letter_balance(predicted: Sequence[str | None], gold: Sequence[str]) -> dict[str, Any]:
    """How much the most frequent predicted letter is over- or under-used: its share among the
    predictions (``top_letter_share``), its share among the gold answers (``top_letter_gold_share``) and
    the absolute gap (``top_letter_gap``, 0 for a model whose favourite letter is as frequent as in the
    data). Shares are over every question (an unanswered one names no letter)."""
    n = len(gold)
    counts = Counter(p for p in predicted if p is not None)
    if not n or not counts:
        return {"top_letter": None, "top_letter_share": None, "top_letter_gold_share": None,
                "top_letter_gap": None, "letter_shares": {}}
    gold_counts = Counter(gold)
    top, k = max(sorted(counts.items()), key=lambda kv: kv[1])
    letters = choice_letters(num_options=max(ord(x) - 64 for x in [*counts, *gold_counts]))
    return {"top_letter": top, "top_letter_share": k / n, "top_letter_gold_share": gold_counts[top] / n,
            "top_letter_gap": abs(k - gold_counts[top]) / n,
            "letter_shares": {x: counts[x] / n for x in letters if counts[x]},
            "gold_letter_shares": {x: gold_counts[x] / n for x in letters if gold_counts[x]}}
