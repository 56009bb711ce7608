"""ARES's accuracy reward as its released code computes it (issue 62, item 7).

The reference below is written here from shawn0728/ARES ``examples/reward_function/aepo.py`` (the reward
``experiments/AEPO/config.yaml`` names: ``compute_score``): each response first loses the white space around
``<``, ``>`` and ``/`` (``re.sub``), then ``accuracy_reward`` reads the last ``\\boxed{}`` with mathruler's
``extract_boxed_content`` and scores 1.0 when mathruler's ``grade_answer(answer, ground_truth)`` holds, else 0.0.
mmrl's recipe (``configs/ares.yaml``: the accuracy reward with ``answer_from: boxed, grader: mathruler``) must
give the same number on every response: random ones (fixed seed) built from numbers, fractions, LaTeX, units,
letters, words, tuples, several boxes, boxes that never close, no box, empty ones. mmrl's declared differences
(configs/ares.yaml ``published:``, README: Methods, ARES) are tested apart: a multiple-choice answer in the gold
option's words, spans, several accepted answers.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from data_pipelines.schema import Sample
from mmrl.config import load_run_config
from mmrl.engine.evaluate import reward_columns
from mmrl_common.errors import ConfigError
from rewards import get_reward


def ares_accuracy(response: str, ground_truth: str) -> float:
    """aepo.py's accuracy of one response, as ``compute_score`` reaches it (no precomputed accuracy passed)."""
    from mathruler.grader import extract_boxed_content, grade_answer

    cleaned = re.sub(r"\s*(<|>|/)\s*", r"\1", response)  # compute_score, before format and accuracy
    return 1.0 if grade_answer(extract_boxed_content(cleaned), ground_truth) else 0.0


# gold answers, each with answers mathruler counts as the same and ones it does not
GOLDS: dict[str, list[str]] = {
    "3": ["3", "3.0", "03", "3.00", "4", "-3", "x=3", "3 cm"],
    "-2": ["-2", "- 2", "-2.0", "2"],
    "0.5": ["0.5", "\\frac{1}{2}", "1/2", "1 / 2", "\\dfrac12", ".5", "0.50", "2/4"],
    "\\frac{1}{2}": ["\\frac{1}{2}", "\\frac12", "0.5", "1/2", "\\tfrac{1}{2}", "\\frac{2}{4}", "\\frac{1}{3}"],
    "3/4": ["3/4", "3 / 4", "\\frac{3}{4}", "0.75", "6/8"],
    "1,000": ["1000", "1,000", "1 000", "10^3"],
    "\\sqrt{2}": ["\\sqrt{2}", "\\sqrt2", "2^{1/2}", "1.414", "sqrt(2)"],
    "2\\pi": ["2\\pi", "2 \\pi", "\\pi \\cdot 2", "6.28", "2pi"],
    "5 cm": ["5", "5 cm", "5\\text{ cm}", "5 centimeters", "50 mm"],
    "30^\\circ": ["30", "30^\\circ", "30^{\\circ}", "30 degrees", "\\frac{\\pi}{6}"],
    "50\\%": ["50", "50\\%", "50%", "0.5", "50 percent"],
    "B": ["B", "b", "(B)", "B.", "\\text{B}", "C", "B: red"],
    "red": ["red", "Red", "\\text{red}", "the red one", "blue"],
    "(1, 2)": ["(1, 2)", "(1,2)", "(2, 1)", "[1, 2]", "(1, 2, 3)"],
    "[0, 1)": ["[0, 1)", "[0,1)", "(0, 1)", "[0, 1]"],
    "x^2+1": ["x^2+1", "1+x^2", "x^{2}+1", "(x+1)^2", "x**2 + 1"],
    "x<3": ["x<3", "x < 3", "x <3", "3>x", "x\\le 3"],
    "\\text{yes}": ["yes", "Yes", "\\text{yes}", "no"],
    "None": ["None", "none", "0", ""],
    "": ["", "0", "None"],
    "10^{3}": ["1000", "10^3", "10^{3}", "1e3"],
}
NOISE = ["Let me think.", "We compute 1 / 2 and 3 < 4.", "First, the area is {2}.", "x = 7", "< think >hmm< /think >",
         "\\{1, 2\\}", "so \\frac{1}{2} > 0", ""]
TYPES = ["multiple_choice", "numeric", "open", "free_form", "yes_no", "ocr", "math"]  # math: a type of the user's


def random_response(rng: random.Random, answer: str, other: str) -> str:
    """A completion around ``answer`` in one of the forms a policy writes (or fails to)."""
    think = f"<think>{rng.choice(NOISE)} {rng.choice(NOISE)}</think>"
    form = rng.randrange(13)
    if form == 0:
        return f"{think} The answer is \\boxed{{{answer}}}."
    if form == 1:  # the tags with spaces, as aepo.py's re.sub expects of some models
        return f"< think > {rng.choice(NOISE)} < /think > \\boxed{{ {answer} }}"
    if form == 2:  # two boxes: the last one counts
        return f"{think} maybe \\boxed{{{other}}}, no: \\boxed{{{answer}}}"
    if form == 3:
        return f"{think} \\boxed{{{answer}}} or \\boxed{{{other}}}"
    if form == 4:  # the last box never closes
        return f"{think} \\boxed{{{answer}}} then \\boxed{{{other}"
    if form == 5:  # no box
        return f"{think} <answer>{answer}</answer>"
    if form == 6:
        return f"{think} \\boxed{{}}"
    if form == 7:  # a space before the brace: not a box to mathruler
        return f"{think} \\boxed {{{answer}}}"
    if form == 8:  # braces inside the box
        return f"{think} \\boxed{{{{{answer}}}}}"
    if form == 9:  # spaces around the slashes and angle brackets inside the box
        return f"{think} \\boxed{{{answer.replace('/', ' / ').replace('<', ' < ')}}}"
    if form == 10:
        return ""
    if form == 11:  # text after the box, and a box in the thinking
        return f"<think>maybe \\boxed{{{other}}}</think> so \\boxed{{{answer}}} is final </answer>"
    return f"{think}\n\\[\\boxed{{\\text{{{answer}}}}}\\]"


def random_cases(seed: int, n: int) -> tuple[list[str], list[str], list[str]]:
    rng = random.Random(seed)
    golds = list(GOLDS)
    responses, answers, types = [], [], []
    for _ in range(n):
        gold = rng.choice(golds)
        answer = rng.choice(GOLDS[gold]) if rng.random() < 0.8 else rng.choice(GOLDS[rng.choice(golds)])
        other = rng.choice(GOLDS[rng.choice(golds)])
        responses.append(random_response(rng, answer, other))
        answers.append(gold)
        types.append(rng.choice(TYPES))
    return responses, answers, types


def recipe_accuracy_kwargs() -> dict:
    (spec,) = [r for r in load_run_config("ares").rewards if r.name == "accuracy"]
    return dict(spec.kwargs)


def test_the_ares_recipe_grades_with_mathruler_as_aepo_py_on_random_responses() -> None:
    responses, answers, types = random_cases(seed=62, n=400)
    expected = [ares_accuracy(r, g) for r, g in zip(responses, answers)]
    got = get_reward("accuracy")(responses, problem_type=types, answer=answers, options=[None] * len(answers),
                                 **recipe_accuracy_kwargs())
    wrong = [(r, g, e, s) for r, g, e, s in zip(responses, answers, expected, got) if e != s]
    assert not wrong, f"{len(wrong)} of {len(responses)} differ from aepo.py, e.g. {wrong[:3]}"
    # not a test that passes on anything: both outcomes occur often
    assert 0.2 < sum(expected) / len(expected) < 0.8, sum(expected)


def test_the_edge_cases_grade_as_aepo_py() -> None:
    """Spelled out: each is a rule of mathruler or of aepo.py that mmrl's other readers do not share."""
    cases = [
        ("\\boxed{1} and \\boxed{2", "None"),  # the last box never closes: "None", which "None" grades equal
        ("\\boxed{1} and \\boxed{2", "1"),  # (mmrl's own reader would fall back to the closed box)
        ("no box at all", "None"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{2/4}", "1/2"),  # unreduced fractions do not count
        ("\\boxed{3.0}", "3"),
        ("\\boxed{1 / 2}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # an escaped brace counts as a brace to extract_boxed_content
        ("\\boxed{5 cm}", "5"),
        ("\\boxed{B}", "b"),
        ("\\boxed {3}", "3"),
        ("", ""),
    ]
    responses = [r for r, _ in cases]
    answers = [g for _, g in cases]
    got = get_reward("accuracy")(responses, problem_type=["numeric"] * len(cases), answer=answers,
                                 **recipe_accuracy_kwargs())
    assert got == [ares_accuracy(r, g) for r, g in cases]
    assert got[:4] == [1.0, 0.0, 1.0, 1.0] and got[4] == 0.0 and got[5] == 1.0


def test_a_multiple_choice_answer_passes_as_the_letter_or_the_options_words() -> None:
    """mmrl's declared difference: the gold option's text passes too (ARES's questions hold their options in the
    text, with a letter for the answer; the toy base model answers in words: configs/ares.yaml sft.mc_answer), so
    the recipe's cold-start targets on the toy world score 1."""
    from mmrl.engine.sft import reasoning_target

    sample = Sample(id="t1", problem_type="multiple_choice", question="Which colour flashes first?",
                    options=["red", "green", "blue", "yellow"], answer="A", meta={"rationale": "The first is red."})
    kwargs = recipe_accuracy_kwargs()
    texts = ["<think>red first</think> \\boxed{red}", "\\boxed{A}", "\\boxed{(A)}", "\\boxed{Red}", "\\boxed{green}",
             "\\boxed{B}", "<answer>red</answer>"]
    got = get_reward("accuracy")(texts, **reward_columns([sample] * len(texts)), **kwargs)
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [ares_accuracy(t, "A") for t in texts] == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # ARES: the letter only
    labelled = replace(sample, options=["A. red", "B. green", "C. blue"], answer="C")
    texts = ["\\boxed{blue}", "\\boxed{C. blue}", "\\boxed{C}", "\\boxed{B. green}"]
    got = get_reward("accuracy")(texts, **reward_columns([labelled] * len(texts)), **kwargs)
    assert got == [1.0, 1.0, 1.0, 0.0]  # options written with their label: the words, or the option as written
    cfg = load_run_config("ares")
    rng = random.Random(0)
    targets = [reasoning_target(sample, rng, mode, cfg.prompt.template) for mode in ("option", "letter")]
    assert get_reward("accuracy")(targets, **reward_columns([sample] * 2), **kwargs) == [1.0, 1.0]


def test_spans_keep_their_iou_and_any_accepted_answer_passes() -> None:
    """What ARES never grades: a temporal_grounding span keeps its IoU (our choice), and a sample with several
    accepted answers passes on any of them (ARES has one answer string)."""
    acc = get_reward("accuracy")
    kwargs = recipe_accuracy_kwargs()
    span = acc(["<think>t</think> \\boxed{[1.0, 3.0]}"], problem_type=["temporal_grounding"],
               answer=[[1.0, 2.0]], **kwargs)
    assert span == [pytest.approx(0.5)]
    several = acc(["\\boxed{0.5}", "\\boxed{0.25}"], problem_type=["numeric"] * 2,
                  answer=[["\\frac{1}{3}", "1/2"], ["\\frac{1}{3}", "1/2"]], **kwargs)
    assert several == [1.0, 0.0]


def test_the_grader_setting_is_checked() -> None:
    acc = get_reward("accuracy")
    with pytest.raises(ConfigError, match="answer_from: boxed"):
        acc(["\\boxed{1}"], problem_type=["numeric"], answer=["1"], grader="mathruler")
    with pytest.raises(ConfigError, match="grader must be one of problem_type, mathruler"):
        acc(["\\boxed{1}"], problem_type=["numeric"], answer=["1"], answer_from="boxed", grader="sympy")
    # other recipes score as before: without the setting, the problem type's scorer (0.5 is not 1/2 to mathruler's
    # fraction rule, but is to the numeric scorer)
    assert acc(["\\boxed{2/4}"], problem_type=["numeric"], answer=["0.5"], answer_from="boxed") == [1.0]
    assert acc(["\\boxed{2/4}"], problem_type=["numeric"], answer=["1/2"], answer_from="boxed",
               grader="mathruler") == [0.0]
