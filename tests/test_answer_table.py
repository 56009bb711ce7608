"""How mmrl reads multiple-choice answers, next to how the official scorers read them.

Each row: a completion, the question's options, the letter the **official scorer** reads (``None``: nothing),
which scorer that is, and — only where mmrl deliberately differs — mmrl's letter and why. The official
column was written from the scorers' rules, not from mmrl's output:

* ``videomme`` — Video-MME ``evaluation/eval_your_results.py`` (MME-Benchmarks/Video-MME @4e7566d): strip the
  answer prefixes (case-sensitive; two list entries are joined by a missing comma), nothing from an answer of
  more than 10 words without a capital A-D, else the first capital A-D anywhere. Checked below by an
  independent re-implementation, on the raw completion (the official scorer sees no ``<think>`` handling).
* ``mvbench`` — MVBench's notebook ``check_ans`` (OpenGVLab/Ask-Anything ``video_chat2/mvbench.ipynb``) after
  the ``Best option:(`` pre-fill: ``"(" +`` the first line of the generation, lower-cased, its first
  space-separated token compared by substring with ``"(x)"``. The completion is the generation after the
  pre-fill. Checked below by a re-implementation; mmrl is checked on both the completion and on
  ``"(" +`` its first line (what ``mmrl.benchmarks.scoring.response_text`` passes on).
* ``lmms`` — lmms-eval's shared ``_task_utils/mcq_extract.extract_mcq_answer`` (HEAD 75571cf, used by its
  Video-MME task since 2026) with the question's letters as choices, after lmms-eval's pipeline has removed
  ``<think>`` blocks: priority start > end > answer phrase > "(X)" > "X." > "X:" > "X)" > "X " > anywhere,
  the last occurrence within a format; case-sensitive.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest

from rewards.answers import extract_answer, extract_choice

COLORS = ["red", "blue", "green", "yellow"]
SHAPES = ["red circle", "blue square", "green triangle", "yellow star"]
VMME = [
    "A. A man is cooking.",
    "B. A woman is reading a book.",
    "C. Two dogs are playing.",
    "D. A child is sleeping.",
]
SIDES = ["left", "right"]
PETS = ["dog", "cat", "bird"]
COUNTS = ["one", "two", "three", "four", "five"]
DIRS = ["north", "south", "east", "west", "up", "down"]

_SAME = object()


class Row(NamedTuple):
    text: str
    options: list[str]
    official: str | None
    scorer: str
    mmrl: object = _SAME  # mmrl's letter where it deliberately differs from the official one
    why: str = ""

    @property
    def expected(self) -> str | None:
        return self.official if self.mmrl is _SAME else self.mmrl  # type: ignore[return-value]


LOWER = "lower-case letters count in mmrl; the official regex is case-sensitive"
ARTICLE = "a capital 'A' before an ordinary word is the article in mmrl; the official regex reads option A"

TABLE: list[Row] = [
    # bare letters, brackets, delimiters
    Row("B", COLORS, "B", "videomme"),
    Row("D", COLORS, "D", "videomme"),
    Row("A", COLORS, "A", "videomme"),
    Row("C.", COLORS, "C", "videomme"),
    Row("  B  \n", COLORS, "B", "videomme"),
    Row("(B)", COLORS, "B", "videomme"),
    Row("[C]", COLORS, "C", "videomme"),
    Row("(D) yellow", COLORS, "D", "videomme"),
    Row("C: green", COLORS, "C", "videomme"),
    Row("D - yellow", COLORS, "D", "videomme"),
    Row("B, blue", COLORS, "B", "videomme"),
    Row("B) blue", COLORS, "B", "mvbench"),
    Row("D", COLORS, "D", "mvbench"),
    # issue, defect 1: the letter A with a delimiter is option A, not the option whose text follows
    Row("A. blue", COLORS, "A", "videomme"),
    Row("(A) blue", COLORS, "A", "videomme"),
    Row("A) blue", COLORS, "A", "videomme"),
    Row("A) blue", COLORS, "A", "mvbench"),
    Row("A. blue", COLORS, "A", "lmms"),
    # issue, defect 2: a leading label wins over other letters in the explanation
    Row("B. The cup is blue, while option A is red.", COLORS, "B", "videomme"),
    Row("B is correct because A is red.", COLORS, "B", "videomme"),
    Row("B\nExplanation: ... (A)", COLORS, "B", "videomme"),
    Row("B\nExplanation: the cup is blue; red is (A).", COLORS, "B", "videomme"),
    Row("B is correct because A is red.", COLORS, "B", "lmms"),
    Row("B. The cup is blue, while option A is red.", COLORS, "B", "lmms"),
    Row("B. The cup is blue, while option A is red.", COLORS, "B", "mvbench"),
    Row("[C] green, because A and B are warm colours.", COLORS, "C", "videomme"),
    Row("C: green. A is red and B is blue.", COLORS, "C", "videomme"),
    Row("D - yellow, not A.", COLORS, "D", "lmms"),
    Row("C because B is blue and A is red", COLORS, "C", "mvbench"),
    Row("(B) blue; (A) is red and (C) is green.", COLORS, "B", "videomme"),
    Row("D. Yellow. Options A, B and C show other colours.", COLORS, "D", "videomme"),
    # answer phrases and prefixes
    Row("The answer is B", COLORS, "B", "videomme"),
    Row("The best answer is C.", COLORS, "C", "videomme"),
    Row("The correct answer is (D) yellow", COLORS, "D", "videomme"),
    Row("the correct option is D", COLORS, "D", "videomme"),
    Row("The best answer is: A. red", COLORS, "A", "videomme"),
    Row("Answer: (C)", COLORS, "C", "lmms"),
    Row(
        "Answer: C",
        COLORS,
        "A",
        "videomme",
        "C",
        "the official prefixes lack 'Answer:'; its regex reads the A of 'Answer'",
    ),
    Row("Best option: (C)", COLORS, "C", "lmms"),
    Row("Therefore, the final answer is: C", COLORS, "C", "lmms"),
    Row("Therefore, the final answer is: C", COLORS, "C", "videomme"),
    Row("I think it is B", COLORS, "B", "videomme"),
    Row("I would say D", COLORS, "D", "videomme"),
    Row("The answer is B. Wait, no: the answer is C.", COLORS, "C", "lmms"),
    Row("Option C", COLORS, "C", "videomme"),
    Row("My answer is D.", COLORS, "D", "lmms"),
    Row("The correct option is (B) blue.", COLORS, "B", "lmms"),
    Row("It moves left, so D", COLORS, "D", "videomme"),
    # multi-line answers
    Row("C\n\nThe ball rolls to the left, so A and B are wrong.", COLORS, "C", "videomme"),
    Row("A\nthe cup is red, so this one.", COLORS, "A", "videomme"),
    Row("B\nA is red, so not A.", COLORS, "B", "mvbench"),
    Row("Answer:\nB", COLORS, "B", "lmms"),
    Row("Let me look at the colours.\nThe cup is blue.\nAnswer: B", COLORS, "B", "lmms"),
    # markdown bold
    Row("**B**", COLORS, "B", "videomme"),
    Row("**C.** green", COLORS, "C", "videomme"),
    Row("The answer is **D**.", COLORS, "D", "videomme"),
    # lower-case and full-width letters
    Row("b", COLORS, None, "videomme", "B", LOWER),
    Row("c) green", COLORS, "C", "mvbench"),
    Row("\uff22", COLORS, None, "videomme", "B", "full-width letters are read after NFKC in mmrl"),
    # option text, alone and with its label
    Row("blue", COLORS, None, "videomme", "B", "the exact text of one option names that option in mmrl"),
    Row("B. blue", COLORS, "B", "videomme"),
    Row("C. Two dogs are playing.", VMME, "C", "videomme"),
    Row("A. A man is cooking.", VMME, "A", "videomme"),
    Row(
        "A woman is reading a book.",
        VMME,
        "A",
        "videomme",
        "B",
        ARTICLE + " (Video-MME options start with 'A')",
    ),
    # the article "A" and the pronoun "I"
    Row("A red circle", SHAPES, "A", "videomme"),
    Row("A blue square", SHAPES, "A", "videomme", "B", ARTICLE),
    Row("A red circle is visible in the frame", SHAPES, "A", "videomme", None, ARTICLE),
    Row("There is a red circle", SHAPES, None, "videomme"),
    Row("I think the red circle, so A.", SHAPES, "A", "videomme"),
    # ambiguity
    Row("A or B", COLORS, "A", "videomme", None, "two letters joined by 'or' are ambiguous in mmrl"),
    # letters outside the options, empty and long answers
    Row("E", COLORS, None, "videomme"),
    Row("The answer is E", COLORS, None, "videomme"),
    Row("E. blue", COLORS, None, "videomme"),
    Row("C", SIDES, None, "lmms"),
    Row("F", COUNTS, None, "lmms"),
    Row("G. down", DIRS, None, "lmms"),
    Row("", COLORS, None, "videomme"),
    Row("   ", COLORS, None, "videomme"),
    Row("The video shows a man walking down a long street at night in the rain", COLORS, None, "videomme"),
    # 2, 3, 5 and 6 options
    Row("B", SIDES, "B", "lmms"),
    Row("B) right", SIDES, "B", "mvbench"),
    Row("A. right", SIDES, "A", "lmms"),
    Row("The answer is B.", SIDES, "B", "lmms"),
    Row("C) bird", PETS, "C", "mvbench"),
    Row("(A) dog", PETS, "A", "lmms"),
    Row("E", COUNTS, "E", "lmms"),
    Row("E) five", COUNTS, "E", "mvbench"),
    Row("E. five, since D shows only four.", COUNTS, "E", "lmms"),
    Row("D is correct because C has three.", COUNTS, "D", "mvbench"),
    Row("The best answer is E", COUNTS, "E", "lmms"),
    Row("F", DIRS, "F", "lmms"),
    Row("F) down", DIRS, "F", "mvbench"),
    Row("(E) up", DIRS, "E", "lmms"),
    Row("F is correct because E points up.", DIRS, "F", "lmms"),
    # <answer> / <think> (mmrl applies extract_answer first, as its evaluator does)
    Row("<answer>C</answer>", COLORS, "C", "videomme"),
    Row("<think>A is red, C is green.</think><answer>B</answer>", COLORS, "B", "lmms"),
    Row("<think>\nThe cup is blue.\n</think>\nB. blue", COLORS, "B", "lmms"),
    Row(
        "<think>A is red, so not A.</think>\n<answer>B</answer>",
        COLORS,
        "A",
        "videomme",
        "B",
        "mmrl reads the answer block, not the reasoning; the official regex reads the raw text",
    ),
]

ISSUE_CASES = {
    ("A. blue", "A"),
    ("(A) blue", "A"),
    ("A) blue", "A"),
    ("B. The cup is blue, while option A is red.", "B"),
    ("B is correct because A is red.", "B"),
    ("B\nExplanation: ... (A)", "B"),
}


def _id(row: Row) -> str:
    return f"{row.scorer}-{len(row.options)}-{row.text[:40]!r}"


@pytest.mark.parametrize("row", TABLE, ids=_id)
def test_mmrl_reads_the_table(row: Row) -> None:
    assert extract_choice(extract_answer(row.text), row.options) == row.expected
    if row.scorer == "mvbench":
        # with the pre-fill, mmrl's evaluator reads "(" + the first line of the generation
        prefixed = "(" + row.text.split("\n")[0]
        assert extract_choice(extract_answer(prefixed), row.options) == row.expected


def test_table_shape_and_issue_cases() -> None:
    assert len(TABLE) >= 60
    counts = {len(r.options) for r in TABLE}
    assert len(counts & {2, 3, 4, 5, 6}) >= 2 and {2, 5, 6} <= counts
    assert {r.scorer for r in TABLE} == {"videomme", "mvbench", "lmms"}
    for text, letter in ISSUE_CASES:
        rows = [r for r in TABLE if r.text == text and r.options == COLORS]
        assert rows, text
        assert all(r.official == letter and r.expected == letter for r in rows), text
    divergent = [r for r in TABLE if r.mmrl is not _SAME]
    assert all(r.why for r in divergent)
    assert not any(r.why for r in TABLE if r.mmrl is _SAME)
    assert len(divergent) <= len(TABLE) // 8


# --------------------------------------------------------------------------------------------------------
# Independent re-implementations of the official rules, to check the table's "official" column
# --------------------------------------------------------------------------------------------------------

# Video-MME's list, including its two entries that a missing comma joins into one string each.
_VIDEOMME_PREFIXES = [
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is" + "The correct option is",
    "Best answer:" + "Best option:",
]


def videomme_official(response: str) -> str | None:
    """Video-MME's reading: prefixes removed, >10 words without a capital A-D → nothing, else the first one."""
    s = response.strip()
    for prefix in _VIDEOMME_PREFIXES:
        s = s.replace(prefix, "")
    has_letter = re.search("[ABCD]", s) is not None
    if len(s.split()) > 10 and not has_letter:
        return None
    first = re.search("[ABCD]", s)
    return first.group(0) if first else None


def mvbench_official(generation: str, n_options: int) -> str | None:
    """The letter MVBench's check_ans accepts for a generation after "Best option:(" (None: none or several)."""
    token = ("(" + generation.strip().split("\n")[0]).lower().split(" ")[0]
    accepted = []
    for i in range(n_options):
        gt = f"({chr(ord('a') + i)})"
        if token.replace(".", "") in gt or gt in token:
            accepted.append(chr(ord("A") + i))
    return accepted[0] if len(accepted) == 1 else None


@pytest.mark.parametrize("row", [r for r in TABLE if r.scorer == "videomme"], ids=_id)
def test_videomme_rows_match_the_official_rule(row: Row) -> None:
    assert len(row.options) == 4  # Video-MME questions have options A-D
    assert videomme_official(row.text) == row.official


@pytest.mark.parametrize("row", [r for r in TABLE if r.scorer == "mvbench"], ids=_id)
def test_mvbench_rows_match_the_official_rule(row: Row) -> None:
    assert mvbench_official(row.text, len(row.options)) == row.official


def test_the_reimplementations_show_the_known_quirks() -> None:
    # the word-count rule: more than 10 words and no capital A-D → nothing; a letter anywhere → the first one
    assert videomme_official("the cat is on the mat and the dog is in the yard today") is None
    assert videomme_official("the cat is on the mat and the dog is in the yard, so C") == "C"
    # the joined prefixes: "Best option:" alone is not removed, so the B of "Best" is read
    assert videomme_official("Best option: (C)") == "B"
    assert videomme_official("Best answer:Best option: C") == "C"
    # MVBench: an empty generation leaves "(" which every "(x)" contains; mmrl reads nothing
    assert mvbench_official("", 4) is None and extract_choice("(", COLORS) is None
