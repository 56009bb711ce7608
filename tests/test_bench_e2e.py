"""End to end: every benchmark fixture (public layout, toy media) evaluated with a tiny Qwen2.5-VL model;
resume after a kill; settings guard; the CLI; folders written the way ``mmrl train`` writes them."""

import json
from pathlib import Path

import pytest

from data_pipelines.benchmarks import load_benchmark
from data_pipelines.benchmarks.fixtures import write_fixture
from mmrl.benchmarks import read_predictions, run_benchmark, summarize
from mmrl.model import load_policy
from mmrl.toy.tiny_models import ensure_tiny
from mmrl_common.errors import MmrlError

BENCHMARKS = ("mvbench", "videomme", "longvideobench", "mmvu", "vqa-rad", "pathvqa", "slake", "toy")
FAST = {"frames": 4, "max_pixels": 56 * 56, "max_new_tokens": 6, "batch_size": 2, "workers": 1,
        "show_progress": False}


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny("qwen2_5_vl")


@pytest.fixture(scope="module")
def policy(tiny):
    return load_policy(tiny)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fixtures")
    return {n: write_fixture(n, base / n, n=4) for n in BENCHMARKS}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_end_to_end(name, roots, tiny, policy, tmp_path) -> None:
    frames = None if name == "longvideobench" else FAST["frames"]  # LVB: its own rule, int(2 s) = 2 frames
    m = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path, **{**FAST, "frames": frames})
    samples = load_benchmark(name, roots[name], media_cache=tmp_path / "m").samples
    preds = read_predictions(tmp_path / "predictions.jsonl")
    assert [p["id"] for p in preds] == [s.id for s in samples] and m["n"] == len(samples)
    # the video fixtures hold one question whose video is missing: an error record, every other one answered
    missing = {s.id for s in samples if s.meta.get("missing_media")}
    assert {p["id"] for p in preds if p.get("error")} == missing
    assert len(missing) == (1 if name in ("mvbench", "videomme", "longvideobench", "mmvu") else 0)
    assert all(isinstance(p["completion"], str) for p in preds if p["id"] not in missing)
    assert json.loads((tmp_path / "metrics.json").read_text())["scores"] == summarize(name, preds) == m["scores"]
    results = (tmp_path / "results.md").read_text()
    assert results.startswith("# ")
    # the literature's headline leads, named: MVBench the mean of task accuracies, the others every question
    literature = {"mvbench": "task_mean", "videomme": "accuracy", "longvideobench": "accuracy", "mmvu": "accuracy"}
    if name in literature:
        metric = literature[name]
        assert m["scores"]["headline"]["metric"] == metric
        lead = next(line for line in results.splitlines() if line.startswith("**"))
        assert lead.startswith(f"**{m['title']}: ") and f"`{metric}`" in lead
    if name in ("mvbench", "videomme", "mmvu"):
        assert {p["frames"] for p in preds if p["id"] not in missing} == {4}
    if name == "longvideobench":
        assert {p["frames"] for p in preds if p["id"] not in missing} == {2}
    if name == "mvbench":
        assert set(m["scores"]["by_task"]) == {"action_sequence", "object_existence", "episodic_reasoning"}
    if name == "videomme":
        assert set(m["scores"]["by_duration"]) == {"short", "medium"} and "by_task_type" in m["scores"]
    if name in ("vqa-rad", "pathvqa", "slake"):
        assert m["scores"]["closed"]["n"] == 1 and m["scores"]["open"]["n"] == 3


def test_killed_midway_resumes_without_recomputing(roots, tiny, policy, tmp_path) -> None:
    class Killed(Exception):
        pass

    def kill(_n):
        raise Killed

    full = tmp_path / "full"
    v0 = policy.vision_calls
    run_benchmark("mvbench", roots["mvbench"], tiny, policy=policy, out=full, **FAST)
    calls_full = policy.vision_calls - v0

    out = tmp_path / "killed"
    with pytest.raises(Killed):
        run_benchmark("mvbench", roots["mvbench"], tiny, policy=policy, out=out, on_batch=kill, **FAST)
    first = (out / "predictions.jsonl").read_bytes()
    assert len(first.splitlines()) == 2 and not (out / "metrics.json").exists()
    with open(out / "predictions.jsonl", "ab") as fh:  # a line cut by the kill
        fh.write(b'{"id": "object_existence/0", "compl')
    v1 = policy.vision_calls
    m = run_benchmark("mvbench", roots["mvbench"], tiny, policy=policy, out=out, **FAST)
    assert policy.vision_calls - v1 == calls_full // 2  # only the two unfinished questions ran
    assert m["timing"]["resumed"] == 2 and m["timing"]["generated_this_run"] == 2
    again = (out / "predictions.jsonl").read_bytes()
    assert again.startswith(first) and len(again.splitlines()) == 5  # 4 answered, the missing video's error
    assert (out / "predictions.jsonl").read_text() == (full / "predictions.jsonl").read_text()  # greedy, same
    v2 = policy.vision_calls
    m = run_benchmark("mvbench", roots["mvbench"], tiny, policy=policy, out=out, **FAST)
    assert policy.vision_calls == v2 and m["timing"]["generated_this_run"] == 0 and m["n"] == 5
    with pytest.raises(MmrlError, match="other settings.*nframes"):
        run_benchmark("mvbench", roots["mvbench"], tiny, policy=policy, out=out, **{**FAST, "frames": 6})


def test_qwen_protocol_with_subtitles(roots, tiny, policy, tmp_path) -> None:
    m = run_benchmark("videomme", roots["videomme"], tiny, policy=policy, out=tmp_path, protocol="qwen",
                      subtitles=True, **FAST)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["protocol"]["video_policy"] == "qwen" and run["protocol"]["total_pixels"] == 24576 * 28 * 28
    assert m["n"] == 5 and m["subtitles"] is True


def test_cli_on_a_train_style_checkpoint(roots, policy, tmp_path, capsys) -> None:
    from mmrl.cli import main
    from mmrl.engine.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "run", 3, policy.model, policy.processor, state={})
    args = ["eval", "--benchmark", "slake", "--data-root", str(roots["slake"]), "--model", str(ckpt),
            "--out", str(tmp_path / "out"), "--limit", "2", "--frames", "4", "--max-pixels", "3136",
            "--batch-size", "2", "--workers", "0", "--quiet", "eval.max_new_tokens=6"]
    assert main(args) == 0
    assert "SLAKE: closed accuracy" in capsys.readouterr().out
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["n"] == 2 and m["limit"] == 2 and m["model"] == str(ckpt.resolve())
    assert main(args[:4] + [str(tmp_path / "missing")] + args[5:]) == 2
    err = capsys.readouterr().err
    assert "error: SLAKE: --data-root folder not found" in err and "imgs/<img_name>" in err


@pytest.mark.parametrize("name", ("mvbench", "videomme", "longvideobench", "mmvu"))
def test_lmms_eval_protocol_runs_on_each_fixture(name, roots, tiny, policy, tmp_path) -> None:
    m = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path, protocol="lmms-eval", **FAST)
    assert m["protocol"]["name"] == "lmms-eval" and m["protocol"]["video_policy"] == "lmms-eval"
    preds = [p for p in read_predictions(tmp_path / "predictions.jsonl") if not p.get("error")]
    assert preds and all(0 < p["frames"] <= FAST["frames"] for p in preds)
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>"
    assert all(p["prompt"].startswith(system) for p in preds)
    if name == "mvbench":
        assert all("\nOption:\n(A) " in p["prompt"] and "Best option:(" not in p["prompt"] for p in preds)
    if name == "mmvu":  # lmms-eval's MMVU task samples at temperature 0.7: one seeded stream per question
        again = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path / "again", protocol="lmms-eval",
                              **{**FAST, "batch_size": 1})
        assert again["scores"] == m["scores"]
        assert ([p["completion"] for p in read_predictions(tmp_path / "again" / "predictions.jsonl")]
                == [p["completion"] for p in read_predictions(tmp_path / "predictions.jsonl")])


@pytest.mark.parametrize("name", ("mvbench", "videomme", "longvideobench", "mmvu"))
def test_a_missing_video_is_counted_wrong_and_listed_or_skipped(name, roots, tiny, policy, tmp_path) -> None:
    data = load_benchmark(name, roots[name], media_cache=tmp_path / "m")
    missing = [s.id for s in data.samples if s.meta.get("missing_media")]
    assert len(missing) == 1 and data.info["missing_media"]
    m = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path / "raise", **FAST)
    assert m["n"] == len(data.samples) and [f["id"] for f in m["media_failures"]] == missing
    assert m["scores"]["overall"]["errors"] == 1 and m["scores"]["overall"]["unparsed"] >= 1
    assert missing[0] in (tmp_path / "raise" / "results.md").read_text()
    s = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path / "skip", on_bad_sample="skip", **FAST)
    assert s["n"] == len(data.samples) - 1 and [f["id"] for f in s["media_failures"]] == missing
    assert s["scores"]["overall"]["errors"] == 0
    assert "left out (data.on_bad_sample=skip)" in (tmp_path / "skip" / "results.md").read_text()


def test_longvideobench_subtitles_are_interleaved_with_the_frames(roots, tiny, policy, tmp_path) -> None:
    from data_pipelines.benchmarks.lvb import lvb_subtitles

    m = run_benchmark("longvideobench", roots["longvideobench"], tiny, policy=policy, out=tmp_path, subtitles=True,
                      **{**FAST, "frames": None})
    data = load_benchmark("longvideobench", roots["longvideobench"], media_cache=tmp_path / "m")
    with_subs = {s.id: lvb_subtitles(s) for s in data.samples if s.meta.get("subtitle_path")}
    preds = {p["id"]: p for p in read_predictions(tmp_path / "predictions.jsonl") if not p.get("error")}
    assert m["subtitles"] is True and with_subs and set(with_subs) <= set(preds)
    for qid, cues in with_subs.items():
        prompt = preds[qid]["prompt"]
        assert "<|video_pad|>" not in prompt and prompt.count("<|image_pad|>") == preds[qid]["frames"]
        shown = [text for _, _, text in cues if text in prompt]
        assert shown, "a subtitle that some frame falls inside is shown"
        # each one shown sits between frames, before the question
        assert all(prompt.index(t) < prompt.index("Question:") for t in shown)
        first_image = prompt.index("<|image_pad|>")
        assert all(prompt.index(t) > first_image for t in shown)


# ------------------------------------------------------------------------------------------ evaluation checks
LETTERS = "ABCDEFGH"


def _reversed_check_rows(samples, rows, ask, **_):
    """A check for the tests: asks each multiple-choice question again unchanged, and with its options in
    reverse order and the answer forced to start with ``(C)``-style text naming C."""
    from dataclasses import replace

    from mmrl.benchmarks.protocols import shuffled_options

    mc = [i for i, s in enumerate(samples) if s.problem_type == "multiple_choice"]
    perm = {i: list(range(len(samples[i].options)))[::-1] for i in mc}
    requests = [(i, samples[i], "") for i in mc]
    requests += [(i, replace(samples[i], options=shuffled_options(list(samples[i].options), perm[i])), "C) ")
                 for i in mc]
    answers = ask(requests)
    for (i, _, prefix), a in zip(requests, answers):
        rows[i]["same" if not prefix else "reversed"] = a
        rows[i]["perm"] = perm[i]


def _register_test_check() -> None:
    from mmrl.engine.evaluate import CHECKS, register_check

    if "reask_test" not in CHECKS:
        register_check("reask_test", summarize=lambda preds: {"n": sum("same" in p for p in preds)},
                       describe=lambda c: [f"re-asked {c['n']} questions"],
                       benchmark=_reversed_check_rows)(lambda *a, **kw: None)


@pytest.mark.parametrize("name", ("mvbench", "videomme"))
def test_a_check_reasks_under_the_benchmarks_protocol(name, roots, tiny, policy, tmp_path) -> None:
    """A check's ``ask`` renders the question under the benchmark's own protocol with the media the first pass
    decoded: unchanged, it reproduces the first prompt and greedy answer exactly; with the options reordered
    (Video-MME's "A. ..." labels re-lettered) only the option lines change; a forced start is part of the
    answer the benchmark reads. The check's fields are in the records, its section in metrics and results.md;
    a folder made with a check resumes with it and refuses a run without it."""
    from mmrl.benchmarks.protocols import plain_options

    _register_test_check()
    m = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path, checks={"reask_test": {}}, **FAST)
    preds = read_predictions(tmp_path / "predictions.jsonl")
    samples = {s.id: s for s in load_benchmark(name, roots[name], media_cache=tmp_path / "m").samples}
    asked = [p for p in preds if "same" in p]
    assert len(asked) == len([p for p in preds if not p.get("error")]) >= 3  # every answered question (all MC)
    label = "({letter}) {text}" if name == "mvbench" else "{letter}. {text}"
    for p in asked:
        assert p["same"]["prompt"] == p["prompt"] and p["same"]["completion"] == p["completion"]
        assert p["same"]["pred"] == p["pred"]
        plain = plain_options(samples[p["id"]].options)
        before = "\n".join(label.format(letter=LETTERS[k], text=t) for k, t in enumerate(plain))
        after = "\n".join(label.format(letter=LETTERS[j], text=plain[k]) for j, k in enumerate(p["perm"]))
        assert before in p["prompt"] and before != after
        assert p["reversed"]["prompt"] == p["prompt"].replace(before, after) + "C) "
        assert p["reversed"]["completion"].startswith("C) ") and p["reversed"]["pred"] == "C"
    assert m["reask_test"] == {"n": len(asked)} and m["checks"]["reask_test"] == [f"re-asked {len(asked)} questions"]
    assert f"## reask test\n\nre-asked {len(asked)} questions" in (tmp_path / "results.md").read_text()
    again = run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path, checks={"reask_test": {}}, **FAST)
    assert again["timing"]["generated_this_run"] == 0 and again["reask_test"] == m["reask_test"]
    with pytest.raises(MmrlError, match="other settings.*checks"):
        run_benchmark(name, roots[name], tiny, policy=policy, out=tmp_path, **FAST)


def test_the_consistency_check_on_a_benchmark_from_the_cli(roots, tiny, tmp_path, capsys) -> None:
    """``mmrl eval --benchmark NAME --consistency``: ACRE's option-shuffling check under the benchmark's protocol
    (every multiple-choice record gets its permutation and case; the section is printed and written); a check
    with no benchmark form is refused by name."""
    from mmrl.cli import main
    from rewards.consistency import consistency_case

    args = ["eval", "--benchmark", "mvbench", "--data-root", str(roots["mvbench"]), "--model", str(tiny),
            "--out", str(tmp_path / "out"), "--frames", "4", "--max-pixels", "3136", "--batch-size", "2",
            "--workers", "0", "--quiet", "eval.max_new_tokens=6"]
    assert main([*args, "--consistency"]) == 0
    assert "option-shuffling consistency (OSCR)" in capsys.readouterr().out
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    preds = [p for p in read_predictions(tmp_path / "out" / "predictions.jsonl") if not p.get("error")]
    assert m["consistency"]["n"] == len(preds) == 4
    for p in preds:
        perm = p["permutation"]
        assert sorted(perm) == list(range(p["n_options"])) and perm != sorted(perm)
        assert p["letter"] == p["pred"] and p["gold_letter"] == p["answer"]
        assert p["case"] == consistency_case(p["letter"], p["shuffled_letter"], p["gold_letter"])
        assert ("shuffled_prompt" in p) == (p["letter"] is not None)
    assert "## consistency" in (tmp_path / "out" / "results.md").read_text()
    assert main([*args[:8], str(tmp_path / "other"), *args[9:], "--shuffled-frames"]) == 2
    assert "'shuffled_frames' has no benchmark form" in capsys.readouterr().err
