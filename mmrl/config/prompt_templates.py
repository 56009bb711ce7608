"""Prompt templates by name (``prompt.template``): a template is a format string with ``{question}``,
``{options}`` (lettered lines, empty when the sample has none) and ``{instruction}`` (how to format the answer,
chosen by ``prompt.answer_format`` and the problem type, or by the template's own per-type suffixes).
``prompt.template`` is either the name of a registered template (``default``: mmrl's own; ``plain``;
``video-r1``: Video-R1's; ``ares-math``: ARES's; ``mmr1``: MMR1's; ``temporal-r1``: Temporal-R1's; register more
with :func:`register_template`) or a custom
format string,
recognised by its ``{question}`` field. Anything else is a :class:`ConfigError` naming the nearest template, so a
typo such as ``defualt`` never becomes the prompt text. Building the prompts themselves: :mod:`mmrl.engine.prompts`.
"""

from __future__ import annotations

import string

from mmrl_common.errors import ConfigError
from mmrl_common.registry import Registry

TEMPLATES: Registry[str] = Registry("prompt template", "prompt.template", duplicates="replace")
"""Prompt templates by name: format strings with ``{question}``, ``{options}``, ``{instruction}``."""
TEMPLATES.add("default", "{question}\n{options}{instruction}")
TEMPLATES.add("plain", "{question}\n{options}")

SUFFIXES: dict[str, dict[str, str]] = {}
"""Per-problem-type answer instructions of a template that brings its own (the ``{instruction}`` field), by
template name; a template without an entry gets mmrl's :func:`instruction`."""

# Video-R1 (tulerfeng/Video-R1, src/r1-v/src/open_r1/grpo.py, main(): QUESTION_TEMPLATE, TYPE_TEMPLATE and
# make_conversation_image_and_video): the exact text its COT-SFT start checkpoint and RL run were trained on. The
# code writes a multiple-choice question as problem + "Options:\n" + one "A. ..." line per option (no newline
# before "Options:"; mmrl's {options} field is that block), formats QUESTION_TEMPLATE with it and appends the
# type's suffix. No system prompt (the constant is defined there but not attached).
VIDEO_R1_QUESTION = (
    "{question}{options}\n"
    "Please think about this question as if you were a human pondering deeply. "
    "Engage in an internal dialogue using expressions such as 'let me think', 'wait', 'Hmm', 'oh, I see', "
    "'let's break it down', etc, or other natural language thought expressions "
    "It's encouraged to include self-reflection or verification in the reasoning process. "
    "Provide your detailed reasoning between the <think> </think> tags, and then give your final answer between "
    "the <answer> </answer> tags.{instruction}"
)
VIDEO_R1_TYPES = {   # grpo.py TYPE_TEMPLATE, by Video-R1's problem_type
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the "
                       "<answer> </answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text answer within the "
           "<answer> </answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
}
# mmrl's problem types -> Video-R1's. yes_no and temporal_grounding have no Video-R1 type (its data has
# neither): our choice, the free-form suffix.
_VIDEO_R1_TYPE_OF = {"multiple_choice": "multiple choice", "numeric": "numerical", "regression": "regression",
                     "ocr": "OCR", "free_form": "free-form", "open": "free-form", "yes_no": "free-form",
                     "temporal_grounding": "free-form"}

# ARES (shawn0728/ARES, examples/format_prompt/math.jinja): "{{ content | trim }} You FIRST think ...", the
# answer in \boxed{} (not <answer> tags: pair it with a reward that reads \boxed{}). mmrl's {options} block,
# when a sample has options, goes before the instruction as part of the content.
ARES_MATH = ("{question}{options} You FIRST think about the reasoning process as an internal monologue and then "
             "provide the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. "
             "The final answer MUST BE put in \\boxed{{}}.")

_WHAT = {
    "multiple_choice": "the option letter",
    "yes_no": "yes or no",
    "numeric": "a number",
    "regression": "a number",
    "temporal_grounding": "the time span as [start, end] in seconds",
    "open": "a short phrase",
    "free_form": "a short phrase",
    "ocr": "the text exactly as written",
}


def register_template(name: str, text: str, suffixes: dict[str, str] | None = None) -> None:
    """Register (or replace) the template ``name``: a format string with the fields ``{question}``,
    ``{options}`` and ``{instruction}``; ``suffixes`` (optional): the ``{instruction}`` text by problem type,
    replacing mmrl's for this template."""
    if not isinstance(text, str):
        raise ConfigError(f"prompt template {name!r} must be a format string, got {type(text).__name__}")
    TEMPLATES.add(name, text)
    if suffixes is None:
        SUFFIXES.pop(name, None)
    else:
        SUFFIXES[name] = dict(suffixes)


# MMR1 (LengSicong/MMR1, examples/mmr1/train_qwen2_5_vl_7b.sh SYSTEM_PROMPT, as the code reads it): the script
# passes it as data.system_prompt="${SYSTEM_PROMPT}", and verl/trainer/main.py's OmegaConf.from_cli yaml-loads the
# value, which folds each line break (with the trailing space before it) into one space: one line, as Temporal-R1's
# (configs/temporal-grounding.yaml). verl/utils/dataset.py puts it in the user turn, " ".join((system_prompt.strip(),
# problem)), not in a system message; the problem's <image> marks where the image goes (mmrl: media first).
MMR1_PROMPT = (
    "A conversation between User and Assistant. "
    "The User provides an image and asks a question. "
    "The Assistant first analyzes both the image and the question, "
    "then carefully thinks about the reasoning process step by step, "
    "and finally provides the User with an accurate answer. "
    "The Assistant must carefully checkout the correctness and validity of each reasoning step. "
    "If any errors or inconsistencies are found during the reasoning process, "
    "the Assistant reflects and corrects them logically. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, "
    "i.e., <think> reasoning process here, with potential reflections and corrections </think> "
    "<answer> final answer here, with the key result enclosed in \\boxed{{}} </answer>."
    " {question}\n{options}"
)


# Temporal-R1 (appletea233/Temporal-R1, verl/utils/dataset_video.py __getitem__): the user turn is the video, then
# the record's problem text alone ({"type": "text", "text": problem}); what to answer and how is in the system
# prompt (examples/run_qwen2_5_vl_3b_tvg.sh SYSTEM_PROMPT, the recipe's prompt.system). The code's TVG records have
# no options; a sample's options follow the problem as mmrl's {options} block (our choice, as Video-R1 writes them).
TEMPORAL_R1_PROMPT = "{question}{options}"


register_template("video-r1", VIDEO_R1_QUESTION,
                  {ours: VIDEO_R1_TYPES[theirs] for ours, theirs in _VIDEO_R1_TYPE_OF.items()})
register_template("ares-math", ARES_MATH, {})
register_template("mmr1", MMR1_PROMPT, {})
register_template("temporal-r1", TEMPORAL_R1_PROMPT, {})


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


def template_instruction(template: str, problem_type: str, answer_format: str) -> str:
    """The ``{instruction}`` text under ``prompt.template`` ``template``: the template's own suffix for the
    problem type when it brings suffixes (empty for a type it has none for), else mmrl's :func:`instruction`."""
    own = SUFFIXES.get(template) if isinstance(template, str) else None
    if own is not None:
        return own.get(problem_type, "")
    return instruction(problem_type, answer_format)


def instruction(problem_type: str, answer_format: str) -> str:
    what = _WHAT.get(problem_type, "the answer")
    if answer_format == "answer":
        return f"Reply with {what} inside <answer></answer>."
    return (f"Think briefly inside <think></think>, then give {what} inside <answer></answer>.")


ANSWER_MARKUP: dict[str, str] = {"ares-math": "\\boxed{{{answer}}}"}
"""How a template asks for the final answer to be written, by template name (a format string with ``{answer}``);
a template without an entry: ``<answer>{answer}</answer>``. ARES's math.jinja asks for ``\\boxed{}`` and its
reward (``answer_from: boxed``) reads the last one. Cold-start targets follow it (:mod:`mmrl.engine.sft`)."""


def answer_markup(template: str, answer: str) -> str:
    """``answer`` written as prompt template ``template`` asks for the final answer (:data:`ANSWER_MARKUP`)."""
    form = ANSWER_MARKUP.get(template, "<answer>{answer}</answer>") if isinstance(template, str) else \
        "<answer>{answer}</answer>"
    return form.format(answer=answer)
