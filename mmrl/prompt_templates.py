"""Prompt templates by name (``prompt.template``): a template is a format string with ``{question}``,
``{options}`` (lettered lines, empty when the sample has none) and ``{instruction}`` (how to format the answer,
chosen by ``prompt.answer_format`` and the problem type). ``prompt.template`` is either the name of a registered
template (``default``, ``plain``; register more with :func:`register_template`) or a custom format string,
recognised by its ``{question}`` field. Anything else is a :class:`ConfigError` naming the nearest template, so a
typo such as ``defualt`` never becomes the prompt text. Building the prompts themselves: :mod:`mmrl.prompts`.
"""

from __future__ import annotations

import string

from mmrl_common.errors import ConfigError
from mmrl_common.registry import Registry

TEMPLATES: Registry[str] = Registry("prompt template", "prompt.template", duplicates="replace")
"""Prompt templates by name: format strings with ``{question}``, ``{options}``, ``{instruction}``."""
TEMPLATES.add("default", "{question}\n{options}{instruction}")
TEMPLATES.add("plain", "{question}\n{options}")

_WHAT = {
    "multiple_choice": "the option letter",
    "yes_no": "yes or no",
    "numeric": "a number",
    "temporal_grounding": "the time span as [start, end] in seconds",
    "open": "a short phrase",
    "free_form": "a short phrase",
    "ocr": "the text exactly as written",
}


def register_template(name: str, text: str) -> None:
    """Register (or replace) the template ``name``: a format string with the fields ``{question}``,
    ``{options}`` and ``{instruction}``."""
    if not isinstance(text, str):
        raise ConfigError(f"prompt template {name!r} must be a format string, got {type(text).__name__}")
    TEMPLATES.add(name, text)


def format_fields(text: str) -> set[str] | None:
    """Field names of format string ``text``; None when it does not parse (unbalanced braces)."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError:
        return None


def resolve_template(template: str) -> str:
    """The format string for a ``prompt.template`` value: a registered name's template, or the value itself
    when it is a format string with a ``{question}`` field. Anything else (a typo of a name) raises
    :class:`ConfigError` naming ``prompt.template``, the nearest template and the valid ones."""
    text = TEMPLATES.find(template)
    if text is not None:
        return text
    if isinstance(template, str) and "{" in template:
        fields = format_fields(template)
        if fields is None:
            raise ConfigError(f"prompt.template: {template!r} is not a valid format string (unbalanced "
                              "braces; write a literal brace as {{ or }})")
        if "question" in fields:
            return template
    raise ConfigError(f"{TEMPLATES.unknown(template)}; a custom template is a format string with a "
                      "{question} field (and optionally {options}, {instruction})")


def instruction(problem_type: str, answer_format: str) -> str:
    what = _WHAT.get(problem_type, "the answer")
    if answer_format == "answer":
        return f"Reply with {what} inside <answer></answer>."
    return (f"Think briefly inside <think></think>, then give {what} inside <answer></answer>.")
