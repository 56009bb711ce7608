"""Prompt templates: registered names, custom format strings, and typos that must not become the prompt."""

from __future__ import annotations

import pytest

from data_pipelines.schema import Sample
from mmrl.config import PromptConfig
from mmrl.config.prompt_templates import register_template
from mmrl.engine.prompts import build_messages, user_text
from mmrl_common.errors import ConfigError

SAMPLE = Sample(id="s0", problem_type="multiple_choice", question="  Which way does it move? ",
                answer="B", options=["left", "right"])


def text(template: str, answer_format: str = "answer") -> str:
    return user_text(SAMPLE, PromptConfig(template=template, answer_format=answer_format))


def test_registered_templates_fill_question_options_and_instruction():
    assert text("default") == ("Which way does it move?\nOptions:\nA. left\nB. right\n"
                               "Reply with the option letter inside <answer></answer>.")
    assert text("plain") == "Which way does it move?\nOptions:\nA. left\nB. right\n"


def test_a_typo_of_a_template_name_is_an_error_naming_the_nearest():
    with pytest.raises(ConfigError) as err:
        text("defualt")
    msg = str(err.value)
    assert "prompt.template" in msg and "'defualt'" in msg
    assert "did you mean 'default'?" in msg
    assert "valid: ares-math, default, mmr1, plain, temporal-r1, video-r1" in msg
    # a word that is neither a template name nor a format string fails too, listing the valid names
    with pytest.raises(ConfigError, match=r"unknown prompt template 'concise'.*valid: ares-math, default, mmr1, plain, temporal-r1, video-r1"):
        build_messages(SAMPLE, PromptConfig(template="concise"), ["video"])


def test_a_custom_format_string_needs_the_question_field():
    assert text("Q: {question}\n{options}Answer:") == "Q: Which way does it move?\nOptions:\nA. left\nB. right\nAnswer:"
    assert text("{instruction} {question!r}") == (
        "Reply with the option letter inside <answer></answer>. 'Which way does it move?'")
    with pytest.raises(ConfigError, match="format string with a {question} field"):
        text("Look at the video and answer: {options}")
    with pytest.raises(ConfigError, match="unbalanced braces"):
        text("{question")
    with pytest.raises(ConfigError, match="unknown field 'answer'"):
        text("{question} {answer}")


def test_register_template_makes_a_new_name_valid():
    register_template("test_terse", "{question} ({instruction})")
    try:
        assert text("test_terse", "think_answer") == (
            "Which way does it move? (Think briefly inside <think></think>, then give the option letter "
            "inside <answer></answer>.)")
        messages = build_messages(SAMPLE, PromptConfig(template="test_terse", system="Be brief."), ["video"])
        assert messages[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
        assert [part["type"] for part in messages[1]["content"]] == ["video", "text"]
    finally:
        from mmrl.config.prompt_templates import TEMPLATES

        TEMPLATES.unregister("test_terse")
    with pytest.raises(ConfigError, match="unknown prompt template 'test_terse'"):
        text("test_terse")


def test_benchmark_prompt_template_typo_is_an_error_too():
    from mmrl.benchmarks.protocols import build_prompt, make_protocol

    with pytest.raises(ConfigError, match=r"--prompt-template: unknown template 'direkt'; did you mean 'direct'\? "
                                          r"valid: official, direct, reasoning"):
        make_protocol("mvbench", template="direkt")
    _, user, _ = build_prompt(SAMPLE, make_protocol("mvbench", template="Q: {question}"))
    assert user == "Q: Which way does it move?"
    _, user, _ = build_prompt(SAMPLE, make_protocol("mvbench", template="direct"))
    assert user.startswith("Which way does it move?\nA. left\nB. right\n")
