"""configs/vas.yaml scores as MMR1's released reward (issue 62, item 6): its format rule and its n-gram repetition
penalty, checked against re-implementations written here from LengSicong/MMR1
``verl/utils/reward_score/openr1_rewards_batch.py`` (``format_reward_batch``, ``get_repetition_penalty_reward``;
the yaml's ``compute_score: openr1_wo_LMM`` runs ``openr1_compute_score_batch_wo_LMM``, which adds both to the
accuracy), not from mmrl's code, on random completions with the edge cases: text between the blocks, a block not at
a line's start or end, two blocks, fewer words than the n-gram size, exactly that many, mixed case and whitespace."""

from __future__ import annotations

import random
import re

import pytest

from mmrl.config import load_run_config
from mmrl_common.errors import ConfigError
from rewards.format import check_format
from rewards.registry import CombinedReward, get_reward

# ---------------------------------------------------------------------------------------------------------------
# openr1_rewards_batch.py, re-implemented
# ---------------------------------------------------------------------------------------------------------------


def source_format(text: str) -> float:
    """format_reward_batch: one findall match of each pattern, MULTILINE and DOTALL."""
    flags = re.MULTILINE | re.DOTALL
    thinks = re.findall(r"^(\s*)<think>.*?</think>", text, flags)
    answers = re.findall(r"<answer>.*?</answer>(\s*)$", text, flags)
    return 1.0 if len(thinks) == 1 and len(answers) == 1 else 0.0


def source_repetition(text: str, ngram_size: int = 40, max_penalty: float = -0.5) -> float:
    """get_repetition_penalty_reward()'s inner function on one completion."""
    if text == "" or len(text.split()) < ngram_size:
        return 0.0
    words = text.lower().split()
    grams = list(zip(*[words[i:] for i in range(ngram_size)]))
    return (1 - len(set(grams)) / len(grams)) * max_penalty


# ---------------------------------------------------------------------------------------------------------------
# random completions
# ---------------------------------------------------------------------------------------------------------------

BITS = ["", " ", "\n", "  \n", "\n\n", "text", "so:", "\t"]


def _formatted(rng: random.Random) -> str:
    think = rng.choice(["<think>x</think>", "<think>a\nb</think>", "<think></think>", "<think>x", "think>x</think>"])
    answer = rng.choice(["<answer>B</answer>", "<answer>\\boxed{3}</answer>", "<answer>a\nb</answer>", "<answer>B",
                         "answer>B</answer>"])
    parts = [rng.choice(BITS), think, rng.choice(BITS), answer, rng.choice(BITS)]
    if rng.random() < 0.15:  # a second block of either kind, somewhere
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(["\n<think>y</think>", "<answer>C</answer>\n",
                                                                 "<think>y</think>"]))
    if rng.random() < 0.15:  # the blocks the other way round
        parts[1], parts[3] = parts[3], parts[1]
    return "".join(parts)


def _recipe(name: str) -> CombinedReward:
    cfg = load_run_config("vas")
    return CombinedReward([r for r in cfg.rewards if r.name == name])


def _component(name: str, texts: list[str]) -> list[float]:
    n = len(texts)
    columns = {"id": [f"s{i}" for i in range(n)], "problem_type": ["multiple_choice"] * n, "answer": ["B"] * n,
               "options": [["a", "b"]] * n}
    return _recipe(name).compute(texts, columns).components[name]


def test_the_recipe_s_format_is_mmr1_s_on_random_completions() -> None:
    rng = random.Random(0)
    texts = [_formatted(rng) for _ in range(3000)]
    want = [source_format(t) for t in texts]
    assert _component("format", texts) == want
    # the edge cases are there: text between the blocks (or after the answer's line) that the source accepts
    # and mmrl's think_answer rule rejects, and completions the source rejects
    between = [t for t, w in zip(texts, want) if w == 1.0 and not check_format(t, mode="think_answer")]
    assert len(between) > 100 and 0 < sum(want) < len(want)


@pytest.mark.parametrize(("text", "want"), [
    ("<think>x</think>\nSo the answer:\n<answer>B</answer>", 1.0),   # text between the blocks
    ("Let me see.\n<think>x</think><answer>B</answer>", 1.0),        # the think block starts a line
    ("Let me see. <think>x</think><answer>B</answer>", 0.0),         # ... not here
    ("<think>x</think><answer>B</answer>\nthat is all", 1.0),        # the answer ends a line
    ("<think>x</think><answer>B</answer> that is all", 0.0),
    ("<think>x</think>\n<think>y</think>\n<answer>B</answer>", 0.0),  # two think blocks at line starts
    ("<think>x</think><think>y</think>\n<answer>B</answer>", 1.0),   # the second is not at a line start
    ("<think>x</think><answer>B</answer>\n<answer>C</answer>", 0.0),
    ("  \n <think>x</think> <answer>B</answer>  \n ", 1.0),
])
def test_the_format_edge_cases(text: str, want: float) -> None:
    assert source_format(text) == want
    assert float(check_format(text, mode="mmr1")) == want


def _words(rng: random.Random) -> str:
    vocab = rng.choice([["the", "The", "THE", "a", "b"], [f"w{i}" for i in range(60)], ["step", "Step", "so", "x"]])
    n = rng.choice([0, 1, 39, 40, 41, 60, 120, 400])
    words = [rng.choice(vocab) for _ in range(n)]
    if words and rng.random() < 0.4:  # a loop: the same stretch again and again
        stretch = words[:rng.randint(1, 50)]
        words = (stretch * (n // len(stretch) + 1))[:n]
    return "".join(w + rng.choice([" ", "  ", "\n", "\t"]) for w in words).rstrip(rng.choice(["", " "]))


def test_the_recipe_s_repetition_penalty_is_mmr1_s_on_random_completions() -> None:
    rng = random.Random(1)
    texts = [_words(rng) for _ in range(600)] + ["", " ", "one " * 39, "one " * 40, "one " * 41]
    want = [source_repetition(t) for t in texts]
    assert _component("repetition_penalty", texts) == pytest.approx(want, abs=1e-12)
    assert min(want) < -0.45 and sum(w < 0 for w in want) > 50 and sum(w == 0 for w in want) > 50
    assert want[-3:] == [0.0, 0.0, pytest.approx(-0.25)]  # 40 words: one n-gram; 41 equal words: 2 n-grams, 1 distinct


def test_the_recipe_turns_both_on_as_the_code_sums_them() -> None:
    cfg = load_run_config("vas")
    got = {r.name: (r.weight, r.kwargs) for r in cfg.rewards}
    # openr1_compute_score_batch_wo_LMM: overall = accuracy + format + cosine length (0 in examples/mmr1.yaml)
    # + repetition penalty, each unweighted; get_repetition_penalty_reward() with its defaults 40 and -0.5
    assert got == {"accuracy": (1.0, {}), "format": (1.0, {"mode": "mmr1"}),
                   "repetition_penalty": (1.0, {"ngram_size": 40, "max_penalty": -0.5})}


@pytest.mark.parametrize(("kwargs", "message"), [({"ngram_size": 0}, "ngram_size"), ({"ngram_size": 2.5}, "ngram_size"),
                                                 ({"max_penalty": 0.5}, "max_penalty")])
def test_repetition_penalty_settings_are_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"{message} of repetition_penalty must be"):
        get_reward("repetition_penalty")(["a b c"], **kwargs)
