"""Benchmark scoring against hand-computed values, including unparseable outputs."""

import pytest

from data_pipelines.schema import Sample
from mmrl.benchmarks.protocols import MVBENCH_PREFILL, build_prompt, make_protocol, subtitle_lines
from mmrl.benchmarks.scoring import score_item, summarize


def mc(answer: str, options=("red", "green", "blue", "yellow"), **meta) -> Sample:
    return Sample(id="q", problem_type="multiple_choice", question="What colour?", options=list(options),
                  answer=answer, meta=meta)


def test_mvbench_prefill_reads_first_line_and_flags_empty() -> None:
    s = mc("B")
    assert score_item(s, "B) green\nmore text (C)", benchmark="mvbench", prefill=MVBENCH_PREFILL) == {
        "pred": "B", "parsed": True, "correct": True, "n_options": 4}
    # the official check_ans would count "(" as correct for every question; mmrl counts it unparsed
    assert score_item(s, "", benchmark="mvbench", prefill=MVBENCH_PREFILL) == {
        "pred": None, "parsed": False, "correct": False, "n_options": 4}


@pytest.mark.parametrize("text, pred", [
    ("The best answer is C.", "C"), ("<think>maybe A</think><answer>D</answer>", "D"), ("(b)", "B"),
    ("A red circle moves across the screen from the left to the right side slowly", None), ("E", None),
])
def test_videomme_extraction(text, pred) -> None:
    s = mc("C", options=["A. red", "B. green", "C. blue", "D. yellow"])
    out = score_item(s, text, benchmark="videomme")
    assert out["pred"] == pred and out["parsed"] == (pred is not None) and out["correct"] == (pred == "C")


def _rec(correct, parsed, n_options=4, **group):
    return {"correct": correct, "parsed": parsed, "n_options": n_options, "group": group}


def test_videomme_headline_counts_every_question_and_names_the_official_scorers_figure() -> None:
    preds = [_rec(True, True, duration="short"), _rec(True, True, duration="short"),
             _rec(False, True, duration="long"), _rec(False, False, duration="long"),
             _rec(False, False, duration="long")]
    m = summarize("videomme", preds)
    assert m["overall"]["accuracy"] == pytest.approx(2 / 5)
    assert m["overall"]["accuracy_answered"] == pytest.approx(2 / 3)
    assert m["headline"]["metric"] == "accuracy" and m["headline"]["value"] == pytest.approx(2 / 5)
    assert m["beside"]["accuracy_answered"]["value"] == pytest.approx(2 / 3)
    assert "Video-MME's official scorer" in m["beside"]["accuracy_answered"]["convention"]
    assert m["by_duration"]["short"]["accuracy"] == 1.0
    assert m["by_duration"]["long"] == {"n": 3, "correct": 0, "answered": 1, "unparsed": 2, "errors": 0,
                                        "accuracy": 0.0, "accuracy_answered": 0.0, "random_unparsed": 0.5 / 3}


def test_mvbench_headline_is_the_task_mean_with_the_overall_share_beside() -> None:
    preds = [_rec(True, True, task="a"), _rec(True, True, task="b"), _rec(False, True, task="b"),
             _rec(False, False, task="b")]
    m = summarize("mvbench", preds)
    assert m["headline"]["metric"] == "task_mean"
    assert m["headline"]["value"] == m["task_mean"] == pytest.approx((1 + 1 / 3) / 2)
    assert m["beside"]["overall_share"]["value"] == m["overall"]["accuracy"] == 0.5  # 2 of 4 questions
    assert m["by_task"]["b"]["unparsed"] == 1


def test_longvideobench_counts_unparsed_wrong_and_gives_lmms_evals_random_option_beside() -> None:
    # 5 questions: 2 right, 1 wrong, 2 unparsed (one of 4 options, one of 5): lmms-eval would guess those
    preds = [_rec(True, True), _rec(True, True), _rec(False, True), _rec(False, False, n_options=4),
             _rec(False, False, n_options=5)]
    m = summarize("longvideobench", preds)
    assert m["headline"]["metric"] == "accuracy" and m["headline"]["value"] == pytest.approx(2 / 5)
    assert m["beside"]["random_unparsed"]["value"] == pytest.approx((2 + 1 / 4 + 1 / 5) / 5)


def test_results_md_leads_with_the_headline_and_lists_failed_media() -> None:
    from mmrl.benchmarks.report import markdown

    preds = [_rec(True, True, task="a"), _rec(False, True, task="b"), _rec(True, True, task="b")]
    metrics = {"title": "MVBench", "model": "m", "protocol_text": "protocol official", "split": "test", "n": 3,
               "scores": summarize("mvbench", preds), "on_bad_sample": "raise",
               "media_failures": [{"id": "b/9", "error": "media not found: b/9.mp4"}]}
    md = markdown(metrics)
    first = md.split("\n")[4]
    assert first.startswith("**MVBench: 75.0**") and "task_mean" in first  # (1 + 1/2) / 2
    assert "| overall_share: " in md and "66.7" in md
    assert "1 question(s) without readable media, counted wrong" in md and "`b/9`" in md


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


def test_lmms_eval_protocol_prompts_and_settings() -> None:
    v = mc("C", options=["A. red", "B. green", "C. blue", "D. yellow"])
    p = make_protocol("videomme", "lmms-eval")
    assert (p.video_policy, p.nframes, p.max_new_tokens, p.temperature) == ("lmms-eval", 32, 16, 0.0)
    assert (p.video_min_pixels, p.video_max_pixels) == (256 * 28 * 28, 1605632)
    system, text, prefill = build_prompt(v, p)
    assert system == "You are a helpful assistant." and prefill == ""
    assert text == ("Select the best answer to the following multiple-choice question based on the video and the "
                    "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.\nWhat colour?\n"
                    "A. red\nB. green\nC. blue\nD. yellow\n\nAnswer with the option's letter from the given "
                    "choices directly.")
    _, text, _ = build_prompt(v, p, subtitles="hi")
    assert text.startswith("This video's subtitles are listed below: \nhi\nSelect") and text.endswith("The best answer is:")
    _, text, prefill = build_prompt(mc("B"), make_protocol("mvbench", "lmms-eval"))
    assert text == "Question:What colour?\nOption:\n(A) red\n(B) green\n(C) blue\n(D) yellow\nOnly give the best option.\n"
    assert prefill == ""  # no "Best option:(" pre-fill in lmms-eval
    _, text, _ = build_prompt(mc("A", options=["x", "y"]), make_protocol("mmvu", "lmms-eval"))
    assert "\nA: x\nB: y\nC: \nD: \nE: \nVisual Information" in text
    assert make_protocol("mmvu", "lmms-eval").temperature == 0.7
    assert make_protocol("longvideobench", "lmms-eval").max_new_tokens == 32
    with pytest.raises(Exception, match="lmms-eval is written down for"):
        make_protocol("slake", "lmms-eval")


def test_lmms_eval_frames_keep_the_size_chosen_for_all_decoded_frames() -> None:
    from mmrl.benchmarks.media import lmms_eval_decoded, lmms_eval_indices

    # a 60 s clip at 30 fps: qwen-vl-utils decodes 120 frames at 2 fps, lmms-eval keeps 32 of them
    decoded = lmms_eval_decoded(1800, 30.0)
    kept = lmms_eval_indices(1800, 30.0, nframes=32)
    assert len(decoded) == 120 and len(kept) == 32 and set(kept) <= set(decoded)
    assert kept[0] == decoded[0] and kept[-1] == decoded[-1]
    # a 1 s clip: 4 frames decoded (the minimum), so only 4 are kept
    assert len(lmms_eval_indices(30, 30.0, nframes=32)) == 4


def test_longvideobench_subtitles_interleave_with_frames() -> None:
    from mmrl.benchmarks.protocols import interleave_subtitles

    frames = [0.0, 2.0, 4.0, 6.0]
    cues = [(0.5, 1.5, "hello"), (2.5, 2.6, "short"), (10.0, 12.0, "late"), (4.5, 7.0, "end")]
    # "hello" (mid 1.0) after frame 0 and covered by no frame strictly inside (0.5, 1.5): dropped;
    # "short" widened to (2.05, 3.05): no frame inside, dropped; "late" (mid 11) places every frame before it
    # and covers none; "end" covers frame 6.0, so it follows, after every frame (cues keep the file's order)
    assert interleave_subtitles(cues, frames) == [0, 1, 2, 3, "end"]
    cues = [(0.0, 3.0, "a"), (3.5, 5.0, "b")]
    assert interleave_subtitles(cues, frames) == [0, "a", 1, 2, "b", 3]  # "a" (mid 1.5) shows frame 2.0


def test_subtitles_at_sampled_frames() -> None:
    cues = [(0.0, 0.9, "one"), (1.0, 1.9, "two"), (5.0, 6.0, "three")]
    assert subtitle_lines(cues, [0.5, 1.5, 1.6]) == "one\ntwo"
    assert subtitle_lines(cues, [3.0]) == "No subtitles available"


def test_protocol_defaults_and_overrides() -> None:
    p = make_protocol("mvbench")
    assert (p.video_policy, p.nframes, p.max_new_tokens) == ("segments", 16, 100)
    q = make_protocol("videomme", "qwen", frames=8, max_pixels=3136)
    assert make_protocol("videomme", "lmms-eval", frames=16).nframes == 16
    assert (q.video_policy, q.nframes, q.total_pixels) == ("qwen", 8, 24576 * 28 * 28)
    assert q.video_max_pixels == q.image_max_pixels == 3136 and q.video_min_pixels <= 3136
    assert make_protocol("videomme", "qwen", family="qwen3_vl").total_pixels == 24576 * 32 * 32


def test_every_registered_benchmark_has_an_official_protocol() -> None:
    from data_pipelines.benchmarks import available_benchmarks

    for name in available_benchmarks():
        p = make_protocol(name)
        assert p.benchmark == name and p.max_new_tokens > 0
