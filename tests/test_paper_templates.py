"""Paper prompt templates and strict answer-tag scoring (issue 48).

Expected prompt text is written here from Video-R1's training code (tulerfeng/Video-R1,
src/r1-v/src/open_r1/grpo.py: QUESTION_TEMPLATE, TYPE_TEMPLATE, make_conversation_image_and_video), not from
mmrl's template, so a paraphrase in mmrl fails these tests."""

from __future__ import annotations

import pytest
import yaml

from data_pipelines.schema import Sample
from mmrl.cli import main
from mmrl.config import PromptConfig, load_run_config
from mmrl.engine.prompts import build_messages, user_text
from rewards.registry import get_reward

# grpo.py QUESTION_TEMPLATE, with {Question} filled in by the code
VIDEO_R1_QUESTION = (
    "{Question}\n"
    "Please think about this question as if you were a human pondering deeply. "
    "Engage in an internal dialogue using expressions such as 'let me think', 'wait', 'Hmm', 'oh, I see', "
    "'let's break it down', etc, or other natural language thought expressions "
    "It's encouraged to include self-reflection or verification in the reasoning process. "
    "Provide your detailed reasoning between the <think> </think> tags, and then give your final answer between "
    "the <answer> </answer> tags."
)
MC_SUFFIX = " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> </answer> tags."
NUM_SUFFIX = " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags."

MC = Sample(id="mc", problem_type="multiple_choice", question="Which way does the ball move?",
            answer="B", options=["left", "right"])
NUM = Sample(id="num", problem_type="numeric", question="How many flashes are there?", answer="3")


def test_video_r1_multiple_choice_prompt_is_the_code_s_text() -> None:
    # make_conversation_image_and_video: problem + "Options:\n" + one line per option, then the type suffix
    question = "Which way does the ball move?" + "Options:\n" + "A. left\n" + "B. right\n"
    got = user_text(MC, PromptConfig(template="video-r1", answer_format="think_answer"))
    assert got == VIDEO_R1_QUESTION.format(Question=question) + MC_SUFFIX
    assert "let me think" in got and got.endswith("(e.g., A, B, C, D, etc.) within the <answer> </answer> tags.")


def test_video_r1_numeric_prompt_is_the_code_s_text() -> None:
    got = user_text(NUM, PromptConfig(template="video-r1", answer_format="think_answer"))
    assert got == VIDEO_R1_QUESTION.format(Question="How many flashes are there?") + NUM_SUFFIX
    assert "Think briefly" not in got  # mmrl's own instruction is not added to Video-R1's


def test_the_t_grpo_recipe_prompts_as_video_r1_without_a_system_prompt() -> None:
    cfg = load_run_config("t-grpo")  # the path `mmrl train --task t-grpo` resolves
    assert cfg.prompt.template == "video-r1"
    messages = build_messages(MC, cfg.prompt, ["video"])
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"][0] == {"type": "video"}
    assert messages[0]["content"][1]["text"].endswith(MC_SUFFIX)


def test_config_show_names_the_template(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--task", "t-grpo"]) == 0
    assert "video-r1" in capsys.readouterr().out


def test_mmrl_default_template_is_unchanged() -> None:
    assert user_text(NUM, PromptConfig(template="default", answer_format="think_answer")) == (
        "How many flashes are there?\n"
        "Think briefly inside <think></think>, then give a number inside <answer></answer>.")


def _accuracy(completions: list[str], sample: Sample, **kwargs: object) -> list[float]:
    columns = {"problem_type": [sample.problem_type] * len(completions), "answer": [sample.answer] * len(completions),
               "options": [sample.options] * len(completions), **kwargs}
    return get_reward("accuracy")(completions, **columns)


TAGGED = "<think>one, two, three</think> <answer>3</answer>"
UNTAGGED = "<think>one, two, three</think> 3"
TRUNCATED = "<think>one, two, three</think> <answer>3"


def test_strict_tags_scores_an_untagged_correct_answer_zero() -> None:
    # Video-R1 grpo.py accuracy_reward: re.search(r'<answer>\s*(.*?)\s*</answer>') else "" -> 0
    assert _accuracy([TAGGED, UNTAGGED, TRUNCATED], NUM, strict_tags=True) == [1.0, 0.0, 0.0]


def test_strict_tags_reads_the_first_answer_block() -> None:
    twice = "<answer>3</answer> on second thought <answer>4</answer>"
    assert _accuracy([twice], NUM, strict_tags=True) == [1.0]  # re.search: the first block


def test_without_strict_tags_an_untagged_answer_still_scores() -> None:
    assert _accuracy([TAGGED, UNTAGGED, TRUNCATED], NUM) == [1.0, 1.0, 1.0]
    assert _accuracy([TAGGED, UNTAGGED], NUM, strict_tags=False) == [1.0, 1.0]


def test_strict_tags_must_be_a_boolean() -> None:
    from mmrl_common.errors import ConfigError
    with pytest.raises(ConfigError, match="strict_tags must be true or false"):
        _accuracy([TAGGED], NUM, strict_tags="yes")


def test_the_t_grpo_recipe_scores_strictly() -> None:
    cfg = load_run_config("t-grpo")
    (acc,) = [r for r in cfg.rewards if r.name == "accuracy"]
    assert acc.kwargs.get("strict_tags") is True
    assert _accuracy([UNTAGGED], NUM, **acc.kwargs) == [0.0]


GROUNDING = {"problem_type": ["temporal_grounding"] * 2, "answer": [[2.0, 4.0]] * 2, "options": [None] * 2,
             "meta": [{}] * 2, "format_weight": 0.0, "answer_weight": 1.0, "iou_weight": 1.0}
SPAN_TAGGED = '<think>the flash</think> <answer>{"start_time": "2.0", "end_time": "4.0"}</answer>'
SPAN_UNTAGGED = '<think>the flash</think> {"start_time": "2.0", "end_time": "4.0"}'


def test_temporal_r1_strict_tags_gives_an_untagged_span_no_tiou() -> None:
    # appletea233/Temporal-R1 verl/utils/reward_score/tvg.py: re.search(r"<answer>(.*?)</answer>"), else 0
    reward = get_reward("temporal_r1")
    assert reward([SPAN_TAGGED, SPAN_UNTAGGED], **GROUNDING, strict_tags=True) == [1.0, 0.0]
    assert reward([SPAN_TAGGED, SPAN_UNTAGGED], **GROUNDING) == [1.0, 1.0]  # not strict: as before


def test_the_temporal_grounding_recipe_scores_strictly() -> None:
    cfg = load_run_config("temporal-grounding")
    (spec,) = [r for r in cfg.rewards if r.name == "temporal_r1"]
    assert spec.kwargs.get("strict_tags") is True


# LengSicong/MMR1 examples/mmr1/train_qwen2_5_vl_7b.sh SYSTEM_PROMPT as bash makes it (its line breaks and
# trailing spaces), passed as data.system_prompt="${SYSTEM_PROMPT}"; verl/trainer/main.py reads the command line
# with OmegaConf.from_cli, which yaml-loads each value (folding every line break into one space), and
# verl/utils/dataset.py joins it to the problem: " ".join((system_prompt.strip(), prompt_str))
MMR1_SCRIPT_VALUE = (
    'A conversation between User and Assistant. \n'
    'The User provides an image and asks a question. \n'
    'The Assistant first analyzes both the image and the question, \n'
    'then carefully thinks about the reasoning process step by step, \n'
    'and finally provides the User with an accurate answer. \n'
    'The Assistant must carefully checkout the correctness and validity of each reasoning step. \n'
    'If any errors or inconsistencies are found during the reasoning process, \n'
    'the Assistant reflects and corrects them logically. \n'
    'The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, \n'
    'i.e., <think> reasoning process here, with potential reflections and corrections </think>\n'
    '<answer> final answer here, with the key result enclosed in \\boxed{} </answer>.'
)
MMR1_SYSTEM = yaml.safe_load(MMR1_SCRIPT_VALUE)  # OmegaConf.from_cli's yaml.load of the command-line value


def test_mmr1_prompt_is_the_script_s_text_before_the_question() -> None:
    got = user_text(NUM, PromptConfig(template="mmr1", answer_format="think_answer"))
    assert got == MMR1_SYSTEM.strip() + " " + "How many flashes are there?" + "\n"
    assert got.startswith("A conversation between User and Assistant. The User provides")  # one line, as read


def test_the_vas_recipe_prompts_as_mmr1() -> None:
    cfg = load_run_config("vas")
    assert cfg.prompt.template == "mmr1"
    (message,) = build_messages(NUM, cfg.prompt, ["image"])
    assert message["content"][1]["text"] == MMR1_SYSTEM + " How many flashes are there?\n"


def test_ares_math_prompt_is_math_jinja() -> None:
    # shawn0728/ARES examples/format_prompt/math.jinja: "{{ content | trim }} You FIRST think ..."
    got = user_text(NUM, PromptConfig(template="ares-math", answer_format="think_answer"))
    assert got == ("How many flashes are there? You FIRST think about the reasoning process as an internal monologue "
                   "and then provide the final answer. The reasoning process MUST BE enclosed within <think> </think> "
                   "tags. The final answer MUST BE put in \\boxed{}.")
