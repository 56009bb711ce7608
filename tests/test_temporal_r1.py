"""Temporal-R1's dual reward (both timestamp forms, the paper's tIoU by hand, clipping to the clip shown as a
switch, degenerate spans, grounded QA)
and `mmrl data select-variance` on a small set."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_runs import STOP_AT, TINY_RUN, StopRun, module_cache  # noqa: F401 (module_cache is a fixture)

from data_pipelines.schema import MediaItem
from mmrl import cli
from rewards.registry import CombinedReward, register_reward
from rewards.temporal import clip_window, shown_window

GOLD = [2.0, 4.0]
META = {"video": {"duration": 8.0}}


def tr1(completions, *, answer=GOLD, meta=META, problem_type="temporal_grounding", options=None, media=None,
        **kwargs):
    n = len(completions)
    logged: dict[str, float] = {}
    columns = {"problem_type": [problem_type] * n, "answer": [answer] * n, "meta": [meta] * n,
               "options": [options] * n, "id": [f"s{i}" for i in range(n)],
               "log_metric": lambda k, v: logged.__setitem__(k, v)}
    if media is not None:
        columns["rollout_batch"] = _Batch([SimpleNamespace(media=media)] * n)
    values = CombinedReward([{"name": "temporal_r1", "kwargs": kwargs}]).compute(completions, columns)
    return values.components["temporal_r1"], logged


class _Batch:
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)


def test_both_timestamp_forms_score_the_same() -> None:
    forms = ["<think>the disc shows at 2 s</think><answer>[2.0, 4.0]</answer>",
             '<think>x</think><answer>{"start_time": "2.0", "end_time": "4.0"}</answer>',
             "<think>x</think><answer>2 to 4 seconds</answer>",
             "<think>x</think><answer>[2.0, 3.0]</answer>"]
    values, logged = tr1(forms)
    assert values == [pytest.approx(2.0)] * 3 + [pytest.approx(1.0 + 0.5)]  # format 1 + tIoU (1, 1, 1, 0.5)
    assert logged["temporal_r1/tiou"] == pytest.approx(3.5 / 4) and logged["temporal_r1/format"] == 1.0
    assert "temporal_r1/answer" not in logged  # pure grounding: no discrete term
    # Temporal-R1's grounding weights: 0.5 format + 0.5 tIoU; a completion out of format keeps its tIoU
    values, _ = tr1(["<answer>[2, 3]</answer>", "[2, 4]"], format_weight=0.5, iou_weight=0.5)
    assert values == [pytest.approx(0.25), pytest.approx(0.5)]


def test_tiou_is_the_papers_formula_on_hand_computed_spans() -> None:
    """tIoU = max(0, min(e, e') - max(s, s')) / (max(e, e') - min(s, s')), the span as predicted: a span that
    runs past the clip (8 s) is penalised by its whole length, not by the part inside the clip."""
    gold = [6.0, 8.0]
    preds = ["[6, 12]",   # overlap 8-6 = 2, union 12-6 = 6: 1/3 (clipped to the clip it would be 1)
             "[5, 7]",    # overlap 7-6 = 1, union 8-5 = 3: 1/3
             "[0, 8]",    # overlap 2, union 8: 1/4
             "[9, 10]",   # no overlap: 0
             "[3, 3]",    # a point outside the gold span: 0
             "[4, 2]",    # inverted: 0
             "none"]      # no span: 0
    values, _ = tr1([f"<answer>{p}</answer>" for p in preds], answer=gold, format_weight=0)
    assert values == [pytest.approx(1 / 3), pytest.approx(1 / 3), pytest.approx(1 / 4), 0.0, 0.0, 0.0, 0.0]
    values, _ = tr1(["<answer>[3, 3]</answer>"], answer=[3.0, 3.0], format_weight=0)
    assert values == [1.0]  # the same single point


def test_clipping_to_the_clip_shown_is_a_switch() -> None:
    values, _ = tr1(["<answer>[6, 12]</answer>", "<answer>[9, 10]</answer>"], answer=[6.0, 8.0], format_weight=0,
                    clip_to_shown=True)
    # [6, 12] -> [6, 8]: IoU 1 (paper: 1/3); [9, 10] -> [8, 8] (past the end): 0
    assert values == [1.0, 0.0]
    values, _ = tr1(["<answer>[6, 12]</answer>"], answer=[6.0, 8.0], meta={}, format_weight=0, clip_to_shown=True)
    assert values == [pytest.approx(2 / 6)]  # clip length unknown: not clipped
    # the media's sampling window is the clip shown: [1, 5] s of the file
    media = [MediaItem(type="video", path="v.mp4", sampling={"start": 1.0, "end": 5.0})]
    values, _ = tr1(["<answer>[0, 4]</answer>"], answer=[1.0, 4.0], media=media, format_weight=0, clip_to_shown=True)
    assert values == [1.0]
    values, _ = tr1(["<answer>[0, 4]</answer>"], answer=[1.0, 4.0], media=media, format_weight=0)
    assert values == [pytest.approx(3 / 4)]  # the paper's formula: no clipping
    assert shown_window(META) == (0.0, 8.0) and shown_window({"duration": 3}) == (0.0, 3.0)
    assert shown_window({}) is None and clip_window((-1.0, 2.0), (0.0, 1.5)) == (0.0, 1.5)


def test_grounded_qa_adds_the_answer_and_the_span() -> None:
    values, logged = tr1(["<answer>B [2, 4]</answer>", "<answer>A [2, 3]</answer>"], answer="B",
                         problem_type="multiple_choice", options=["red", "green"],
                         meta={"gold_span": [2.0, 4.0], "duration": 8}, format_mode="answer",
                         answer_weight=1.0, iou_weight=2.0, format_weight=0.5)
    assert values == [pytest.approx(0.5 + 1.0 + 2.0), pytest.approx(0.5 + 0.0 + 1.0)]
    assert logged["temporal_r1/answer"] == 0.5 and logged["temporal_r1/tiou"] == pytest.approx(0.75)
    # no gold span: only format and answer
    values, _ = tr1(["<answer>B</answer>"], answer="B", problem_type="multiple_choice", options=["red", "green"],
                    meta={}, format_mode="answer")
    assert values == [2.0]


@register_reward("t_answer_length")
def _answer_length(completions, **kwargs):
    """Varies from answer to answer of the tiny random model (a reward with variance to select on)."""
    return [float(len(c)) for c in completions]


@pytest.mark.usefixtures("module_cache")
def test_select_variance_keeps_only_records_whose_answers_disagree(tmp_path: Path) -> None:
    out = tmp_path / "sel"
    args = ["data", "select-variance", "--quiet", "--out", str(out), "-k", "4", "--tau", "20", "--limit", "6",
            *TINY_RUN, "data.toy_tasks=[grounding, color]", "data.toy_size={train: 3, val: 1, test: 1}",
            "rewards=[{name: t_answer_length}]"]
    assert cli.main(args) == 0
    rows = [json.loads(line) for line in (out / "variance.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(len(r["rewards"]) == 4 for r in rows)
    for r in rows:
        mean = sum(r["rewards"]) / 4
        assert r["variance"] == pytest.approx(sum((v - mean) ** 2 for v in r["rewards"]) / 4, abs=1e-6)
        assert r["kept"] == (r["variance"] > 20.0)
        if r["kept"]:
            assert len(set(r["rewards"])) > 1  # the K answers disagree
    assert 0 < sum(r["kept"] for r in rows) < 6  # both kinds on this set (seeded answers)
    kept = [json.loads(line) for line in (out / "selected.jsonl").read_text().splitlines()]
    assert [k["id"] for k in kept] == [r["id"] for r in rows if r["kept"]]
    assert all(Path(k["media"][0]["path"]).is_absolute() for k in kept)  # usable from any folder
    report = json.loads((out / "report.json").read_text())
    assert report["k"] == 4 and set(report["tasks"]) == {"grounding", "color", "all"}
    assert report["tasks"]["all"]["records"] == 6
    assert report["tasks"]["all"]["kept"] == sum(r["kept"] for r in rows)
    assert "| grounding |" in (out / "report.md").read_text()
    # the kept set loads as training data
    from data_pipelines.loaders import load_samples

    assert len(load_samples(out / "selected.jsonl").samples) == len(kept)
    bad = [a if a != "4" else "1" for a in args]  # -k 1
    assert cli.main([*bad[:4], str(tmp_path / "x"), *bad[5:]]) == 2  # K = 1: a clear error


@pytest.mark.slow
def test_variance_filter_sampler_draws_only_the_prompts_whose_rollouts_disagree(tmp_path: Path) -> None:
    """``data.sampler: variance_filter`` in a real run: before the first RL step every training prompt gets k
    scored rollouts; a prompt is kept iff the population variance of its k rewards is above tau; RL draws
    only kept prompts; a resumed run keeps the selection without re-scoring."""
    from tiny_runs import rl_rows

    from mmrl.config import load_run_config
    from mmrl.engine.checkpoint import load_trainer_state
    from mmrl.run import train

    over = [*TINY_RUN, "data.toy_tasks=[grounding, color]", "data.toy_size={train: 4, val: 1, test: 1}",
            "rewards=[{name: t_answer_length}]", "imports=[mmrl.methods.temporal_r1]", "data.sampler=variance_filter",
            "data.sampler_kwargs={k: 4, tau: 20, chunk_prompts: 3}", "train.steps=4", "train.save_every=2",
            "train.log_rollouts=100", "plugins={test-stop-at: {}}"]
    run = tmp_path / "run"
    STOP_AT[:] = [3]
    with pytest.raises(StopRun):  # the process ends after step 3; checkpoint-2 is on disk
        train(load_run_config("video-qa", overrides=over), run_dir=run, show_progress=False)
    state = load_trainer_state(run / "checkpoint-2")["sampler"]
    scores, kept = state["scores"], state["kept"]
    assert len(scores) == 8 and all(len(v) == 4 for v in scores)
    variance = [sum((x - sum(v) / 4) ** 2 for x in v) / 4 for v in scores]
    assert kept == [i for i, v in enumerate(variance) if v > 20.0]
    assert 0 < len(kept) < 8  # seeded answers of both lengths on this set: the filter does something
    rows = rl_rows(run)
    assert rows[0]["variance_filter/kept"] == len(kept) and "variance_filter/kept" not in rows[1]
    from mmrl.run import load_split

    ids = [s.id for s in load_split(load_run_config("video-qa", overrides=over), "train", show_progress=False)[0]]
    drawn = {json.loads(line)["id"] for line in (run / "rollouts.jsonl").read_text().splitlines()}
    assert drawn and drawn <= {ids[i] for i in kept}
    # resume from step 2: no second scoring pass, the same kept set
    STOP_AT.clear()
    train(load_run_config("video-qa", overrides=over), run_dir=run, show_progress=False, resume=True)
    after = [r for r in rl_rows(run) if r["step"] > 2]
    assert [r["step"] for r in after] == [3, 4] and all("variance_filter/kept" not in r for r in after)
    assert load_trainer_state(run / "checkpoint-4")["sampler"]["kept"] == kept
