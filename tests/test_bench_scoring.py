"""Benchmark scoring against hand-computed values, including unparseable outputs."""

import pytest

from data_pipelines.schema import Sample
from mmrl.benchmarks_eval.protocols import MVBENCH_PREFILL, build_prompt, make_protocol, subtitle_lines
from mmrl.benchmarks_eval.scoring import score_item, summarize


def mc(answer: str, options=("red", "green", "blue", "yellow"), **meta) -> Sample:
    return Sample(id="q", problem_type="multiple_choice", question="What colour?", options=list(options),
                  answer=answer, meta=meta)


def test_mvbench_prefill_reads_first_line_and_flags_empty() -> None:
    s = mc("B")
    assert score_item(s, "B) green\nmore text (C)", benchmark="mvbench", prefill=MVBENCH_PREFILL) == {
        "pred": "B", "parsed": True, "correct": True}
    # the official check_ans would count "(" as correct for every question; mmrl counts it unparsed
    assert score_item(s, "", benchmark="mvbench", prefill=MVBENCH_PREFILL) == {
        "pred": None, "parsed": False, "correct": False}


@pytest.mark.parametrize("text, pred", [
    ("The best answer is C.", "C"), ("<think>maybe A</think><answer>D</answer>", "D"), ("(b)", "B"),
    ("A red circle moves across the screen from the left to the right side slowly", None), ("E", None),
])
def test_videomme_extraction(text, pred) -> None:
    s = mc("C", options=["A. red", "B. green", "C. blue", "D. yellow"])
    out = score_item(s, text, benchmark="videomme")
    assert out["pred"] == pred and out["parsed"] == (pred is not None) and out["correct"] == (pred == "C")


def _rec(correct, parsed, **group):
    return {"correct": correct, "parsed": parsed, "group": group}


def test_videomme_strict_and_answered_only() -> None:
    preds = [_rec(True, True, duration="short"), _rec(True, True, duration="short"),
             _rec(False, True, duration="long"), _rec(False, False, duration="long"),
             _rec(False, False, duration="long")]
    m = summarize("videomme", preds)
    assert m["overall"]["accuracy"] == pytest.approx(2 / 5)
    assert m["overall"]["accuracy_answered"] == pytest.approx(2 / 3)
    assert m["official_metric"] == "accuracy_answered" and m["official"] == pytest.approx(2 / 3)
    assert m["by_duration"]["short"]["accuracy"] == 1.0
    assert m["by_duration"]["long"] == {"n": 3, "correct": 0, "answered": 1, "unparsed": 2, "errors": 0,
                                        "accuracy": 0.0, "accuracy_answered": 0.0}


def test_mvbench_micro_average_and_task_mean() -> None:
    preds = [_rec(True, True, task="a"), _rec(True, True, task="b"), _rec(False, True, task="b"),
             _rec(False, False, task="b")]
    m = summarize("mvbench", preds)
    assert m["official"] == m["overall"]["accuracy"] == 0.5  # 2 of 4 questions
    assert m["task_mean"] == pytest.approx((1 + 1 / 3) / 2)
    assert m["by_task"]["b"]["unparsed"] == 1


def test_medical_closed_and_open() -> None:
    yes = Sample(id="1", problem_type="yes_no", question="Lesion?", answer="yes", meta={"answer_type": "closed"})
    no = Sample(id="2", problem_type="yes_no", question="Lesion?", answer="no", meta={"answer_type": "closed"})
    ct = Sample(id="3", problem_type="open", question="Modality?", answer="CT", meta={"answer_type": "closed"})
    op = Sample(id="4", problem_type="open", question="Where?", answer="upper left", meta={"answer_type": "open"})
    r1 = score_item(yes, "Yes, there is a lesion.", benchmark="slake")
    r2 = score_item(no, "yes and no", benchmark="slake")  # hedged: unparsed for the extractor, a LLaVA-Med hit
    r3 = score_item(ct, "It is a CT scan", benchmark="slake")
    r4 = score_item(op, "The lesion is in the upper left", benchmark="slake")
    assert (r1["correct"], r1["hit"]) == (True, True)
    assert (r2["parsed"], r2["correct"], r2["hit"]) == (False, False, True)
    assert (r3["correct"], r3["hit"]) == (False, True)
    # pred tokens: lesion is in upper left; ref: upper left -> tp 2, fp 3, fn 0
    assert r4["recall"] == 1.0 and r4["precision"] == pytest.approx(0.4)
    assert r4["f1"] == pytest.approx(2 * 0.4 / 1.4) and r4["bleu1"] == pytest.approx(0.4)
    assert r4["token_f1"] == pytest.approx(2 * 0.4 / 1.4) and r4["exact"] is False
    preds = [dict(r, answer_type=s.meta["answer_type"], group={}) for r, s in ((r1, yes), (r2, no), (r3, ct), (r4, op))]
    m = summarize("slake", preds)
    assert m["closed"]["n"] == 3 and m["closed"]["accuracy"] == pytest.approx(1 / 3)
    assert m["closed"]["hit"] == 1.0 and m["closed"]["unparsed"] == 1
    assert m["open"]["n"] == 1 and m["open"]["recall"] == 1.0


def test_official_prompts() -> None:
    s = mc("B")
    system, text, prefill = build_prompt(s, make_protocol("mvbench"))
    assert system.startswith("Carefully watch the video") and prefill == "Best option:("
    assert text == ("Question: What colour?\nOptions:\n(A) red\n(B) green\n(C) blue\n(D) yellow\n"
                    "Only give the best option.")
    v = mc("C", options=["A. red", "B. green", "C. blue", "D. yellow"])
    _, text, prefill = build_prompt(v, make_protocol("videomme"), subtitles="hello")
    assert text.startswith("This video's subtitles are listed below:\nhello\nSelect the best answer")
    assert text.endswith("A. red\nB. green\nC. blue\nD. yellow\nThe best answer is:") and prefill == ""
    _, text, _ = build_prompt(v, make_protocol("videomme", "qwen"))
    assert "A. red\n" in text and "A. A." not in text
    _, text, _ = build_prompt(mc("A", options=["x", "y"]), make_protocol("mmvu"))
    assert text.startswith("Question:What colour?\nA: x\nB: y\nVisual Information: processed video\n")


def test_subtitles_at_sampled_frames() -> None:
    cues = [(0.0, 0.9, "one"), (1.0, 1.9, "two"), (5.0, 6.0, "three")]
    assert subtitle_lines(cues, [0.5, 1.5, 1.6]) == "one\ntwo"
    assert subtitle_lines(cues, [3.0]) == "No subtitles available"


def test_protocol_defaults_and_overrides() -> None:
    p = make_protocol("mvbench")
    assert (p.video_policy, p.nframes, p.max_new_tokens) == ("segments", 16, 100)
    q = make_protocol("videomme", "qwen", frames=8, max_pixels=3136)
    assert (q.video_policy, q.nframes, q.total_pixels) == ("qwen", 8, 24576 * 28 * 28)
    assert q.video_max_pixels == q.image_max_pixels == 3136 and q.video_min_pixels <= 3136
    assert make_protocol("videomme", "qwen", family="qwen3_vl").total_pixels == 24576 * 32 * 32


def test_every_registered_benchmark_has_an_official_protocol() -> None:
    from data_pipelines.benchmarks import available_benchmarks

    for name in available_benchmarks():
        p = make_protocol(name)
        assert p.benchmark == name and p.max_new_tokens > 0
