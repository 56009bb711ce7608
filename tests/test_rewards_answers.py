"""Hand-written cases for the shared answer extractors (rewards/answers.py)."""

import math

import pytest

from rewards.answers import (
    choice_letters,
    extract_answer,
    extract_choice,
    extract_yes_no,
    normalize_gold_choice,
    normalize_gold_number,
    normalize_gold_span,
    normalize_gold_yes_no,
    normalize_text,
    parse_number,
    parse_span,
    text_tokens,
)

OPTS4 = ["red circle", "blue square", "green triangle", "yellow star"]
OPTS3 = ["left", "right", "up"]

# --------------------------------------------------------------------------------------------------------
# extract_answer
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>hmm</think><answer> B </answer>", "B"),
        ("<answer>A</answer> then <answer>C</answer>", "C"),  # last block wins
        ("<think>x</think>\n<ANSWER>yes</ANSWER>", "yes"),  # tags are case-insensitive
        ("<think>long</think> <answer>truncated text", "truncated text"),  # unclosed answer block
        ("<think>reasoning about B</think> C", "C"),  # fallback strips the think block
        ("reasoning about B</think> C", "C"),  # lone closing think (template opened it)
        ("C <think>never closed B", "C"),  # unclosed think: drop everything after it
        ("just text", "just text"),
        ("", ""),
        (None, ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_custom_tags_and_fallbacks():
    text = "<reasoning>r</reasoning><final>42</final><answer>7</answer>"
    assert extract_answer(text, tag="final") == "42"
    assert extract_answer("<r>B</r> A", think_tag="r") == "A"
    assert extract_answer("<think>t</think> A", fallback="whole") == "<think>t</think> A"
    assert extract_answer("<think>t</think> A", fallback="none") == ""
    with pytest.raises(ValueError):
        extract_answer("x", fallback="bogus")


# --------------------------------------------------------------------------------------------------------
# multiple choice
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("B", "B"),
        ("b", "B"),
        ("(B)", "B"),
        ("[C]", "C"),
        ("B.", "B"),
        ("B:", "B"),
        (" B ", "B"),
        ("B) blue square", "B"),
        ("B. blue square", "B"),
        ("(B) blue square", "B"),
        ("B blue square", "B"),
        ("Answer: B", "B"),
        ("answer: b", "B"),
        ("The answer is B", "B"),
        ("the answer is B.", "B"),
        ("The best answer is (D)", "D"),
        ("The correct option is C", "C"),
        ("Therefore, the final answer is: C", "C"),
        ("Option C", "C"),
        ("**C**", "C"),
        ("\\boxed{C}", "C"),
        ("blue square", "B"),  # exact option text
        ("Blue Square.", "B"),
        ("the blue square", "B"),  # articles do not matter for text matching
        ("I think it is C", "C"),  # pronoun "I" is not option I (nor a letter at all here)
        ("A is correct", "A"),
        ("A", "A"),
        ("a", "A"),  # a lone letter is a letter
        ("(a)", "A"),
        ("The answer is A.", "A"),
        ("The answer is B. Wait, no: the answer is C.", "C"),  # last explicit answer wins
        ("It moves left, so D", "D"),
    ],
)
def test_extract_choice_accepts(text, expected):
    assert extract_choice(text, OPTS4) == expected


@pytest.mark.parametrize(
    "text",
    [
        "There is a red circle",  # "a" in prose is never option A
        "A red circle is visible in the frame",  # nor the capitalised article
        "a big shape moves across",
        "The answer is a square",  # article after an answer phrase
        "B, C",  # two different letters
        "B or C",
        "A or B",  # upper-case A joined to another letter is a letter -> ambiguous
        "The answer is B or C",
        "B. C.",
        "(A) and (C)",
        "I am not sure",
        "",
        "   ",
        "none of these",
        "E",  # outside A-D
        "The answer is F",
        "B and D are both plausible",
    ],
)
def test_extract_choice_rejects(text):
    assert extract_choice(text, OPTS4) is None


def test_letters_are_restricted_to_the_sample_options():
    assert extract_choice("C", OPTS3) == "C"
    assert extract_choice("D", OPTS3) is None
    assert extract_choice("E", OPTS3) is None
    assert extract_choice("The answer is E", OPTS3) is None
    assert extract_choice("(D)", OPTS3) is None
    assert extract_choice("D", num_options=4) == "D"
    assert choice_letters(OPTS3) == "ABC"
    assert choice_letters() == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    with pytest.raises(ValueError):
        choice_letters(num_options=0)


def test_a_in_prose_is_never_option_a_even_when_it_is_valid():
    # 'A' is a valid letter here, and the sentence mentions no other letter.
    for text in ["a red circle is shown", "There is a dog", "A dog runs", "it is a circle, I think"]:
        assert extract_choice(text, ["dog", "cat", "bird"]) is None, text


def test_options_that_carry_their_labels():
    opts = ["A. red circle", "B. blue square", "C. green triangle"]
    assert extract_choice("blue square", opts) == "B"
    assert extract_choice("B. blue square", opts) == "B"
    assert extract_choice("red circle", opts) == "A"


def test_leading_letter_whose_option_text_names_another_letter():
    opts = ["moves toward B", "moves toward C"]
    assert extract_choice("A) moves toward B", opts) == "A"
    assert extract_choice("A) but maybe B", opts) is None


def test_long_prose_counts_only_a_final_letter():
    long = "Looking at the video carefully the ball rolls from point B and then it stops near the wall"
    assert extract_choice(long, OPTS4) is None
    assert extract_choice(long + " so C", OPTS4) == "C"


def test_options_as_letter_mapping():
    opts = {"B": "dog", "A": "cat", "C": "owl"}
    assert extract_choice("dog", opts) == "B"
    assert extract_choice("D", opts) is None
    assert normalize_gold_choice("owl", opts) == "C"
    with pytest.raises(ValueError, match="option keys"):
        extract_choice("A", {"A": "cat", "C": "owl"})
    with pytest.raises(TypeError, match="list of option texts"):
        extract_choice("A", "cat")


def test_duplicate_option_texts_are_ambiguous():
    assert extract_choice("red", ["red", "red", "blue"]) is None


def test_normalize_gold_choice():
    assert normalize_gold_choice("B", OPTS4) == "B"
    assert normalize_gold_choice("(c)", OPTS4) == "C"
    assert normalize_gold_choice("yellow star", OPTS4) == "D"
    with pytest.raises(ValueError, match="not an option letter"):
        normalize_gold_choice("E", OPTS4)
    with pytest.raises(ValueError):
        normalize_gold_choice(2, OPTS4)


# --------------------------------------------------------------------------------------------------------
# yes / no
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("yes", "yes"),
        ("Yes.", "yes"),
        ("YES, the ball is red", "yes"),
        ("No", "no"),
        ("no, it is not", "no"),
        ("True", "yes"),
        ("false", "no"),
        ("Answer: no", "no"),
        ("The answer is yes.", "yes"),
        ("I believe the answer is no", "no"),
        ("I think yes", "yes"),
        ("**No**", "no"),
        ("yes and no", None),
        ("Yes or no", None),
        ("yes/no", None),
        ("maybe", None),
        ("", None),
        ("I cannot tell whether yes or no is right", None),
        ("nothing", None),  # "no" as a prefix of a word is not "no"
        ("yesterday it rained", None),
    ],
)
def test_extract_yes_no(text, expected):
    assert extract_yes_no(text) == expected


def test_normalize_gold_yes_no():
    assert normalize_gold_yes_no(True) == "yes"
    assert normalize_gold_yes_no("No") == "no"
    with pytest.raises(ValueError):
        normalize_gold_yes_no("perhaps")


# --------------------------------------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", 42.0),
        ("-3", -3.0),
        ("\u22123", -3.0),  # unicode minus
        ("+7", 7.0),
        ("3.14", 3.14),
        (".5", 0.5),
        ("1,234", 1234.0),
        ("1,234,567.5", 1234567.5),
        ("3/4", 0.75),
        ("-1/2", -0.5),
        ("45%", 45.0),
        ("45 percent", 45.0),
        ("1e3", 1000.0),
        ("three", 3.0),
        ("Twenty-one", 21.0),
        ("twelve apples", 12.0),
        ("one hundred", 100.0),
        ("There are 3 cats", 3.0),
        ("3 (three)", 3.0),
        ("3.0 and 3", 3.0),  # equal values are not ambiguous
        ("I counted 2 then 4, so the answer is 5", 5.0),
        ("total: 7 after 3 and 4", 7.0),
        ("$12", 12.0),
        ("\\boxed{12}", 12.0),
        ("3rd", 3.0),
        (7, 7.0),
        (2.5, 2.5),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "no idea", "3 or 4", "3-5", "between 2 and 6", "1/0", True, float("nan")]
)
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_parse_number_percent_as_fraction():
    assert parse_number("45%", percent="fraction") == pytest.approx(0.45)
    with pytest.raises(ValueError):
        parse_number("1", percent="ratio")


def test_parse_number_never_evaluates_expressions():
    # An expression is not computed: "2+3" is two numbers, so ambiguous; "__import__" is no number.
    assert parse_number("2+3") is None
    assert parse_number("__import__('os').getcwd()") is None


@pytest.mark.parametrize(
    "text, expected",
    [  # LaTeX numbers, read through math-verify (issue 50)
        (r"\frac{1}{2}", 0.5),
        (r"\dfrac{3}{4}", 0.75),
        (r"-\frac{1}{2}", -0.5),
        (r"\sqrt{2}", math.sqrt(2)),
        (r"\frac{\sqrt{3}}{2}", math.sqrt(3) / 2),
        (r"2\sqrt{3}", 2 * math.sqrt(3)),
        (r"2^{10}", 1024.0),
        (r"1.5 \times 10^{3}", 1500.0),
        (r"\boxed{\frac{1}{2}}", 0.5),
        (r"$\frac{1}{2}$", 0.5),
        (r"x = \frac{1}{2}", 0.5),
        (r"45\%", 45.0),
        (r"30^\circ", 30.0),  # a command math-verify is not asked about: read as before
    ],
)
def test_parse_number_reads_latex(text, expected):
    assert parse_number(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", [r"\sqrt{-1}", r"\frac{a}{b}", r"\frac{1}{2}, \frac{1}{3}", r"\frac{1}{0}", r"10^{10^{10^{10}}}"]
)
def test_parse_number_rejects_latex_that_is_not_one_real_number(text):
    assert parse_number(text) is None


def test_latex_percent_and_gold():
    assert parse_number(r"45\%", percent="fraction") == pytest.approx(0.45)
    assert normalize_gold_number(r"\frac{1}{4}") == pytest.approx(0.25)


def test_normalize_gold_number():
    assert normalize_gold_number("1,000") == 1000.0
    assert normalize_gold_number(5) == 5.0
    with pytest.raises(ValueError):
        normalize_gold_number("many")


# --------------------------------------------------------------------------------------------------------
# spans
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[1.5, 3.0]", (1.5, 3.0)),
        ("(1.5, 3)", (1.5, 3.0)),
        ("1.5-3.0 seconds", (1.5, 3.0)),
        ("1.5 - 3.0", (1.5, 3.0)),
        ("1.5\u20133.0s", (1.5, 3.0)),
        ("from 1.5s to 3s", (1.5, 3.0)),
        ("From 1.5 seconds to 3 seconds.", (1.5, 3.0)),
        ("between 2 and 4.25 sec", (2.0, 4.25)),
        ("12.54 to 17.83", (12.54, 17.83)),
        ("00:01:05 - 00:01:10", (65.0, 70.0)),
        ("1:05 to 1:10", (65.0, 70.0)),
        ('{"start_time": "12.3", "end_time": "18.0"}', (12.3, 18.0)),
        ("{start: 2, end: 5}", (2.0, 5.0)),
        ("first 1 to 2, then 5 to 7", (5.0, 7.0)),  # the last span wins
        ([1, 2], (1.0, 2.0)),
        ((0.5, 0.5), (0.5, 0.5)),
        ({"start": 1, "end": 4}, (1.0, 4.0)),
    ],
)
def test_parse_span(text, expected):
    got = parse_span(text)
    assert got is not None
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "at 3 seconds", "3 to 1", "[5, 2]", [3, 1], [1], "soon", [1, "x"]])
def test_parse_span_rejects(text):
    assert parse_span(text) is None


def test_normalize_gold_span():
    assert normalize_gold_span([0, 2]) == (0.0, 2.0)
    with pytest.raises(ValueError, match="span"):
        normalize_gold_span("whenever")


# --------------------------------------------------------------------------------------------------------
# text normalisation
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Red, circle!", "red circle"),
        ("A cat and an owl", "cat and owl"),
        ("Don't stop", "dont stop"),
        ("It costs 3.5 dollars", "it costs 3.5 dollars"),
        ("well-known", "well known"),
        ("  ", ""),
        (None, ""),
    ],
)
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


def test_text_tokens_keep_articles_on_request():
    assert text_tokens("The cat", remove_articles=False) == ["the", "cat"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A. blue square", "A"),  # the label, not the option whose text follows (an old bug)
        ("(A) blue square", "A"),
        ("A) blue square", "A"),
        ("B. The square is blue, while option A is a circle.", "B"),  # a label wins over later letters
        ("B is correct because A is red.", "B"),
        ("B\nExplanation: the square is blue; (A) is red.", "B"),
        ("A\nthe red one, I think", "A"),  # a letter alone on the first line
        ("(B. The square is blue, not A", "B"),  # MVBench's "Best option:(" pre-fill leaves "(" unmatched
        ("B, because A is red", "B"),  # a comma before an explanation, not a list of letters
        ("B, C or D", None),
        ("C) but perhaps D", None),  # a hedge names two letters
        ("I would say B", "B"),  # the pronoun "I" before a modal verb
        ("A red circle", "A"),  # "A" followed by exactly option A's text
        ("A blue square", "B"),  # the article before option B's text
    ],
)
def test_extract_choice_leading_labels(text, expected):
    assert extract_choice(text, OPTS4) == expected


def test_option_texts_that_start_with_a_capital_letter_are_not_labels():
    opts = ["T cell", "B cell", "NK cell"]
    assert extract_choice("B cell", opts) == "B"
    assert extract_choice("T cell", opts) == "A"
    assert extract_choice("B. T cell", opts) == "B"  # with a delimiter the label decides
    assert extract_choice("B because T cells are not shown", opts) == "B"
