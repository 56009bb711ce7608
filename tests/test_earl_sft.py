"""``mmrl data earl-sft``: trajectories on the toy evidence task select frames that bring the gold evidence
into view, end with the gold answer, and train with ``mmrl sft`` (tiny random model); records that no longer
match the run's frames are refused."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401  (module_cache is a fixture)

from data_pipelines.loaders import load_samples
from data_pipelines.toy import make_toy
from mmrl.cli import main
from mmrl.config import MediaConfig, load_run_config
from mmrl.engine.media import MediaPreparer
from mmrl.methods.earl.environment import FrameSelectionEnvironment, cells, parse_selection
from mmrl.methods.earl.trajectories import synthesize
from mmrl_common.errors import DataError

pytestmark = pytest.mark.usefixtures("module_cache")

TOY_MODEL = ["model.path=null", "model.dtype=fp32", "model.gradient_checkpointing=false"]  # not the recipe's 7B


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_toy(tmp_path_factory.mktemp("earl-sft") / "toy", 0, size={"train": 4, "val": 0, "test": 0},
                    tasks=["evidence"], progress=False)


@pytest.fixture(scope="module")
def written(toy: Path) -> Path:
    summary = synthesize(toy / "train.jsonl", toy / "earl-sft.jsonl")
    assert summary["written"] == 4 and summary["skipped"] == {}
    return toy / "earl-sft.jsonl"


def test_trajectories_bring_the_evidence_into_view(written: Path) -> None:
    samples = load_samples(written).samples
    preparer = MediaPreparer(MediaConfig(video_policy="qwen", video_min_pixels=3136, video_max_pixels=3136))
    for s in samples:
        turns, (lo, hi) = s.meta["sft_turns"], s.meta["gold_span"]
        letter = s.answer
        assert s.meta["sft_rounds"] == len(turns) - 1 <= 2
        env = FrameSelectionEnvironment(s, preparer.prepare(s))
        assert env.info["initial_timestamps"] == pytest.approx(s.meta["sft_initial_timestamps"])
        inside = [t for t in env.info["initial_timestamps"] if lo <= t <= hi]
        assert (len(turns) == 1) == bool(inside)  # auto: select only when 8 frames miss the coloured moment
        for turn in turns[:-1]:
            status, picked = parse_selection(turn)
            assert status == "ok"
            grid = list(env.current)
            for i in picked:  # every selected frame's time cell overlaps the gold span
                a, b = cells(grid)[i - 1]
                assert a <= hi and lo <= b
            assert env.step(turn).media
        shown = [f["timestamp"] for f in env.info["frames"]]
        assert any(lo <= t <= hi for t in shown)  # the coloured moment is on a frame the model saw
        picked_times = [t for sel in env.info["selections"] for t in sel["timestamps"]]
        assert picked_times == pytest.approx([t for ts in s.meta["sft_selected_timestamps"] for t in ts])
        # the last turn reasons, then answers: the frames it names are the shown ones inside the gold span
        thought, answer = re.fullmatch(r"<think>(.+)</think>(<answer>.+</answer>)", turns[-1]).groups()
        assert answer == f"<answer>{letter}</answer>" and thought.endswith(f"the answer is {letter}.")
        seen = [t for t in env.current if lo <= t <= hi]
        assert seen and all(f"{t:.1f} s" in thought for t in seen)


def test_every_call_follows_its_reasoning(written: Path) -> None:
    samples = load_samples(written).samples
    assert any(len(s.meta["sft_turns"]) > 1 for s in samples)  # the toy records need selections
    for s in samples:
        times = list(s.meta["sft_initial_timestamps"])
        for k, turn in enumerate(s.meta["sft_turns"][:-1]):
            thought, call = re.fullmatch(r"<think>(.+)</think>(select_frames\(\[[0-9, ]+\]\))", turn).groups()
            assert thought.strip() and "select_frames" not in thought
            picked = parse_selection(call)[1]
            if k == 0:  # the reasoning names the frames it then selects, with their times
                assert all(f"{times[i - 1]:.1f} s" in thought for i in picked)
                assert f"frame{'s' if len(picked) > 1 else ''} {picked[0]}" in thought


def test_fixed_rounds_and_records_without_gold(toy: Path, tmp_path: Path) -> None:
    summary = synthesize(toy / "train.jsonl", tmp_path / "two.jsonl", rounds=2)
    assert summary["rounds"] == {2: 4}
    bare = synthesize(toy / "train.jsonl", tmp_path / "bare.jsonl", answer_format="answer")
    assert bare["written"] == 4
    for s in load_samples(tmp_path / "bare.jsonl").samples:  # without reasoning: the calls and the answer alone
        assert "<think>" not in "".join(s.meta["sft_turns"]) and s.meta["sft_turns"][-1] == f"<answer>{s.answer}</answer>"
        assert all(re.fullmatch(r"select_frames\(\[[0-9, ]+\]\)", t) for t in s.meta["sft_turns"][:-1])
    plain = tmp_path / "plain.jsonl"
    recs = [json.loads(line) for line in (toy / "train.jsonl").read_text().splitlines()]
    for r in recs:
        r["meta"] = {k: v for k, v in r["meta"].items() if not k.startswith("gold")}
        r["media"][0]["path"] = str(toy / r["media"][0]["path"])
    plain.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(DataError, match="no record has a video with gold evidence"):
        synthesize(plain, tmp_path / "none.jsonl")


def test_output_trains_with_mmrl_sft(written: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    rc = main(["sft", "--task", "earl", "--data", str(written), "--out", str(out), "--steps", "2", "--quiet",
               *TINY_RUN, *TOY_MODEL, "sft.batch_size=2"])
    assert rc == 0 and (out / "final" / "config.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [1, 2]
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in rows if r["stage"] == "sft")


def test_mismatched_records_are_refused(written: Path) -> None:
    from mmrl.engine.prompts import encode_prompt
    from mmrl.methods.earl.agent import sft_sequence
    from mmrl.model import load_policy
    from mmrl.run import resolve_model

    cfg = load_run_config("earl", overrides=[*TINY_RUN, *TOY_MODEL])
    policy = load_policy(resolve_model(cfg))
    sample = load_samples(written).samples[0]
    prompt, media = encode_prompt(policy, MediaPreparer(cfg.data.media), sample, cfg.prompt)
    seq = sft_sequence(cfg, policy, sample, prompt, media)
    trained = policy.tokenizer.decode([t for t, m in zip(seq.ids, seq.loss_mask) if m])
    assert trained.replace("<|im_end|>", "") == "".join(sample.meta["sft_turns"])
    # without written turns, the recipe's cold start (sft.target: gold) plays the same reasoning trajectory
    bare = dataclasses.replace(sample, meta={k: v for k, v in sample.meta.items() if not k.startswith("sft_")})
    seq = sft_sequence(cfg, policy, bare, prompt, media)
    trained = policy.tokenizer.decode([t for t, m in zip(seq.ids, seq.loss_mask) if m])
    assert trained.split("<|im_end|>")[:-1] == sample.meta["sft_turns"]
    assert all(t.startswith("<think>") for t in sample.meta["sft_turns"])
    sample.meta["sft_initial_timestamps"] = [t + 0.5 for t in sample.meta["sft_initial_timestamps"]]
    with pytest.raises(DataError, match="re-run `mmrl data earl-sft`"):
        sft_sequence(cfg, policy, sample, prompt, media)
    cfg.rollout.environment = None
    with pytest.raises(DataError, match="rollout.environment is not set"):
        sft_sequence(cfg, policy, sample, prompt, media)
    policy.media.clear()


def test_evidence_task_shows_the_colour_only_in_its_gold_span(toy: Path) -> None:
    from data_pipelines.toy import COLOR_NAMES, COLORS
    from video import open_video

    for s in load_samples(toy / "train.jsonl").samples:
        with open_video(s.media[0].path) as reader:
            frames = reader.get_frames(range(reader.num_frames)).astype(int)
        assert frames.shape[:3] == (128, 64, 64) and s.meta["video"]["fps"] == 4.0
        colour = COLOR_NAMES[ord(s.answer) - ord("A")]
        share = [(abs(f - COLORS[colour]).max(axis=-1) < 50).mean() for f in frames]
        gold = s.meta["gold_frames"]
        assert len(gold) in (4, 6) and all(share[i] > 0.08 for i in gold)
        assert max(share[i] for i in range(128) if i not in gold) < 0.01
        assert s.meta["gold_span"] == [gold[0] / 4.0, (gold[-1] + 1) / 4.0]
        cue_lo, cue_hi = s.meta["cue_span"]
        assert cue_lo < gold[0] / 4.0 and (gold[-1] + 1) / 4.0 < cue_hi and cue_hi - cue_lo == 5.0
