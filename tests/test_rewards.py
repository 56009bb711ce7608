"""Rewards: registry, combination, format, accuracy and the text/time metrics."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

import rewards
from mmrl_common.errors import ConfigError, MmrlError
from rewards import (
    CombinedReward,
    RewardError,
    available_rewards,
    check_format,
    completion_to_text,
    compute_rewards,
    get_reward,
    normalize_completions,
    register_reward,
    register_scorer,
    rouge_l,
    temporal_iou,
    token_f1,
    unregister_reward,
)
from rewards.accuracy import unregister_scorer
from rewards.metrics import lcs_length
from rewards.video_r1_metrics import ocr_score, rouge_mean, word_error_rate


@pytest.fixture
def temp_rewards():
    """Names registered by a test are removed afterwards."""
    names = []

    def reg(name, fn, **kw):
        register_reward(name, fn, **kw)
        names.append(name)
        return fn

    yield reg
    for n in names:
        unregister_reward(n)


def conv(text):
    return [{"role": "assistant", "content": text}]


# --------------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------------


def test_builtins_are_registered():
    assert {"format", "accuracy", "token_f1", "rouge_l", "temporal_iou"} <= set(available_rewards())
    assert available_rewards() == sorted(available_rewards())
    assert get_reward("format") is rewards.format.format_reward


def test_unknown_reward_names_the_nearest():
    with pytest.raises(ConfigError) as err:
        get_reward("acuracy")
    msg = str(err.value)
    assert "'acuracy'" in msg and "'accuracy'" in msg
    with pytest.raises(ConfigError, match="'format'"):
        CombinedReward([{"name": "fromat"}])
    with pytest.raises(ConfigError, match="valid: ") as err:
        get_reward("zzzzzzzz")
    valid = str(err.value).split("valid: ", 1)[1].split(", ")
    assert valid == sorted(valid) and {"accuracy", "format"} <= set(valid)


def test_register_decorator_and_duplicates(temp_rewards):
    @register_reward("t_len")
    def t_len(completions, **kwargs):
        return [float(len(c)) for c in completions]

    try:
        assert get_reward("t_len") is t_len
        assert t_len(["ab"]) == [2.0]  # returned unchanged

        def other(completions, **kwargs):
            return [0.0] * len(completions)

        with pytest.raises(ConfigError, match="already registered"):
            register_reward("t_len", other)
        register_reward("t_len", other, overwrite=True)
        assert get_reward("t_len") is other
    finally:
        unregister_reward("t_len")
    with pytest.raises(ConfigError):
        register_reward("", lambda c, **k: c)
    with pytest.raises(ConfigError):
        register_reward("t_notcallable", 3)


def test_trl_reward_function_used_unchanged(temp_rewards):
    # A TRL-style function: reads conversational completions itself and takes **kwargs.
    def trl_len_reward(completions, **kwargs):
        return [-abs(20 - len(c[0]["content"])) / 20 for c in completions]

    temp_rewards("t_trl_len", trl_len_reward)
    completions = [conv("x" * 20), conv("x" * 10)]
    total, comps = compute_rewards(
        ["t_trl_len"], completions, {"id": ["a", "b"], "prompts": ["p", "p"], "my_extra": [1, 2]}
    )
    assert total == pytest.approx([0.0, -0.5])
    assert comps == {"t_trl_len": pytest.approx([0.0, -0.5])}


# --------------------------------------------------------------------------------------------------------
# completions
# --------------------------------------------------------------------------------------------------------


def test_completion_normaliser():
    assert completion_to_text("plain") == "plain"
    assert completion_to_text(conv("hi")) == "hi"
    parts = [
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"text": "b"}]}
    ]
    assert completion_to_text(parts) == "ab"
    multi = [
        {"role": "assistant", "content": "<tool>frames 1-3</tool>"},
        {"role": "user", "content": "here are frames"},
        {"role": "assistant", "content": "<answer>B</answer>"},
    ]
    assert completion_to_text(multi) == "<tool>frames 1-3</tool>\n<answer>B</answer>"
    assert completion_to_text({"role": "assistant", "content": "one"}) == "one"
    assert completion_to_text([]) == ""
    assert normalize_completions(["x", conv("y")]) == ["x", "y"]
    with pytest.raises(TypeError):
        normalize_completions("not a list")
    with pytest.raises(TypeError):
        completion_to_text(42)


def test_builtin_rewards_accept_conversational_completions():
    text = "<think>t</think><answer>B</answer>"
    cols = {
        "id": ["s"],
        "problem_type": ["multiple_choice"],
        "options": [["x", "y"]],
        "answer": ["B"],
        "meta": [{}],
    }
    assert get_reward("format")([conv(text)]) == [1.0]
    assert get_reward("accuracy")([conv(text)], **cols) == [1.0]
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": text}]}]]
    assert get_reward("accuracy")(parts, **cols) == [1.0]


# --------------------------------------------------------------------------------------------------------
# combination
# --------------------------------------------------------------------------------------------------------

MC_COLS = {
    "id": ["q1", "q2", "q3"],
    "problem_type": ["multiple_choice"] * 3,
    "options": [["cat", "dog", "owl"]] * 3,
    "answer": ["B", "B", "C"],
    "meta": [{}, {}, {}],
}
MC_COMPLETIONS = [
    "<think>it barks</think><answer>B</answer>",  # format 1, acc 1
    "<answer>B</answer>",  # format 0, acc 1
    "<think>hmm</think><answer>A</answer> extra",  # format 0, acc 0
]


def test_weights_combine():
    specs = [{"name": "format", "weight": 0.5}, {"name": "accuracy", "weight": 2.0}]
    total, comps = compute_rewards(specs, MC_COMPLETIONS, MC_COLS)
    assert comps["format"] == [1.0, 0.0, 0.0]
    assert comps["accuracy"] == [1.0, 1.0, 0.0]
    assert total == pytest.approx([2.5, 2.0, 0.0])


def test_combined_reward_is_a_reward_function_and_breakdown():
    comb = CombinedReward(["format", {"name": "accuracy", "weight": 1}])
    assert comb.labels == ["format", "accuracy"]
    assert comb(MC_COMPLETIONS, **MC_COLS) == pytest.approx([2.0, 1.0, 0.0])
    b = comb.compute(MC_COMPLETIONS, MC_COLS)
    assert b.weights == {"format": 1.0, "accuracy": 1.0}
    assert b.means()["accuracy"] == pytest.approx(2 / 3)
    assert b.means()["total"] == pytest.approx(1.0)


def test_kwargs_and_labels(temp_rewards):
    specs = [
        {"name": "format", "label": "fmt_strict", "kwargs": {"mode": "think_answer"}},
        {"name": "format", "label": "fmt_answer", "weight": 0.1, "kwargs": {"mode": "answer"}},
    ]
    total, comps = compute_rewards(specs, MC_COMPLETIONS, MC_COLS)
    assert comps == {"fmt_strict": [1.0, 0.0, 0.0], "fmt_answer": [0.0, 1.0, 0.0]}
    assert total == pytest.approx([1.0, 0.1, 0.0])
    with pytest.raises(ConfigError, match="twice"):
        CombinedReward(["format", "format"])
    with pytest.raises(ConfigError, match="clash"):
        compute_rewards([{"name": "format", "kwargs": {"answer": 1}}], MC_COMPLETIONS, MC_COLS)


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"name": "format", "weight": "heavy"}, "weight"),
        ({"name": "format", "weight": float("inf")}, "weight"),
        ({"name": "format", "weight": True}, "weight"),
        ({"name": "format", "wieght": 2}, "'weight'"),  # unknown key suggests the right one
        ({"weight": 2}, "needs a 'name'"),
        ({"name": "format", "kwargs": [1]}, "kwargs"),
        (42, "must be a name or a mapping"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        CombinedReward([spec])


def test_empty_config_and_bad_columns():
    with pytest.raises(ConfigError, match="no reward"):
        CombinedReward([])
    with pytest.raises(ConfigError, match="'answer' has 2 values for 3"):
        compute_rewards(["format"], MC_COMPLETIONS, {**MC_COLS, "answer": ["B", "B"]})


def test_none_is_not_applicable_and_masked(temp_rewards):
    temp_rewards("t_sparse", lambda completions, **kw: [1.0, None, 0.5])
    comb = CombinedReward([{"name": "t_sparse", "weight": 2.0}, "format"])
    b = comb.compute(MC_COMPLETIONS, MC_COLS)
    assert b.components["t_sparse"] == [1.0, 0.0, 0.5]
    assert b.applicable["t_sparse"] == [True, False, True]
    assert b.applicable["format"] == [True, True, True]
    assert b.total == pytest.approx([3.0, 0.0, 1.0])
    assert b.means()["t_sparse"] == pytest.approx(0.75)  # mean over applicable samples only


def test_numpy_and_bool_results_are_accepted(temp_rewards):
    temp_rewards("t_np", lambda completions, **kw: np.array([1, 0, 1], dtype=np.float32))
    temp_rewards("t_bool", lambda completions, **kw: [True, False, True])
    total, _ = compute_rewards(["t_np", "t_bool"], MC_COMPLETIONS, MC_COLS)
    assert total == [2.0, 0.0, 2.0]


def test_exception_in_user_reward_names_reward_and_sample(temp_rewards):
    def fragile(completions, id, **kwargs):
        out = []
        for c, sid in zip(completions, id):
            if sid == "q2":
                raise KeyError("missing_field")
            out.append(1.0)
        return out

    temp_rewards("t_fragile", fragile)
    with pytest.raises(RewardError) as err:
        compute_rewards(["format", "t_fragile"], MC_COMPLETIONS, MC_COLS)
    e = err.value
    msg = str(e)
    assert "'t_fragile'" in msg and "'q2'" in msg and "index 1" in msg and "missing_field" in msg
    assert isinstance(e.__cause__, KeyError)
    assert (e.reward, e.sample_id, e.index) == ("t_fragile", "q2", 1)
    assert isinstance(e, MmrlError)


def test_group_level_failure_without_locating(temp_rewards):
    calls = []

    def group_only(completions, **kwargs):
        calls.append(len(completions))
        raise RuntimeError("group statistic failed")

    temp_rewards("t_group", group_only, locate_errors=False)
    with pytest.raises(RewardError, match=r"'t_group' failed on the batch: RuntimeError") as err:
        compute_rewards(["t_group"], MC_COMPLETIONS, MC_COLS)
    assert calls == [3]  # not re-run per sample
    assert isinstance(err.value.__cause__, RuntimeError)


def test_builtin_reward_error_names_the_sample():
    cols = {**MC_COLS, "answer": ["B", "Z", "C"]}  # bad gold answer on q2
    with pytest.raises(RewardError) as err:
        compute_rewards(["accuracy"], MC_COMPLETIONS, cols)
    assert (
        "'accuracy'" in str(err.value)
        and "'q2'" in str(err.value)
        and "not an option letter" in str(err.value)
    )
    assert isinstance(err.value.__cause__, ValueError)


@pytest.mark.parametrize(
    "result, match",
    [
        ([1.0, 2.0], "returned 2 values for 3 completions"),
        ([1.0, float("nan"), 0.0], r"non-finite value nan for sample id 'q2' \(index 1\)"),
        ([1.0, 0.0, float("inf")], "non-finite value inf for sample id 'q3'"),
        ([1.0, "good", 0.0], "non-number for sample id 'q2'"),
        (1.0, "expected a list of 3 floats"),
        (None, "expected a list"),
    ],
)
def test_bad_reward_results(temp_rewards, result, match):
    temp_rewards("t_bad", lambda completions, **kw: result)
    with pytest.raises(RewardError, match=match):
        compute_rewards(["t_bad"], MC_COMPLETIONS, MC_COLS)


def test_callables_in_specs():
    def anon(completions, **kw):
        return [0.25] * len(completions)

    total, comps = compute_rewards([{"name": anon, "weight": 4}], ["a", "b"], {})
    assert total == [1.0, 1.0] and comps == {"anon": [0.25, 0.25]}


# --------------------------------------------------------------------------------------------------------
# format
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>x</think><answer>B</answer>", True),
        ("<think>x\ny</think>\n\n<answer>B</answer>", True),
        ("  <think>x</think><answer>B</answer>\n", True),  # outer whitespace stripped by default
        ("<think></think><answer>B</answer>", True),  # empty think allowed
        ("<think>x</think><answer>  </answer>", False),  # empty answer rejected
        ("<think>x</think><answer>B</answer> trailing", False),
        ("preamble <think>x</think><answer>B</answer>", False),
        ("<answer>B</answer>", False),
        ("<think>x</think>", False),
        ("<think>x<think>y</think><answer>B</answer>", False),  # nested tag
        ("<think>x</think><answer>B</answer><answer>C</answer>", False),  # two answers
        ("<think>x</think>text<answer>B</answer>", False),
        ("<answer>B</answer><think>x</think>", False),
    ],
)
def test_format_default(text, expected):
    assert check_format(text) is expected
    assert get_reward("format")([text]) == [float(expected)]


def test_format_options():
    assert check_format("<answer>B</answer>", mode="answer")
    assert not check_format("<think>x</think><answer>B</answer>", mode="answer")
    assert check_format("<answer>B</answer>", mode="think_optional")
    assert check_format("<think>x</think><answer>B</answer>", mode="think_optional")
    assert check_format("<reasoning>x</reasoning><final>B</final>", think_tag="reasoning", answer_tag="final")
    assert not check_format("<think>x</think><answer>B</answer>", think_tag="reasoning", answer_tag="final")
    assert not check_format(" <think>x</think><answer>B</answer>", strip=False)
    assert check_format("<think>x</think><answer></answer>", allow_empty_answer=True)
    assert check_format("ANSWER=7", pattern=r"ANSWER=\d+")
    with pytest.raises(ValueError, match="format mode"):
        check_format("x", mode="loose")
    assert get_reward("format")(["<answer>B</answer>", "B"], mode="answer", id=["a", "b"]) == [1.0, 0.0]


# --------------------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------------------


def acc(completions, rows, **settings):
    cols = {k: [r.get(k) for r in rows] for k in ("id", "problem_type", "options", "answer", "meta")}
    return get_reward("accuracy")(completions, **cols, **settings)


def row(ptype, answer, options=None, meta=None, id="s"):
    return {"id": id, "problem_type": ptype, "answer": answer, "options": options, "meta": meta or {}}


def test_accuracy_multiple_choice():
    r = row("multiple_choice", "B", ["cat", "dog", "owl"])
    outs = [
        "<answer>B</answer>",
        "<answer>(B) dog</answer>",
        "<answer>dog</answer>",
        "<answer>A</answer>",
        "<answer>a dog barks</answer>",
        "<answer>D</answer>",
        "<answer>B or C</answer>",
        "no tags: B",
    ]
    assert acc(outs, [r] * len(outs)) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_accuracy_letter_outside_options_is_wrong():
    r = row("multiple_choice", "C", ["x", "y", "z"])
    assert acc(["<answer>E</answer>", "<answer>C</answer>"], [r, r]) == [0.0, 1.0]


def test_accuracy_yes_no():
    r = row("yes_no", "yes")
    outs = [
        "<answer>Yes</answer>",
        "<answer>no</answer>",
        "<answer>yes and no</answer>",
        "<answer>true</answer>",
    ]
    assert acc(outs, [r] * 4) == [1.0, 0.0, 0.0, 1.0]


def test_accuracy_numeric_tolerances():
    r = row("numeric", "3")
    outs = [
        "<answer>3</answer>",
        "<answer>3.0</answer>",
        "<answer>three</answer>",
        "<answer>3.2</answer>",
        "<answer>none</answer>",
    ]
    assert acc(outs, [r] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert acc(["<answer>3.2</answer>"], [r], abs_tol=0.25) == [1.0]
    assert acc(["<answer>3.2</answer>"], [r], rel_tol=0.1) == [1.0]
    assert acc(["<answer>3.2</answer>"], [r], rel_tol=0.05) == [0.0]
    got = acc(["<answer>2.4</answer>"], [r], numeric_scoring="relative_error")
    assert got == [pytest.approx(0.8)]
    assert acc(["<answer>100</answer>"], [r], numeric_scoring="relative_error") == [0.0]
    assert acc(["<answer>1,500</answer>"], [row("numeric", 1500)]) == [1.0]
    assert acc(["<answer>75%</answer>"], [row("numeric", "3/4")], percent="fraction") == [1.0]


def test_accuracy_open_uses_synonyms_and_metric():
    r = row("open", "pleural effusion", meta={"synonyms": ["fluid in the pleural space", "hydrothorax"]})
    assert acc(["<answer>Hydrothorax.</answer>"], [r]) == [1.0]
    assert acc(["<answer>The pleural effusion</answer>"], [r]) == [1.0]
    got = acc(["<answer>effusion</answer>"], [r])[0]
    assert got == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # P = 1, R = 1/2
    assert acc(["<answer>pneumothorax</answer>"], [r]) == [0.0]
    assert acc(["<answer>effusion pleural</answer>"], [r], open_metric="rouge_l") == [pytest.approx(0.5)]
    assert acc(["<answer>effusion pleural</answer>"], [r], open_metric="exact") == [0.0]
    with pytest.raises(ConfigError, match="'rouge_l'"):
        acc(["<answer>x</answer>"], [r], open_metric="rouge-l")


def test_accuracy_free_form_is_video_r1s_mean_rouge():
    r = row("free_form", "a man rides a red bike")
    # rouge-score's tokens (lower-case, stemmed): ref [a, man, ride, a, red, bike], prediction [man, ride, bike]
    # ROUGE-1: P 3/3, R 3/6 -> F 2/3; ROUGE-2: (man ride), (ride bike) vs 5 reference bigrams, 1 shared ->
    # P 1/2, R 1/5 -> F 2/7; ROUGE-L: LCS 3 -> F 2/3. Mean (2/3 + 2/7 + 2/3) / 3 = 34/63
    assert acc(["<answer>man rides bike</answer>"], [r]) == [pytest.approx(34 / 63)]
    assert acc(["<answer>man rides bike</answer>"], [r], free_form_metric="token_f1") == [
        pytest.approx(2 * 1 * 0.75 / 1.75)]  # the earlier metric, still a setting
    # Porter stemming: "dogs running" and "dog runs" are the same words
    assert acc(["<answer>dog runs</answer>"], [row("free_form", "dogs running")]) == [pytest.approx(1.0)]
    assert rouge_mean("dog runs", "dogs running", use_stemmer=False) == 0.0
    # [a, blue, car]: ROUGE-1 and ROUGE-L share "a": P 1/3, R 1/6 -> F 2/9; no shared bigram. Mean 4/27
    assert acc(["<answer>a blue car</answer>"], [r]) == [pytest.approx(4 / 27)]


def test_accuracy_ocr_is_one_minus_word_error_rate():
    r = row("ocr", "STOP HERE NOW")
    outs = ["<answer>STOP HERE NOW</answer>",        # 0 edits: 1
            "<answer>STOP THERE NOW</answer>",       # 1 substitution / 3 words: 2/3
            "<answer>STOP HERE</answer>",            # 1 deletion: 2/3
            "<answer>STOP HERE NOW PLEASE NOW</answer>",  # 2 insertions: 1/3
            "<answer>stop here now</answer>",        # case counts: 3 substitutions: 0
            "<answer>GO AWAY FROM HERE NOW PLEASE</answer>",  # 4 edits > 3 words: clipped to 0
            "<answer></answer>"]                     # 3 deletions: 0
    assert acc(outs, [r] * len(outs)) == [1.0, pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(1 / 3),
                                          0.0, 0.0, 0.0]
    assert word_error_rate("a b c d", "a x c") == pytest.approx(2 / 4)  # a substitution and a deletion
    assert word_error_rate("", "") == 0.0 and word_error_rate("", "extra") == 1.0  # over max(1, 0 words)
    assert ocr_score("", "") == 1.0


def test_accuracy_temporal_grounding():
    r = row("temporal_grounding", [0, 2])
    outs = [
        "<answer>[1, 3]</answer>",
        "<answer>from 0s to 2s</answer>",
        "<answer>soon</answer>",
        "<answer>3 to 1</answer>",
        "<answer>[5, 6]</answer>",
    ]
    assert acc(outs, [r] * 5) == [pytest.approx(1 / 3), 1.0, 0.0, 0.0, 0.0]
    clipped = row("temporal_grounding", [8, 10], meta={"duration": 10})
    assert acc(["<answer>8 to 14</answer>"], [clipped]) == [1.0]
    assert acc(["<answer>8 to 14</answer>"], [clipped], clip_to_duration=False) == [pytest.approx(2 / 6)]


def test_accuracy_mixed_batch_dispatches_per_sample():
    rows = [
        row("multiple_choice", "A", ["x", "y"], id="m"),
        row("yes_no", "no", id="y"),
        row("numeric", 10, id="n"),
        row("temporal_grounding", [0, 4], id="t"),
    ]
    outs = ["<answer>A</answer>", "<answer>No</answer>", "<answer>10</answer>", "<answer>[0, 2]</answer>"]
    assert acc(outs, rows) == [1.0, 1.0, 1.0, pytest.approx(0.5)]


def test_accuracy_unknown_type():
    r = row("multiple_choise", "A", ["x", "y"], id="typo")
    with pytest.raises(RewardError) as err:
        compute_rewards(["accuracy"], ["<answer>A</answer>"], {k: [v] for k, v in r.items()})
    assert "'multiple_choice'" in str(err.value) and "'typo'" in str(err.value)
    assert acc(["<answer>A</answer>"], [r], on_unknown_type="none") == [None]
    with pytest.raises(ConfigError, match="problem_type"):
        get_reward("accuracy")(["x"], answer=["A"])


def test_new_problem_type_by_registration():
    @register_scorer("counting_range")
    def counting_range(prediction, row, **settings):
        lo, hi = row["answer"]
        value = rewards.parse_number(prediction)
        return float(value is not None and lo <= value <= hi)

    try:
        rows = [row("counting_range", [3, 5]), row("counting_range", [3, 5])]
        assert acc(["<answer>4</answer>", "<answer>9</answer>"], rows) == [1.0, 0.0]
        assert "counting_range" in rewards.available_scorers()
        with pytest.raises(ConfigError, match="already registered"):
            register_scorer("counting_range", lambda p, r, **k: 0.0)
    finally:
        unregister_scorer("counting_range")


def test_custom_answer_tag_is_used_for_extraction():
    r = row("multiple_choice", "B", ["x", "y"])
    assert acc(["<final>B</final><answer>A</answer>"], [r], tag="final") == [1.0]
    assert acc(["<think>B</think> A"], [r]) == [0.0]  # the think block is not the answer


# --------------------------------------------------------------------------------------------------------
# separate metric rewards
# --------------------------------------------------------------------------------------------------------


def test_token_f1_and_rouge_rewards():
    cols = {"answer": ["the red ball", None], "meta": [{"synonyms": ["crimson ball"]}, {}], "id": ["a", "b"]}
    assert get_reward("token_f1")(["<answer>crimson ball</answer>", "x"], **cols) == [1.0, None]
    got = get_reward("rouge_l")(["<answer>ball red</answer>", "x"], **cols)
    assert got[0] == pytest.approx(0.5) and got[1] is None


def test_temporal_iou_reward():
    cols = {
        "problem_type": ["temporal_grounding", "multiple_choice", "temporal_grounding"],
        "answer": [[0, 2], "A", [10, 20]],
        "meta": [{}, {}, {}],
    }
    got = get_reward("temporal_iou")(["<answer>[1, 3]</answer>", "<answer>A</answer>", "none"], **cols)
    assert got == [pytest.approx(1 / 3), None, 0.0]
    # grounded QA: the span comes from another tag and the gold from meta
    cols = {"problem_type": ["multiple_choice"], "answer": ["A"], "meta": [{"gold_span": [2, 6]}]}
    got = get_reward("temporal_iou")(
        ["<answer>A</answer><glue>[(4, 6)]</glue>"], tag="glue", span_key="gold_span", **cols
    )
    assert got == [pytest.approx(0.5)]


# --------------------------------------------------------------------------------------------------------
# metrics, by hand
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ((0, 2), (1, 3), 1 / 3),
        ((1, 3), (0, 2), 1 / 3),
        ((0, 10), (2, 4), 0.2),
        ((0, 1), (1, 2), 0.0),  # touching
        ((0, 1), (5, 6), 0.0),  # disjoint
        ((2, 4), (2, 4), 1.0),
        ((3, 3), (3, 3), 1.0),  # degenerate but identical
        ((3, 3), (4, 4), 0.0),
        ((3, 3), (0, 6), 0.0),  # a point inside a span has no overlap length
    ],
)
def test_temporal_iou_values(pred, gold, expected):
    assert temporal_iou(pred, gold) == pytest.approx(expected)


def test_temporal_iou_rejects_inverted():
    with pytest.raises(ValueError):
        temporal_iou((3, 1), (0, 2))


def test_token_f1_values():
    # pred tokens: cat sat mat ; gold tokens: cat sat on mat  -> common 3, P 1, R 3/4
    assert token_f1("the cat sat mat", "The cat sat on the mat.") == pytest.approx(2 * 0.75 / 1.75)
    assert token_f1("red red", "red") == pytest.approx(2 * 0.5 * 1 / 1.5)  # multiset overlap 1
    assert token_f1("blue", "red") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("the", "red") == 0.0  # only an article left -> empty prediction
    assert token_f1(["a", "b"], ["b", "c"]) == pytest.approx(0.5)


def test_rouge_l_values():
    # LCS(a b c d e, a c e f) = a c e = 3; P = 3/5, R = 3/4; F = 2PR/(P+R) = 2/3
    assert lcs_length("abcde", "acef") == 3
    assert rouge_l("a1 b1 c1 d1 e1", "a1 c1 e1 f1") == pytest.approx(2 / 3)
    assert rouge_l("police killed the gunman", "police kill the gunman") == pytest.approx(2 / 3)
    assert rouge_l("the gunman kill police", "police kill the gunman") == pytest.approx(1 / 3)
    # beta weights recall: F = (1+b^2) P R / (R + b^2 P) with P = 3/5, R = 3/4, b = 2
    assert rouge_l("a1 b1 c1 d1 e1", "a1 c1 e1 f1", beta=2) == pytest.approx(
        5 * 0.6 * 0.75 / (0.75 + 4 * 0.6)
    )
    assert rouge_l("x", "y") == 0.0
    assert rouge_l("", "") == 1.0


# --------------------------------------------------------------------------------------------------------
# hygiene
# --------------------------------------------------------------------------------------------------------


def test_no_eval_or_exec_in_rewards_package():
    root = Path(rewards.__file__).parent
    sources = sorted(root.rglob("*.py"))
    assert len(sources) >= 5
    pattern = re.compile(r"(?<![\w.])(?:eval|exec|compile)\s*\(|literal_eval|__import__")
    offenders = [
        f"{p.name}:{i}"
        for p in sources
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_rewards_are_finite_on_junk():
    junk = ["", "<answer></answer>", "<answer>" + "x" * 5000, "<think>" * 50, "\x00\uffff", "1/0", "nan"]
    rows = [
        row("numeric", 1),
        row("multiple_choice", "A", ["p", "q"]),
        row("yes_no", "no"),
        row("open", "x"),
        row("temporal_grounding", [0, 1]),
        row("free_form", "y"),
        row("numeric", "2"),
    ]
    got = acc(junk, rows)
    assert all(isinstance(v, float) and math.isfinite(v) for v in got)
