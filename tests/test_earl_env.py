"""EARL's ``select_frames`` environment on a real MP4 whose frames encode their own index: re-sampling
around the selection (hand-computed frames, inside the neighbour intervals, unseen, within the budget, equal
to the source frames), the defined outcome of every bad action, env_info, and the masks of the environment's
turns in RL rollouts and SFT replays on a real tiny Qwen2.5-VL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipelines.schema import MediaItem, Sample
from mmrl.config import MediaConfig, PromptConfig
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.rollout import SamplingParams, get_environment, run_episodes
from mmrl.methods.earl.agent import replay
from mmrl.methods.earl.environment import FrameSelectionEnvironment, parse_selection
from mmrl.model import Generation, Policy, load_policy
from mmrl.toy.tiny_models import make_tiny
from mmrl_common.errors import ConfigError
from video import open_video
from video.sampling import resize_frames
from video.writer import write_mp4

FPS, N = 8.0, 32  # a 4 s video; frame i is painted (8i, 255 - 8i, 60)
MEDIA = MediaConfig(video_policy="uniform", nframes=5, video_min_pixels=3136, video_max_pixels=3136)


def frame_index(frame: torch.Tensor) -> int:
    """The source frame a decoded (3, H, W) frame shows, read from its colour code."""
    return round(float(frame[0].float().mean()) / 8)


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frames = np.zeros((N, 32, 32, 3), np.uint8)
    for i in range(N):
        frames[i] = (8 * i, 255 - 8 * i, 60)
    return write_mp4(tmp_path_factory.mktemp("earl-env") / "coded.mp4", frames, FPS, crf=0)


@pytest.fixture(scope="module")
def sample(video: Path) -> Sample:
    return Sample(id="coded", problem_type="multiple_choice", question="Which colour?", answer="A",
                  options=["red", "green"], media=[MediaItem("video", str(video), {})],
                  meta={"gold_span": [1.2, 1.3]})


@pytest.fixture(scope="module")
def media(sample: Sample):
    return MediaPreparer(MEDIA).prepare(sample)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("earl-model") / "m", seed=0)


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Policy:
    p = load_policy(model_dir)
    p.model.eval()
    return p


def test_initial_grid(media) -> None:
    # uniform 5 of 32 frames: round(linspace(0, 31, 5))
    assert media[0].data.indices == [0, 8, 16, 23, 31]
    assert [frame_index(f) for f in media[0].data.frames] == [0, 8, 16, 23, 31]


def test_resampling_two_rounds_on_a_real_mp4(sample: Sample, media, video: Path) -> None:
    env = FrameSelectionEnvironment(sample, media, max_new_frames=4)
    assert get_environment("select_frames") is FrameSelectionEnvironment
    obs = env.step("I look closer. select_frames([2])")
    new = obs.media[0].data
    # frame 2 (1.0 s) opens [t1, t3] = [0, 2] s = frames 0..16; unseen: 14 of them; 4 spread evenly over
    # those: positions int((j + 0.5) * 14 / 4) = 1, 5, 8, 12 of [1..7, 9..15]
    assert new.indices == [2, 6, 10, 14]
    assert new.timestamps == [0.25, 0.75, 1.25, 1.75] == obs.media[0].timestamps
    assert all(0.0 <= t <= 2.0 for t in new.timestamps)
    # decoded from the source at those times: the colour code, and the reader's own frames at that size
    assert [frame_index(f) for f in new.frames] == new.indices
    with open_video(video) as reader:
        source = resize_frames(reader.get_frames(new.indices), tuple(new.frames.shape[-2:]))
    assert torch.equal(new.frames, source)
    assert new.frames.shape[-2:] == media[0].data.frames.shape[-2:]  # the initial frames' pixel budget
    assert "1 @ 0.25s, 2 @ 0.75s, 3 @ 1.25s, 4 @ 1.75s" in obs.text and "{video}" in obs.text
    # round 2 selects among the new frames: frame 4 (1.75 s) is the last one; its interval mirrors its one
    # neighbour: [1.25, 2.25] s = frames 10..18; unseen 11, 12, 13, 15, 17, 18 -> positions 0, 2, 3, 5
    obs2 = env.step("select_frames(target_frames=[4])")
    second = obs2.media[0].data
    assert second.indices == [11, 13, 15, 18]
    assert [frame_index(f) for f in second.frames] == [11, 13, 15, 18]
    shown = [f["timestamp"] for f in env.info["frames"]]
    assert len(shown) == len(set(shown)) == 5 + 4 + 4 == env.info["frames_shown"]  # never a frame twice
    assert env.info["frames"][5:9] == [{"round": 1, "index": i + 1, "timestamp": t}
                                       for i, t in enumerate([0.25, 0.75, 1.25, 1.75])]
    assert env.info["selections"] == [{"round": 1, "indices": [2], "timestamps": [1.0]},
                                      {"round": 2, "indices": [4], "timestamps": [1.75]}]
    # a third call: not executed, the episode ends (default) and the outcome is logged
    assert env.step("select_frames([1])") is None
    assert env.info["rounds"] == 2 and env.info["extra_calls"] == 1
    assert [e["outcome"] for e in env.info["events"]] == ["selected", "selected", "extra_call"]


def test_budget_cap_and_larger_pixels(sample: Sample, media) -> None:
    env = FrameSelectionEnvironment(sample, media, max_new_frames=16, max_pixels=4 * 3136)
    obs = env.step("select_frames([1, 5])")
    new = obs.media[0].data
    # frame 1 opens [0, 1] s (frames 0..8), frame 5 [2.875, 3.875] s (frames 23..31): 7 + 7 unseen frames
    assert len(new.indices) == len(set(new.indices)) == 14  # every unseen frame: fewer than the 16 allowed
    assert all(i <= 8 or i >= 23 for i in new.indices) and not set(new.indices) & {0, 8, 16, 23, 31}
    h, w = new.frames.shape[-2:]
    assert h * w >= 56 * 56  # at least the initial frames' pixels
    assert [frame_index(f) for f in new.frames] == new.indices


def test_bad_actions_have_defined_outcomes(sample: Sample, media) -> None:
    env = FrameSelectionEnvironment(sample, media, max_select=2)
    cases = [("select_frames([two])", "malformed", "Could not read"),
             ('<tool_call>{"name": "select_frames", "arguments": {"frames": [1]}}</tool_call>', "malformed", "Could"),
             ("select_frames([])", "empty", "No frame selected"),
             ("select_frames([1, 2, 3])", "too_many", "at most 2"),
             ("select_frames([0, 6])", "out_of_range", "Frame(s) 0, 6 do not exist: the current frames are 1 to 5")]
    for action, outcome, text in cases:
        obs = env.step(action)
        assert obs is not None and obs.media == [] and text in obs.text
        assert env.info["events"][-1]["outcome"] == outcome
    assert env.info["invalid_actions"] == 5 and env.info["rounds"] == 0 and env.info["frames_shown"] == 5
    # a valid call still works afterwards (duplicates count once), then the answer ends the episode
    assert env.step("select_frames([3, 3])").media
    assert env.info["selections"][0]["indices"] == [3]
    assert env.step("select_frames([1]) <answer>A</answer>") is None  # an answer wins over a call
    assert env.info["events"][-1]["outcome"] == "answer"
    # plain text without a call or an answer ends the episode as it stands
    other = FrameSelectionEnvironment(sample, media)
    assert other.step("it is red") is None and other.info["events"][-1]["outcome"] == "no_action"


def test_answer_now_after_the_last_round(sample: Sample, media) -> None:
    env = FrameSelectionEnvironment(sample, media, max_rounds=1, on_extra_call="answer_now")
    assert "(0 left)" not in env.step("select_frames([2])").text
    obs = env.step("select_frames([1])")
    assert obs is not None and obs.media == [] and "Answer now" in obs.text and env.info["extra_calls"] == 1
    with pytest.raises(ConfigError, match="on_extra_call"):
        FrameSelectionEnvironment(sample, media, on_extra_call="ignore")
    with pytest.raises(ConfigError, match="unknown setting"):
        FrameSelectionEnvironment(sample, media, max_frames=3)


def test_parse_forms() -> None:
    assert parse_selection("select_frames([3, 5])") == ("ok", [3, 5])
    assert parse_selection('<tool_call>{"name": "select_frames", "arguments": {"target_frames": [2]}}</tool_call>'
                           ) == ("ok", [2])
    assert parse_selection("select_frames([1.5])") == ("malformed", None)
    assert parse_selection("<answer>B</answer>") == ("none", None)


def test_a_call_after_reasoning_is_read_and_reasoning_is_never_an_action(sample: Sample, media) -> None:
    # the call that follows the reasoning counts, not one the reasoning mentions
    assert parse_selection("<think>select_frames([5]) would look too late; frames 2 and 3 surround the cue."
                           "</think>select_frames([2, 3])") == ("ok", [2, 3])
    assert parse_selection("<think>I will use select_frames on frame 2.</think>\nselect_frames(target_frames=[2])"
                           ) == ("ok", [2])
    assert parse_selection("<think>the cue is near frame 3</think>select_frames([3, x])") == ("malformed", None)
    assert parse_selection("<think>maybe select_frames([2])</think>it is red") == ("none", None)  # no call
    assert parse_selection("<think>I would select_frames([2") == ("none", None)  # unclosed: all reasoning
    env = FrameSelectionEnvironment(sample, media, max_select=2)
    obs = env.step("<think>the square lights up near frame 3</think>select_frames([3, x])")
    assert obs is not None and obs.media == [] and "Could not read" in obs.text
    assert env.info["events"][-1]["outcome"] == "malformed" and env.info["rounds"] == 0
    obs = env.step("<think>select_frames([1]) is too early; frame 3 is nearest.</think>select_frames([3])")
    assert obs is not None and obs.media and env.info["selections"][0]["indices"] == [3]
    assert env.step("<think>frame 2 of the new frames shows it, no need to select_frames([1]).</think>"
                    "<answer>A</answer>") is None
    assert env.info["events"][-1]["outcome"] == "answer" and env.info["rounds"] == 1
    other = FrameSelectionEnvironment(sample, media)  # an answer written only inside the reasoning is no answer
    assert other.step("<think><answer>A</answer></think>") is None
    assert other.info["events"][-1]["outcome"] == "no_action"


class Scripted:
    """A rollout backend that answers every sequence of the k-th call with script[k] (real tokenizer ids)."""

    def __init__(self, policy: Policy, script: list[str]):
        self.policy, self.script, self.calls = policy, script, 0

    def generate(self, seqs, *, n: int, params: SamplingParams):
        text = self.script[self.calls]
        self.calls += 1
        ids = self.policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [*ids, self.policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return [[Generation(token_ids=ids, text=text, logprobs=[], finished=True) for _ in range(n)] for _ in seqs]


def _turn_tokens(policy: Policy, text: str) -> int:
    return len(policy.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1


def test_environment_tokens_are_masked_in_rollouts_and_sft(policy: Policy, sample: Sample, media) -> None:
    prompt, _ = encode_prompt(policy, MediaPreparer(MEDIA), sample, PromptConfig(answer_format="answer"))
    script = ["select_frames([2])", "select_frames([1])", "<answer>A</answer>"]
    episodes = run_episodes(policy, Scripted(policy, script), [prompt], [sample], n=2,
                            params=SamplingParams(max_new_tokens=8),
                            environment=lambda s: FrameSelectionEnvironment(s, media, max_new_frames=4), max_turns=4)
    sft = replay(policy, prompt, FrameSelectionEnvironment(sample, media, max_new_frames=4), script)
    video_pad = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for seq in (episodes[0].seq, episodes[1].seq, sft):
        trained = [t for t, m in zip(seq.ids, seq.loss_mask) if m]
        assert len(trained) == sum(_turn_tokens(policy, t) for t in script)
        assert policy.tokenizer.decode(trained).count("select_frames") == 2
        assert video_pad not in trained  # the re-sampled frames (and every environment token) are masked
        assert len(seq.media) == 3 and seq.ids.count(video_pad) > prompt.ids.count(video_pad)
        masked = policy.tokenizer.decode([t for t, m in zip(seq.ids, seq.loss_mask) if not m])
        assert "4 new frames" in masked
    assert episodes[0].seq.ids == sft.ids and episodes[0].seq.loss_mask == sft.loss_mask
    assert episodes[0].env.info["rounds"] == 2 and episodes[0].completion == "<answer>A</answer>"
    with torch.no_grad():  # the sequences with the environment's videos run through the model
        _, _, mask = policy.forward_logprobs([episodes[0].seq, sft])
    assert int(mask[0].sum()) == int(mask[1].sum()) == sum(_turn_tokens(policy, t) for t in script)
    policy.media.clear()


def _segments(seq) -> list[tuple[bool, list[int]]]:
    """The sequence cut where its loss mask changes: ``(trained, ids)`` runs in order."""
    out: list[tuple[bool, list[int]]] = []
    for t, m in zip(seq.ids, seq.loss_mask):
        if out and out[-1][0] == bool(m):
            out[-1][1].append(t)
        else:
            out.append((bool(m), [t]))
    return out


def test_reasoning_turns_are_trained_and_the_environment_turns_masked(policy: Policy, sample: Sample, media) -> None:
    prompt, _ = encode_prompt(policy, MediaPreparer(MEDIA), sample, PromptConfig(answer_format="think_answer"))
    script = ["<think>The square is grey on every frame; frame 2 is nearest the moment.</think>select_frames([2])",
              "<think>Frame 1 of the new frames is closest; I look again.</think>select_frames([1])",
              "<think>The new frames show the square lit in red.</think><answer>A</answer>"]
    episodes = run_episodes(policy, Scripted(policy, script), [prompt], [sample], n=1,
                            params=SamplingParams(max_new_tokens=64),
                            environment=lambda s: FrameSelectionEnvironment(s, media, max_new_frames=4), max_turns=4)
    sft = replay(policy, prompt, FrameSelectionEnvironment(sample, media, max_new_frames=4), script)
    decode = policy.tokenizer.decode
    video_pad = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for seq in (episodes[0].seq, sft):
        segs = _segments(seq)
        # prompt (masked), turn 1, observation 1, turn 2, observation 2, turn 3: six runs, alternating
        assert [m for m, _ in segs] == [False, True, False, True, False, True]
        assert segs[0][1] == prompt.ids
        for (_, ids), turn in zip(segs[1::2], script):  # each model turn, reasoning included, is trained whole
            assert decode(ids) == turn + "<|im_end|>"
            assert decode(ids).startswith("<think>")
        for k, (_, ids) in enumerate(segs[2::2]):  # each environment turn is masked whole, with its new frames
            text = decode(ids)
            assert text.startswith("\n<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
            assert "4 new frames" in text and ids.count(video_pad) > 0
            assert "<think>" not in text and script[k] not in text and script[k + 1] not in text
    assert episodes[0].seq.ids == sft.ids and episodes[0].seq.loss_mask == sft.loss_mask
    assert episodes[0].env.info["rounds"] == 2
    policy.media.clear()


def test_frames_layout_labels_every_frame_in_the_prompt_and_the_observations(policy: Policy, sample: Sample,
                                                                              media) -> None:
    """prompt.video_layout=frames: each initial frame is its own one-frame video after "Frame k @ t s:", equal to
    that source frame; the environment shows its new frames the same way; the episode still trains only the
    assistant turns and runs through the model."""
    from mmrl.engine.prompts import frame_label, media_parts

    cfg = PromptConfig(answer_format="answer", video_layout="frames")
    prompt, marked = encode_prompt(policy, MediaPreparer(MEDIA), sample, cfg)
    assert [m.layout for m in marked] == ["frames"] and marked[0].timestamps == media[0].timestamps
    parts, items = media_parts(marked)
    stamps = media[0].timestamps
    assert [p.get("text") for p in parts[0::2]] == [frame_label(k + 1, t) for k, t in enumerate(stamps)]
    assert [p["type"] for p in parts[1::2]] == ["video"] * len(stamps) == [i.kind for i in items]
    assert len({i.key for i in items}) == len(stamps)
    for k, item in enumerate(items):  # the k-th item is the k-th sampled frame, alone
        assert item.data.frames.shape[0] == 1 and item.data.timestamps == [stamps[k]]
        assert frame_index(item.data.frames[0]) == frame_index(media[0].data.frames[k])
    text = policy.tokenizer.decode(prompt.ids)
    assert text.index("Frame 1 @ 0.0s:") < text.index("Frame 2 @") < text.index(sample.question)
    assert len(prompt.media) == len(stamps)

    env = FrameSelectionEnvironment(sample, marked, max_new_frames=4)
    obs = env.step("select_frames([2])")
    new = env.info["frames"][-4:]
    assert obs.text.count("{video}") == len(obs.media) == 4
    for f in new:
        assert frame_label(f["index"], f["timestamp"]) in obs.text
    assert all(m.data.frames.shape[0] == 1 for m in obs.media)
    script = ["select_frames([2])", "<answer>A</answer>"]
    seq = replay(policy, prompt, FrameSelectionEnvironment(sample, marked, max_new_frames=4), script)
    trained = [t for t, m in zip(seq.ids, seq.loss_mask) if m]
    assert len(trained) == sum(_turn_tokens(policy, t) for t in script)
    assert len(seq.media) == len(stamps) + 4
    with torch.no_grad():
        _, _, mask = policy.forward_logprobs([seq])
    assert int(mask.sum()) == len(trained)
    policy.media.clear()


class Cycling(Scripted):
    """Scripted, but the k-th call answers with script[k % len(script)] (one cycle per benchmark batch)."""

    def generate(self, seqs, *, n: int, params: SamplingParams):
        self.calls %= len(self.script)
        return super().generate(seqs, n=n, params=params)


def test_benchmark_through_the_agent_loop(policy: Policy, tmp_path: Path) -> None:
    import json

    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.methods.earl.agent import run_benchmark_agent

    root = write_fixture("mvbench", tmp_path / "mvbench", n=3)  # one MP4 task, one bounded MP4, one frame folder
    # per batch: the agent's first turn, its second turn (after new frames), then the plain answer
    backend = Cycling(policy, ["select_frames([2])", "<answer>A</answer>", "<answer>A</answer>"])
    result = run_benchmark_agent("mvbench", root, policy=policy, agent="earl", out=tmp_path / "out", frames=4,
                                 batch_size=8, backend=backend)
    preds = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    agent = {p["id"]: p for p in preds if p["mode"] == "agent_loop" and "error" not in p}
    plain = {p["id"]: p for p in preds if p["mode"] == "baseline" and "error" not in p}
    # the fixture's fourth question has no video: recorded as an error in both modes, counted in n
    failed = [p for p in preds if "error" in p]
    assert [p["mode"] for p in failed] == ["agent_loop", "baseline"] and "media not found" in failed[0]["error"]
    assert len(agent) == len(plain) == 3 and result["n"] == 4
    for pid, p in agent.items():
        assert plain[pid]["frames"] == 4 and plain[pid]["rounds"] == 0
        if p["rounds"]:  # re-sampled from the MP4: 4 initial frames + the new ones, then the answer
            assert p["frames"] > 4 and p["turns"] == ["select_frames([2])", "<answer>A</answer>"]
        else:  # the frame folder has no video file to re-sample from: the episode ends at the call
            assert p["frames"] == 4 and p["turns"] == ["select_frames([2])"] and p["correct"] is False
    assert sum(p["rounds"] for p in agent.values()) == 2
    assert result["agent_loop"]["rounds_per_answer"] == pytest.approx(2 / 3)
    assert result["baseline"]["frames_per_answer"] == 4.0
    assert result["agent_loop"]["frames_per_answer"] == pytest.approx(sum(p["frames"] for p in agent.values()) / 3)


class Recording(Cycling):
    """Cycling, and keeps the text of every sequence it is asked to continue, per call."""

    def __init__(self, policy: Policy, script: list[str]):
        super().__init__(policy, script)
        self.seen: list[list[str]] = []

    def generate(self, seqs, *, n: int, params: SamplingParams):
        self.seen.append([self.policy.tokenizer.decode(s.ids) for s in seqs])
        return super().generate(seqs, n=n, params=params)


def test_benchmark_agent_shows_frames_as_the_model_was_trained(policy: Policy, tmp_path: Path) -> None:
    """video_layout=frames on a benchmark: the agent's prompt and the plain answer's prompt label every initial
    frame (one one-frame video each), and the re-sampled frames come back labelled the same way."""
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.methods.earl.agent import run_benchmark_agent

    root = write_fixture("mvbench", tmp_path / "mvbench", n=1)  # one MP4 question
    backend = Recording(policy, ["select_frames([2])", "<answer>A</answer>", "<answer>A</answer>"])
    result = run_benchmark_agent("mvbench", root, policy=policy, agent="earl", out=tmp_path / "out", frames=4,
                                 backend=backend, video_layout="frames")
    assert result["agent_loop"]["rounds_per_answer"] == 1
    (agent_first,), (agent_second,), (plain,) = backend.seen
    for text in (agent_first, plain):
        assert [f"Frame {k} @" in text for k in (1, 2, 3, 4, 5)] == [True] * 4 + [False]
        assert text.count("<|vision_start|>") == 4
    new = agent_second[len(agent_first):]  # the first turn, then the environment's labelled new frames
    assert new.count("<|vision_start|>") == result["agent_loop"]["frames_per_answer"] - 4 > 0
    assert "Frame 1 @" in new


def test_benchmark_layout_is_the_trained_one_unless_overridden(model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from mmrl.cli import build_parser
    from mmrl.cli.commands import config_from_args
    from mmrl.methods.earl.agent import _trained_layout

    def layout(model: Path, *extra: str) -> str:
        args = build_parser().parse_args(["eval", "--benchmark", "toy", "--data-root", "x", "--model", str(model),
                                          "--agent", "earl", "--quiet", *extra])
        return _trained_layout(args, config_from_args(args))

    assert layout(model_dir) == "video"  # no training settings: the default
    trained = shutil.copytree(model_dir, tmp_path / "trained")
    (trained / "mmrl_eval.json").write_text(json.dumps({"prompt": {"video_layout": "frames"}}))
    assert layout(trained) == "frames"
    assert layout(trained, "prompt.video_layout=video") == "video"
    assert layout(trained, "--recipe-settings") == "video"


def test_mmrl_eval_agent_on_a_benchmark_fixture(model_dir: Path, tmp_path: Path, capsys) -> None:
    import json

    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.cli import main

    root = write_fixture("toy", tmp_path / "toy", n=2)
    out = tmp_path / "eval"
    assert main(["eval", "--benchmark", "toy", "--data-root", str(root), "--model", str(model_dir), "--agent", "earl",
                 "--out", str(out), "--frames", "4", "--limit", "3", "--quiet", "eval.max_new_tokens=4",
                 "train.cpu_threads=1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["agent"] == "earl" and metrics["n"] == 3
    for mode in ("agent_loop", "baseline"):
        assert metrics[mode]["scores"]["overall"]["n"] == 3
    assert metrics["baseline"]["rounds_per_answer"] == 0 and metrics["baseline"]["frames_per_answer"] > 0
    assert "with --agent earl: accuracy" in capsys.readouterr().out


def test_a_replayed_selection_decodes_once(sample: Sample, media) -> None:
    """Two episodes that make the same selection on the same frames share one decode (the re-sample cache);
    another selection decodes its own frames."""
    from mmrl.methods.earl.environment import RESAMPLED

    first = FrameSelectionEnvironment(sample, media, max_new_frames=4).step("select_frames([3])")
    again = FrameSelectionEnvironment(sample, media, max_new_frames=4).step("select_frames([3])")
    other = FrameSelectionEnvironment(sample, media, max_new_frames=4).step("select_frames([1])")
    assert again.media[0].data is first.media[0].data  # the cached decode
    assert other.media[0].data is not first.media[0].data
    assert not torch.equal(other.media[0].data.frames, first.media[0].data.frames)
    assert 0 < RESAMPLED.bytes <= RESAMPLED.limit


def test_benchmark_agent_asks_a_reasoning_model_to_reason(policy: Policy, tmp_path: Path) -> None:
    """A model trained with think_answer is asked to reason before each call and the answer (its tool note);
    a model trained without it is not."""
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.methods.earl.agent import run_benchmark_agent

    root = write_fixture("mvbench", tmp_path / "mvbench", n=1)
    for think in (True, False):
        backend = Recording(policy, ["<answer>A</answer>", "<answer>A</answer>"])
        run_benchmark_agent("mvbench", root, policy=policy, agent="earl", out=tmp_path / f"out{think}", frames=4,
                            backend=backend, think=think, limit=1)
        agent_prompt, plain_prompt = backend.seen[0][0], backend.seen[-1][0]
        assert ("Think inside <think></think>" in agent_prompt) is think
        assert "Think inside" not in plain_prompt
