"""Answer extraction and normalisation, shared by the rewards and by evaluation.

Every function here is deterministic, pure and string-based; nothing evaluates model output as code.

* :func:`extract_answer` — the text inside the last ``<answer>…</answer>`` (configurable tag), falling back to
  the completion without its ``<think>`` blocks.
* :func:`last_boxed` — the content of the last ``\\boxed{...}`` (math answers), or ``""``.
* :func:`extract_choice` — an option letter, restricted to the sample's options, or ``None``.
* :func:`extract_yes_no` — ``"yes"`` / ``"no"`` / ``None``.
* :func:`parse_number` — a float or ``None`` (ints, decimals, signs, thousands separators, fractions,
  percentages, small number words).
* :func:`plain_number` — Python's ``float`` of the text without commas (Video-R1's reading) or ``None``.
* :func:`parse_span` — ``(start, end)`` seconds or ``None``.
* :func:`json_span` — ``(start, end)`` as Temporal-R1's released reward reads it (only its JSON object) or ``None``.
* :func:`normalize_text` / :func:`text_tokens` — lower-case, punctuation and articles removed.

The ``normalize_gold_*`` helpers turn a dataset's gold answer into the same form and raise ``ValueError`` for
gold answers that cannot be read (a data problem, not a model error).
"""

from __future__ import annotations

import json
import logging
import math
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "choice_letters",
    "extract_answer",
    "extract_choice",
    "extract_yes_no",
    "first_tag_block",
    "json_span",
    "last_boxed",
    "latex_number",
    "normalize_gold_choice",
    "normalize_gold_number",
    "normalize_gold_span",
    "normalize_gold_yes_no",
    "normalize_text",
    "option_text",
    "parse_number",
    "parse_span",
    "plain_number",
    "text_tokens",
]

# --------------------------------------------------------------------------------------------------------
# Text normalisation
# --------------------------------------------------------------------------------------------------------

_ARTICLES = frozenset({"a", "an", "the"})
# words, or numbers with internal decimal points / thousands separators ("3.5", "1,000")
_TOKEN_RE = re.compile(r"\d+(?:[.,]\d+)*|[^\W_]+")


def text_tokens(text: Any, *, remove_articles: bool = True) -> list[str]:
    """Normalised tokens: NFKC, lower-case, apostrophes dropped ("don't" -> "dont"), other punctuation as
    separators, numbers kept whole ("3.5"), articles ``a``/``an``/``the`` removed (by default)."""
    s = unicodedata.normalize("NFKC", "" if text is None else str(text)).lower()
    s = s.replace("'", "").replace("\u2019", "")
    toks = _TOKEN_RE.findall(s)
    if remove_articles:
        toks = [t for t in toks if t not in _ARTICLES]
    return toks


def normalize_text(text: Any, *, remove_articles: bool = True) -> str:
    """:func:`text_tokens` joined by single spaces (SQuAD-style normalisation)."""
    return " ".join(text_tokens(text, remove_articles=remove_articles))


# --------------------------------------------------------------------------------------------------------
# The answer block
# --------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _tag_patterns(tag: str, think_tag: str):
    t, k = re.escape(tag), re.escape(think_tag)
    return (
        re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL | re.IGNORECASE),
        re.compile(rf"<{t}>", re.IGNORECASE),
        re.compile(rf"<{k}>.*?</{k}>", re.DOTALL | re.IGNORECASE),
        re.compile(rf"</{k}>", re.IGNORECASE),
        re.compile(rf"<{k}>", re.IGNORECASE),
    )


def extract_answer(
    text: Any, *, tag: str = "answer", think_tag: str = "think", fallback: str = "strip_think"
) -> str:
    """The answer part of a completion, stripped.

    1. The content of the **last** ``<tag>…</tag>`` block (tags are case-insensitive).
    2. An opening ``<tag>`` without a closing one (a truncated completion): everything after the last one.
    3. Otherwise, by ``fallback``: ``"strip_think"`` (default) — the completion without closed
       ``<think>…</think>`` blocks, without anything up to a lone ``</think>`` and without anything after an
       unclosed ``<think>``; ``"whole"`` — the whole completion; ``"none"`` — the empty string.
    """
    if fallback not in ("strip_think", "whole", "none"):
        raise ValueError(f"fallback must be 'strip_think', 'whole' or 'none', got {fallback!r}")
    s = "" if text is None else str(text)
    block, opening, think_block, think_close, think_open = _tag_patterns(tag, think_tag)
    found = block.findall(s)
    if found:
        return found[-1].strip()
    opens = list(opening.finditer(s))
    if opens:
        return s[opens[-1].end() :].strip()
    if fallback == "none":
        return ""
    if fallback == "whole":
        return s.strip()
    s = think_block.sub(" ", s)
    closes = list(think_close.finditer(s))
    if closes:
        s = s[closes[-1].end() :]
    m = think_open.search(s)
    if m:
        s = s[: m.start()]
    return s.strip()


def first_tag_block(text: Any, *, tag: str = "answer") -> str:
    """The stripped content of the first complete ``<tag>…</tag>`` block (across lines; the tags as written,
    case counts), or ``""`` when there is none: the strict reading of Video-R1's and Temporal-R1's rewards
    (``re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)``: ``<ANSWER>`` is no block there)."""
    s = "" if text is None else str(text)
    t = re.escape(tag)
    found = re.search(rf"<{t}>(.*?)</{t}>", s, re.DOTALL)
    return found.group(1).strip() if found else ""


_BOX_OPEN = "\\boxed{"


def last_boxed(text: Any) -> str:
    """The stripped content of the last complete ``\\boxed{...}`` in ``text`` (braces balanced, so
    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; escaped ``\\{``/``\\}`` are not the box's own), or
    ``""`` when there is none. A box that never closes (a cut-off completion) does not count."""
    s = "" if text is None else str(text)
    found = ""
    start = s.find(_BOX_OPEN)
    while start != -1:
        i = j = start + len(_BOX_OPEN)
        depth = 1
        while j < len(s) and depth:
            c = s[j]
            if c == "\\":
                j += 2
                continue
            depth += (c == "{") - (c == "}")
            j += 1
        if depth:
            break
        found = s[i : j - 1].strip()
        start = s.find(_BOX_OPEN, j)
    return found


def _clean(text: Any) -> str:
    """Unicode-normalised text without LaTeX boxes, markdown emphasis, code ticks and dollar signs."""
    s = unicodedata.normalize("NFKC", "" if text is None else str(text))
    for _ in range(3):
        s2 = re.sub(r"\\(?:boxed|text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", s)
        if s2 == s:
            break
        s = s2
    s = s.replace("**", "").replace("__", "").replace("`", "").replace("$", "").replace("\\%", "%")
    s = s.replace("\u2212", "-")
    return re.sub(r"\s+", " ", s).strip()


# "So the final answer is:", "Answer:", "The correct option is", "Best option:", "Option", "My choice is" ...
_PREFIX_RE = re.compile(
    r"^(?:(?:so|thus|therefore|hence)\s*,?\s+)?(?:(?:the|my|our)\s+)?"
    r"(?:(?:final|best|correct|right)\s+)*(?:answer|option|choice)s?"
    r"(?:\s+(?:is|would\s+be|should\s+be|must\s+be|will\s+be))?\s*[:=\-]?\s*",
    re.IGNORECASE,
)


def _strip_prefixes(s: str) -> str:
    for _ in range(3):
        m = _PREFIX_RE.match(s)
        if not m or m.end() == 0:
            break
        s = s[m.end() :].strip()
    return s


# --------------------------------------------------------------------------------------------------------
# Multiple choice
# --------------------------------------------------------------------------------------------------------

_ALPHABET = string.ascii_uppercase
# After an upper-case "A", these words keep it a letter ("A or B", "A is correct", "A because ..."); any other
# lower-case word makes it the English article ("A red circle").
_LETTER_FOLLOWERS = frozenset(
    {
        "and",
        "or",
        "nor",
        "is",
        "was",
        "are",
        "vs",
        "versus",
        "because",
        "since",
        "as",
        "seems",
        "would",
        "should",
        "could",
        "must",
        "might",
        "appears",
        "looks",
        "fits",
        "matches",
        "then",
        "but",
        "only",
    }
)
# After "I" only the words that cannot follow the pronoun keep it a letter ("I is correct", "I or J"):
# "I would say B", "I was unsure", "I then saw" are the pronoun.
_I_FOLLOWERS = frozenset(
    {"and", "or", "nor", "is", "vs", "versus", "seems", "appears", "looks", "fits", "matches"}
)
_STANDALONE = r"(?<![A-Za-z0-9'\u2019\-])([A-Z])(?![A-Za-z0-9'\u2019\-])"


def _options_list(options: Any) -> list[Any] | None:
    """Options as a list; a mapping keyed by letters (``{"A": "cat", "B": "dog"}``) is read in letter order."""
    if options is None:
        return None
    if isinstance(options, Mapping):
        keys = sorted(str(k).strip().upper() for k in options)
        if keys != list(_ALPHABET[: len(keys)]):
            raise ValueError(f"option keys must be the letters A.. in order, got {sorted(options)}")
        by_key = {str(k).strip().upper(): v for k, v in options.items()}
        return [by_key[k] for k in keys]
    if isinstance(options, str):
        raise TypeError(f"options must be a list of option texts, got the string {options!r}")
    return list(options)


def choice_letters(options: Sequence[Any] | None = None, num_options: int | None = None) -> str:
    """The valid option letters: ``A`` .. the ``len(options)``-th letter; all of A–Z when unknown."""
    options = _options_list(options)
    if num_options is None and options is not None:
        num_options = len(options)
    if num_options is None:
        return _ALPHABET
    if not 0 < num_options <= 26:
        raise ValueError(f"a multiple-choice question needs 1 to 26 options, got {num_options}")
    return _ALPHABET[:num_options]


def _word_like(letter: str, after: str) -> bool:
    """True when ``letter`` (followed by ``after``) reads as an English word, not an option letter."""
    if letter.islower():
        return True
    if letter not in ("A", "I"):
        return False
    m = re.match(r"\s+([a-z][a-z'\u2019\-]*)", after)
    followers = _LETTER_FOLLOWERS if letter == "A" else _I_FOLLOWERS
    return bool(m) and m.group(1) not in followers


def option_text(letter: str, option: Any) -> str:
    """Option ``letter``'s text, normalised (:func:`normalize_text`), without the label it may already carry
    (``"A. red"`` or ``"(A) red"`` for option A gives ``"red"``)."""
    text = "" if option is None else str(option).strip()
    # options that already carry their label ("A. red", "(A) red")
    m = re.match(r"^[\(\[]?\s*([A-Za-z])\s*[\)\]\.:]\s*", text)
    if m and m.group(1).upper() == letter:
        text = text[m.end() :]
    return normalize_text(text)


def _option_map(options: Sequence[Any] | None, letters: str) -> dict[str, str]:
    if not options:
        return {}
    return {letters[i]: option_text(letters[i], o) for i, o in enumerate(options) if i < len(letters)}


def _match_option_text(s: str, opts: dict[str, str]) -> str | None:
    norm = normalize_text(s)
    if not norm:
        return None
    hits = [k for k, v in opts.items() if v and v == norm]
    return hits[0] if len(hits) == 1 else None


def _standalone_letters(s: str) -> list[tuple[str, int]]:
    out = []
    for m in re.finditer(_STANDALONE, s):
        if not _word_like(m.group(1), s[m.end() :]):
            out.append((m.group(1), m.start()))
    return out


_WHOLE_RE = re.compile(r"^[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[.:)]?$")
# A leading option label. The opening bracket may be unmatched: MVBench's "Best option:(" pre-fill gives "(B. ...".
_LABEL_RES = (
    re.compile(r"^[\(\[]?\s*(?P<letter>[A-Za-z])\s*[\)\]]"),  # (B) [B] B) (b)
    # B. B: and B, B; (the comma stays in the rest: "B, C" is a list of letters)
    re.compile(r"^[\(\[]?\s*(?P<letter>[A-Z])(?:[.:](?=\s|$)|(?=[,;](?:\s|$)))"),
    re.compile(r"^[\(\[]?\s*(?P<letter>[a-z])[.:](?=\s|$)"),  # b. b:
    re.compile(r"^[\(\[]?\s*(?P<letter>[A-Z])\s+[-\u2013\u2014]+(?=\s|$)"),  # B - text
)
_BARE_LABEL_RE = re.compile(r"^[\(\[]?\s*(?P<letter>[A-Z])(?=\s)")  # B text, B is correct, A or B
_ANSWER_PHRASE_RE = re.compile(
    r"(?:\banswer|\b(?:correct|right|best|final)\s+(?:option|choice))"
    r"(?:\s+(?:is|was|would\s+be|should\s+be|must\s+be|will\s+be)\s*[:=]?|\s*[:=])\s*"
    r"(?:(?:option|choice)\s+)?(?P<open>[\(\[]?)\s*(?P<letter>[A-Za-z])\s*(?P<close>[\)\]]?)"
    r"(?![A-Za-z0-9'\u2019\-])",
    re.IGNORECASE,
)
_MENTION_RE = re.compile(
    r"\b(?:option|choice)\s+(?P<open>[\(\[]?)\s*(?P<letter>[A-Za-z])\s*(?P<close>[\)\]]?)(?![A-Za-z0-9'\u2019\-])",
    re.IGNORECASE,
)
_BRACKET_RE = re.compile(r"[\(\[]\s*([A-Za-z])\s*[\)\]]")
# What follows a letter and makes the answer name two letters: "B or C", "(A) and (C)", "B/C", "A) but maybe B"
_ALTERNATIVE_RE = re.compile(
    r"^\s*(?:,\s*)?(?:/|&|\bor\b|\band\b|\bnor\b|\bvs\b\.?|\bversus\b"
    r"|\bbut\s+(?:maybe|perhaps|possibly|probably|also)\b|\bor\s+(?:maybe|perhaps|possibly))"
    r"\s*(?:(?:maybe|perhaps|possibly|probably|also|even)\s+)?(?:(?:option|choice)\s+)?"
    r"[\(\[]?\s*(?P<letter>[A-Z])(?![A-Za-z0-9'\u2019\-])"
)
# "B, C" / "B, C or D": a comma list of letters (but not "B, A is wrong" - an explanation)
_COMMA_LIST_RE = re.compile(
    r"^\s*,\s*[\(\[]?\s*(?P<letter>[A-Z])\s*[\)\]]?(?=\s*(?:$|[,.;/&]|\bor\b|\band\b|\bare\b))"
)
# the rest after a label is nothing but more labels: "B. C.", "A) B) C)"
_LETTER_LIST_RE = re.compile(r"^(?:[\(\[]?\s*[A-Z]\s*[\)\]]?\s*[.,;:]?\s*)+$")


def _names_another_letter(rest: str, letter: str) -> bool:
    """True when ``rest`` (what follows ``letter``) joins another letter to it: "or C", ", C", "and (C)"."""
    for regex in (_ALTERNATIVE_RE, _COMMA_LIST_RE):
        m = regex.match(rest)
        if m and m.group("letter") != letter and not _word_like(m.group("letter"), rest[m.end() :]):
            return True
    others = set(re.findall(r"[A-Z]", rest)) - {letter}
    return bool(others) and bool(_LETTER_LIST_RE.match(rest.strip()))


def _leading_label(s: str, opts: dict[str, str]) -> tuple[str, str] | None:
    """``(letter, rest)`` when ``s`` opens with an option label, as the official scorers read it.

    ``B.``, ``B)``, ``(B)``, ``[B]``, ``B:``, ``B,``, ``B -`` and a capital letter followed by a space (``B
    because ...``, ``B blue``). A capital "A"/"I" followed by an ordinary lower-case word is the article /
    pronoun ("A red circle", "I think"), unless what follows is exactly that option's own text. Without a
    delimiter, a text that is exactly one option's text ("T cell") is that option, not a label.
    """
    for regex in _LABEL_RES:
        m = regex.match(s)
        if m:
            return m.group("letter").upper(), s[m.end() :]
    m = _BARE_LABEL_RE.match(s)
    if m and not _match_option_text(s, opts):  # "T cell", "B cells": an option's own text, not a label
        letter, rest = m.group("letter"), s[m.end() :]
        own = opts.get(letter)
        if not _word_like(letter, rest) or (own and normalize_text(rest) == own):
            return letter, rest
    return None


def _phrase_letter(m: re.Match, s: str) -> str | None:
    """The letter of an answer-phrase match, or None when it reads as a word ("the answer is a cat")."""
    letter = m.group("letter")
    bracketed = bool(m.group("open")) and bool(m.group("close"))
    if bracketed:
        return letter.upper()
    after = s[m.end() :]
    if letter.islower():
        # "answer: b" / "the answer is b." — a lone lower-case letter at the end of a clause
        return letter.upper() if re.match(r"\s*(?:[.,;!?)\]]|$)", after) else None
    if _word_like(letter, after):
        return None
    return letter


def extract_choice(
    text: Any,
    options: Sequence[Any] | None = None,
    *,
    num_options: int | None = None,
    long_text_words: int = 10,
) -> str | None:
    """The option letter an answer names, or ``None`` when there is none or it is ambiguous.

    Letters are restricted to the sample's options (``A`` .. ``len(options)``-th letter; ``options`` may also
    be a mapping keyed by letters); a letter outside them gives ``None``. In order:

    1. the whole answer, or its first line, is a letter: ``B``, ``(B)``, ``[b]``, ``B.``, ``B:``;
    2. a leading option label, as the official scorers (Video-MME, MVBench, lmms-eval) read it: ``B. text``,
       ``B) text``, ``(B) text``, ``[B]``, ``B: text``, ``B, text``, ``B - text``, ``B is correct because A
       ...``, ``B text`` — it wins over option texts and over other letters in the explanation, unless the
       next words join another letter to it (``B or C``, ``B, C``, ``(A) and (C)``, ``A) but maybe B``:
       ``None``);
    3. the last explicit answer phrase: ``Answer: B``, ``the answer is (B)``, ``the correct option is B``;
       followed by ``or``/``and``/``,``/``/`` and another letter it is ambiguous (``None``);
    4. after removing stock prefixes ("The best answer is", "Option", ...): again 1 and 2, then the exact
       text of exactly one option (normalised; ``options`` may carry "A. " labels);
    5. ``option B`` / ``choice B`` mentions, then bracketed letters ``(B)``, then standalone capital letters
       — each used only when exactly one distinct letter occurs; in answers longer than ``long_text_words``
       words a standalone letter counts only at the very end.

    Kept on purpose where the official scorers differ: lower-case (``b``, ``(b)``) and full-width letters
    count; the English article "a"/"A" ("a red circle", "A red circle") and the pronoun "I" ("I think it
    is B") are never letters — a capital "A" followed by exactly option A's text is option A; the option
    text alone names its option; ambiguous answers ("A or B") and empty answers give ``None``.
    """
    options = _options_list(options)
    letters = choice_letters(options, num_options)
    raw = unicodedata.normalize("NFKC", "" if text is None else str(text))
    s = _clean(raw)
    if not s:
        return None

    def valid(letter: str | None) -> str | None:
        if letter is None:
            return None
        letter = letter.upper()
        return letter if letter in letters else None

    opts = _option_map(options, letters)

    def label(t: str) -> tuple[bool, str | None]:
        """(found, letter): a whole-letter answer or a leading label; letter None when ambiguous / invalid."""
        m = _WHOLE_RE.match(t)
        if m:
            return True, valid(m.group(1))
        found = _leading_label(t, opts)
        if found:
            letter, rest = found
            return True, (None if _names_another_letter(rest, letter) else valid(letter))
        return False, None

    # 1. the whole answer is a letter, or its first line is
    m = _WHOLE_RE.match(s)
    if m:
        return valid(m.group(1))
    first_line = _clean(raw.strip().split("\n", 1)[0])
    m = _WHOLE_RE.match(first_line) if first_line != s else None
    if m:
        return valid(m.group(1))
    # 2. a leading option label
    found, letter = label(s)
    if found:
        return letter
    # 3. explicit answer phrase, last one wins
    phrase = [(m, _phrase_letter(m, s)) for m in _ANSWER_PHRASE_RE.finditer(s)]
    phrase = [(m, x) for m, x in phrase if x is not None]
    if phrase:
        m, letter = phrase[-1]
        if _names_another_letter(s[m.end() :], letter):
            return None
        return valid(letter)
    # 4. prefixes stripped: a letter or label again, then the option text
    s2 = _strip_prefixes(s)
    if not s2:
        return None
    if s2 != s:
        found, letter = label(s2)
        if found:
            return letter
    hit = _match_option_text(s2, opts) or _match_option_text(s, opts)
    if hit:
        return hit
    # 5. weaker evidence: unique mention
    mentions = set()
    for m in _MENTION_RE.finditer(s2):
        x = _phrase_letter(m, s2)
        if x is not None:
            mentions.add(x)
    if mentions:
        return valid(mentions.pop()) if len(mentions) == 1 else None
    brackets = {x.upper() for x in _BRACKET_RE.findall(s2)}
    if brackets:
        return valid(brackets.pop()) if len(brackets) == 1 else None
    bare = _standalone_letters(s2)
    if len(s2.split()) > long_text_words:
        end = re.search(r"(?<![A-Za-z0-9'\u2019\-])([A-Z])\s*[.!]?\s*$", s2)
        bare = [(end.group(1), end.start(1))] if end and end.group(1) not in ("A", "I") else []
    distinct = {x for x, _ in bare}
    if len(distinct) == 1:
        return valid(distinct.pop())
    return None


def normalize_gold_choice(answer: Any, options: Sequence[Any] | None = None) -> str:
    """A gold multiple-choice answer as its letter: ``"B"``, ``"(b)"``, ``"B."`` or the exact option text."""
    options = _options_list(options)
    letters = choice_letters(options)
    if isinstance(answer, str):
        s = _clean(answer)
        m = _WHOLE_RE.match(s)
        letter = m.group(1).upper() if m else _match_option_text(s, _option_map(options, letters))
        if letter and letter in letters:
            return letter
    raise ValueError(
        f"gold answer {answer!r} is not an option letter"
        + (f" among {letters[0]}-{letters[-1]}" if options else "")
    )


# --------------------------------------------------------------------------------------------------------
# Yes / no
# --------------------------------------------------------------------------------------------------------

_YES = frozenset({"yes", "true"})
_NO = frozenset({"no", "false"})
_YN_PHRASE_RE = re.compile(
    r"\banswer\s*(?:is|was|would\s+be|should\s+be|:|=)\s*:?\s*(yes|no|true|false)\b", re.IGNORECASE
)


def _polarity(word: str) -> str | None:
    if word in _YES:
        return "yes"
    if word in _NO:
        return "no"
    return None


def extract_yes_no(text: Any, *, short_text_words: int = 8) -> str | None:
    """``"yes"``, ``"no"`` or ``None``.

    The first word decides (``yes``/``true`` → yes, ``no``/``false`` → no), unless it is immediately joined
    to the opposite ("yes and no", "yes or no", "yes/no") — then ``None``. Otherwise the last
    "answer is yes/no" phrase; otherwise, in a short answer, a single polarity mentioned anywhere.
    """
    s = _strip_prefixes(_clean(text)).lower()
    words = re.findall(r"[a-z]+", s)
    if not words:
        return None
    first = _polarity(words[0])
    if first is not None:
        m = re.match(r"^\W*[a-z]+\s*(?:/|\bor\b|\band\b|\bnor\b|\bvs\b|&)\s*([a-z]+)", s)
        if m and _polarity(m.group(1)) not in (None, first):
            return None
        return first
    phrase = _YN_PHRASE_RE.findall(s)
    if phrase:
        return _polarity(phrase[-1].lower())
    if len(words) <= short_text_words:
        found = {p for p in map(_polarity, words) if p}
        if len(found) == 1:
            return found.pop()
    return None


def normalize_gold_yes_no(answer: Any) -> str:
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    got = extract_yes_no(answer) if isinstance(answer, str) else None
    if got is None:
        raise ValueError(f"gold answer {answer!r} is not yes/no")
    return got


# --------------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------------

_NUM_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-+])?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d{1,3})(?!\d))?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?"
    r"(?P<pct>\s*(?:%|percent\b))?"
)
_UNITS = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
        ]
    )
}
_TENS = {
    w: 10 * (i + 2)
    for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"])
}
_WORD_NUM_RE = re.compile(
    r"\b(?:(?P<hundred>(?:one|a)\s+hundred|hundred)"
    r"|(?P<tens>" + "|".join(_TENS) + r")(?:[\s-](?P<unit1>" + "|".join(list(_UNITS)[1:10]) + r"))?"
    r"|(?P<unit>" + "|".join(_UNITS) + r"))\b",
    re.IGNORECASE,
)
_NUM_PHRASE_RE = re.compile(
    r"(?:\banswer|\bresult|\btotal|\bcount|\bnumber)\s*(?:is|was|would\s+be|:|=)\s*$", re.IGNORECASE
)


def _number_candidates(s: str, percent: str) -> list[tuple[float, int, int]]:
    out = []
    for m in _NUM_RE.finditer(s):
        try:
            value = float(m.group("num").replace(",", ""))
            if m.group("exp"):
                value *= 10.0 ** int(m.group("exp"))
            if m.group("den"):
                den = float(m.group("den"))
                if den == 0:
                    continue
                value /= den
        except (ValueError, OverflowError):
            continue
        if m.group("sign") == "-":
            value = -value
        if m.group("pct") and percent == "fraction":
            value /= 100.0
        if math.isfinite(value):
            out.append((value, m.start(), m.end()))
    if out:
        return out
    for m in _WORD_NUM_RE.finditer(s):
        if m.group("hundred"):
            value = 100
        elif m.group("tens"):
            value = _TENS[m.group("tens").lower()] + (
                _UNITS[m.group("unit1").lower()] if m.group("unit1") else 0
            )
        else:
            value = _UNITS[m.group("unit").lower()]
        out.append((float(value), m.start(), m.end()))
    return out


_LATEX_COMMAND_RE = re.compile(r"\\([A-Za-z]+)")
# the LaTeX commands of numbers that math-verify is asked to read; a text with any other command ("30^\\circ",
# "\\mathrm{cm}") is read as before
_LATEX_NUMBER_COMMANDS = frozenset(
    {"frac", "dfrac", "tfrac", "sqrt", "pi", "times", "cdot", "div", "left", "right", "boxed", "displaystyle"}
)
_UNREAD = object()  # math-verify was not asked, or found no expression: read the text as before


def _braced(s: str, start: int) -> str:
    """The text of the ``{...}`` group opening at ``s[start]`` (to the end when it never closes)."""
    depth = 0
    for j in range(start, len(s)):
        depth += (s[j] == "{") - (s[j] == "}")
        if depth == 0:
            return s[start + 1 : j]
    return s[start + 1 :]


def _small_powers(s: str) -> bool:
    """At most two powers, none nested, each exponent with at most 3 digits: sympy computes integer powers
    exactly, so ``10^{10^{10}}`` must never reach it."""
    if s.count("^") > 2:
        return False
    for m in re.finditer(r"\^\s*", s):
        rest = s[m.end() :]
        exponent = _braced(rest, 0) if rest.startswith("{") else rest[:1]
        if "^" in exponent or sum(c.isdigit() for c in exponent) > 3:
            return False
    return True


def _real_value(expr: Any) -> float | None:
    """A sympy expression's value when it is one finite real number (the right side of ``x = ...``)."""
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    if isinstance(expr, sympy.FiniteSet):
        if len(expr) != 1:
            return None
        expr = next(iter(expr))
    if not isinstance(expr, sympy.Expr) or expr.free_symbols:
        return None
    try:
        value = complex(expr.evalf(30))
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return None
    if not (math.isfinite(value.real) and abs(value.imag) <= 1e-12 * max(1.0, abs(value.real))):
        return None
    return value.real


class _NoTimeoutNotice(logging.Filter):
    """Drops math-verify's one-time notice that its timeout is off (see :func:`_math_verify_parse`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@lru_cache(maxsize=1)
def _math_verify_parse() -> Any:
    """math-verify's ``parse`` of LaTeX in math mode (imported on first use: it brings sympy).

    Without its signal-based timeout (that works in the main thread only and cancels a caller's alarm):
    :func:`_small_powers` keeps the input to what sympy evaluates at once."""
    from math_verify import LatexExtractionConfig, parse

    logging.getLogger("math_verify.parser").addFilter(_NoTimeoutNotice())
    config = [LatexExtractionConfig()]
    return lambda s: parse(f"${s}$", extraction_config=config, fallback_mode="no_fallback", parsing_timeout=None)


@lru_cache(maxsize=4096)
def _math_verify_number(s: str) -> Any:
    """math-verify's reading of the LaTeX ``s``: a float, ``None`` (an expression, but not one finite real
    number) or ``_UNREAD`` (no expression found)."""
    found = _math_verify_parse()(s)
    return _real_value(found[0]) if found else _UNREAD


def _latex_number(s: str) -> Any:
    """The number a LaTeX answer (``\\frac{1}{2}``, ``\\sqrt{2}``, ``2^{10}``) stands for, read by math-verify;
    ``_UNREAD`` when ``s`` has no such notation (or a percent sign, or another command)."""
    commands = _LATEX_COMMAND_RE.findall(s)
    if not commands and "^" not in s:
        return _UNREAD
    if "%" in s or any(c not in _LATEX_NUMBER_COMMANDS for c in commands):
        return _UNREAD
    if len(s) > 200 or not _small_powers(s):
        return None
    return _math_verify_number(s)


def latex_number(text: Any) -> float | None:
    """The number a LaTeX answer stands for (``\\frac{1}{2}`` -> 0.5, ``\\sqrt{2}``, ``2^{10}``), read by
    math-verify as in :func:`parse_number`; ``None`` for text without such notation or that is not one finite
    real number."""
    if not isinstance(text, str):
        return None
    value = _latex_number(_clean(text))
    return None if value is _UNREAD else value


def parse_number(text: Any, *, percent: str = "value") -> float | None:
    """The number an answer gives, or ``None`` when there is none or several different ones.

    Reads ints, decimals (``.5``), signs, thousands separators (``1,234.5``), exponents (``1e3``),
    fractions (``3/4``), percentages and number words up to ninety-nine plus "(one/a) hundred" (words only
    when no digits occur). LaTeX numbers (``\\frac{1}{2}``, ``\\sqrt{2}``, ``2^{10}``, ``1.5 \\times 10^{3}``:
    text with ``^`` or only the commands in ``_LATEX_NUMBER_COMMANDS``) are read by math-verify (cached per
    text); an expression that is not one finite real number (``\\frac{a}{b}``, ``\\sqrt{-1}``, two values)
    gives ``None``, as do powers too large to evaluate (``10^{10^{10}}``). ``\\%`` is a percent sign.
    ``percent="value"`` (default) reads "45%" as 45 so that it matches a gold "45" or
    "45%"; ``percent="fraction"`` reads it as 0.45. Several numbers: all equal → that one; else the last one
    right after "answer is" / "total:" / "count =" ...; else ``None``. Plain ints and floats pass through.
    """
    if percent not in ("value", "fraction"):
        raise ValueError(f"percent must be 'value' or 'fraction', got {percent!r}")
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    s = _clean(text)
    latex = _latex_number(s)
    if latex is not _UNREAD:
        return latex
    cands = _number_candidates(s, percent)
    if not cands:
        return None
    distinct = []
    for v, _, _ in cands:
        if not any(math.isclose(v, d, rel_tol=1e-12, abs_tol=1e-12) for d in distinct):
            distinct.append(v)
    if len(distinct) == 1:
        return distinct[0]
    after_phrase = [v for v, start, _ in cands if _NUM_PHRASE_RE.search(s[:start])]
    if after_phrase:
        return after_phrase[-1]
    return None


def plain_number(text: Any) -> float | None:
    """The text as one number the way Video-R1's reward reads it (tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py,
    ``normalize_number``): Python's ``float`` of the text with its commas removed; ``None`` when that fails or
    the value is not finite (grpo.py's ``float`` also takes "nan" and "inf"; here they read as nothing)."""
    if isinstance(text, bool) or text is None:
        return None
    try:
        value = float(str(text).replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def normalize_gold_number(answer: Any, *, percent: str = "value") -> float:
    value = parse_number(answer, percent=percent)
    if value is None:
        raise ValueError(f"gold answer {answer!r} is not a number")
    return value


# --------------------------------------------------------------------------------------------------------
# Temporal spans
# --------------------------------------------------------------------------------------------------------

_T = r"\d+(?::\d{1,2}){1,2}(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_UNIT = r"(?:\s*(?:seconds?|secs?|s)\b)?"
_SPAN_RE = re.compile(
    rf"(?<![\w.:])(?P<a>{_T}){_UNIT}\s*(?:,|-|\u2013|\u2014|~|\bto\b|\band\b|\buntil\b|\btill\b|\bthrough\b)\s*"
    rf"(?P<b>{_T}){_UNIT}(?![\d:]|\.\d)",
    re.IGNORECASE,
)
_JSON_START_RE = re.compile(rf"\bstart(?:_time)?[\"']?\s*[:=]\s*[\"']?(?P<t>{_T})", re.IGNORECASE)
_JSON_END_RE = re.compile(rf"\bend(?:_time)?[\"']?\s*[:=]\s*[\"']?(?P<t>{_T})", re.IGNORECASE)


def _seconds(token: str) -> float:
    if ":" in token:
        parts = token.split(":")
        value = 0.0
        for p in parts:
            value = value * 60.0 + float(p)
        return value
    return float(token)


def parse_span(text: Any) -> tuple[float, float] | None:
    """A time span in seconds, or ``None``.

    Accepts ``[1.5, 3.0]``, ``(1.5, 3)``, ``1.5-3.0 seconds``, ``from 1.5s to 3s``, ``between 1.5 and 3``,
    ``00:01:05 - 00:01:10`` (h:m:s or m:s), and JSON ``{"start_time": "1.5", "end_time": "3"}``. The last span
    in the text wins. A span whose start is after its end is invalid (``None``); a list/tuple of two
    numbers passes through.
    """
    if isinstance(text, (list, tuple)) and len(text) == 2:
        try:
            a, b = (float(x) if not isinstance(x, str) else _seconds(x.strip()) for x in text)
        except (TypeError, ValueError):
            return None
        return (a, b) if math.isfinite(a) and math.isfinite(b) and 0 <= a <= b else None
    if isinstance(text, Mapping):
        for ks, ke in (("start", "end"), ("start_time", "end_time")):
            if ks in text and ke in text:
                return parse_span([text[ks], text[ke]])
        return None
    s = _clean(text)
    starts, ends = list(_JSON_START_RE.finditer(s)), list(_JSON_END_RE.finditer(s))
    if starts and ends:
        a, b = _seconds(starts[-1].group("t")), _seconds(ends[-1].group("t"))
    else:
        spans = list(_SPAN_RE.finditer(s))
        if not spans:
            return None
        a, b = _seconds(spans[-1].group("a")), _seconds(spans[-1].group("b"))
    if not (math.isfinite(a) and math.isfinite(b)) or a > b:
        return None
    return (a, b)


@lru_cache(maxsize=16)
def _first_block_exact(tag: str) -> re.Pattern[str]:
    t = re.escape(tag)
    return re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL)


def json_span(text: Any, *, tag: str = "answer") -> tuple[float, float] | None:
    """The span of a completion as Temporal-R1's released reward reads it (appletea233/Temporal-R1,
    ``verl/utils/reward_score/tvg.py``, ``tvg_accuracy_reward``), or ``None`` where that code fails (and scores 0).

    The first ``<tag>...</tag>`` block (``re.search``: case-sensitive, across lines), stripped, must be JSON
    (``json.loads``: ``NaN``/``Infinity`` included) for an object with ``"start_time"`` and ``"end_time"``; each
    is read by Python's ``float``, so ``"12.5"``, ``" 12.5 "``, ``12.5``, ``"1e1"`` and ``true`` all read, a
    list, ``null`` or ``"12.5s"`` does not. Nothing else is a span here: ``[12.5, 18]``, ``12.5 to 18``, a JSON
    object outside the block or with unquoted keys give ``None`` (see :func:`parse_span` for the lenient reading).
    The values are returned as read -- negative, inverted or not finite -- for tvg.py's IoU formula to score."""
    found = _first_block_exact(tag).search("" if text is None else str(text))
    if found is None:
        return None
    try:
        data = json.loads(found.group(1).strip())
    except (ValueError, RecursionError):  # json.JSONDecodeError, too many digits, nesting
        return None
    if not isinstance(data, dict) or "start_time" not in data or "end_time" not in data:
        return None
    try:
        return float(data["start_time"]), float(data["end_time"])
    except (TypeError, ValueError, OverflowError):  # null, a list, "12.5s", an integer past float's range
        return None


def normalize_gold_span(answer: Any) -> tuple[float, float]:
    span = parse_span(answer)
    if span is None:
        raise ValueError(f"gold answer {answer!r} is not a [start, end] span in seconds")
    return span
