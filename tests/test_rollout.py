"""Rollouts on a real tiny Qwen2.5-VL: the multi-turn loop with the ``zoom`` environment on toy-world image
and video samples, loss masks and recorded log-probs, zoom observations, stop strings, and the rollout
service answering as evaluation does whatever mode the model is left in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from data_pipelines.loaders import load_samples
from data_pipelines.schema import MediaItem, Sample
from data_pipelines.toy import make_toy
from mmrl.config import MediaConfig, PromptConfig
from mmrl.engine.environments import ZoomEnvironment
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.rollout import HFBackend, Observation, SamplingParams, observation_fragment, run_episodes
from mmrl.model import IMAGE, Policy, TokenSeq, load_policy
from mmrl.toy.tiny_models import make_tiny
from video.writer import write_mp4

FAMILY = "qwen2_5_vl"
MEDIA = MediaConfig(fps=2.0, min_frames=4, max_frames=4, video_min_pixels=3136, video_max_pixels=3136,
                    image_min_pixels=3136, image_max_pixels=4 * 3136)
PROMPT = PromptConfig(answer_format="answer")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(FAMILY, tmp_path_factory.mktemp("rollout-model") / FAMILY, seed=0)


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Policy:
    p = load_policy(model_dir)
    p.model.eval()
    return p


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sample]:
    out = make_toy(tmp_path_factory.mktemp("rollout-toy") / "toy", 0, size={"train": 2, "val": 1, "test": 1},
                   tasks=["color", "scan"], progress=False)
    samples = load_samples(out / "train.jsonl").samples
    by_kind = {}
    for s in samples:
        by_kind.setdefault(s.media[0].type, s)
    assert set(by_kind) == {"image", "video"}
    return by_kind


def check_episode_tokens(policy: Policy, episodes, prompts: list[TokenSeq]) -> None:
    """Masks, lengths and log-probs of finished episodes against a fresh training forward pass."""
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs([ep.seq for ep in episodes])
    for i, ep in enumerate(episodes):
        seq = ep.seq
        n_prompt = len(ep.prompt)
        assert seq.ids[:n_prompt] == ep.prompt.ids and sum(seq.loss_mask[:n_prompt]) == 0
        assert len(ep.logprobs) == sum(seq.loss_mask) == ep.response_length
        got = logp[i, :len(seq)][mask[i, :len(seq)].bool()]
        torch.testing.assert_close(got, torch.tensor(ep.logprobs), rtol=0, atol=1e-4)
        assert ep.prompt is prompts[i // 2] or ep.prompt.ids == prompts[i // 2].ids


@pytest.mark.parametrize("kind", ["image", "video"])
def test_multi_turn_zoom_loop(policy: Policy, toy: dict[str, Sample], kind: str) -> None:
    sample = toy[kind]
    preparer = MediaPreparer(MEDIA, family=FAMILY)
    prompt, media = encode_prompt(policy, preparer, sample, PROMPT)
    envs: list[ZoomEnvironment] = []

    def factory(s: Sample) -> ZoomEnvironment:
        env = ZoomEnvironment(s, media, max_zooms=2)
        envs.append(env)
        return env

    torch.manual_seed(0)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    policy.configure(cache_vision_features=False)  # sharing within each call (across calls: tests/test_vision_once.py)
    before = policy.vision_calls
    episodes = run_episodes(policy, HFBackend(policy, record_logprobs=True), [prompt], [sample], n=2, params=params,
                            environment=factory, max_turns=3)
    assert len(episodes) == 2 and len(envs) == 2
    # the random model never answers: the environment reminds it of the format, the loop goes on to the limit
    reminder = policy.tokenizer("To look closer reply", add_special_tokens=False)["input_ids"]
    for ep, env in zip(episodes, envs):
        assert ep.env is env and len(ep.turns) == 3
        assert env.info["invalid_actions"] == 2 and env.info["zooms"] == 0
        assert ep.completion == ep.turns[-1]
        seq = ep.seq
        # the assistant turns are exactly the loss-masked runs, the observations are masked out
        runs, cur = [], []
        for tok, m in zip(seq.ids, seq.loss_mask):
            if m:
                cur.append(tok)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        assert [policy.tokenizer.decode(r, skip_special_tokens=True) for r in runs] == ep.turns
        masked_text = policy.tokenizer.decode([t for t, m in zip(seq.ids, seq.loss_mask) if not m])
        assert masked_text.count("To look closer reply <zoom>") == 2
        assert masked_text.count("<|im_start|>user") == 3 and masked_text.count("<|im_start|>assistant") == 3
        # every assistant turn is closed before the environment's user turn, even when it was cut short
        full = policy.tokenizer.decode(seq.ids)
        users = [i for i in range(len(full)) if full.startswith("<|im_start|>user", i)]
        assert len(users) == 3 and all(full[:i].endswith("<|im_end|>\n") for i in users[1:])
        start = next(j for j in range(len(seq.ids)) if seq.ids[j:j + len(reminder)] == reminder)
        assert all(m == 0 for m in seq.loss_mask[start:start + len(reminder)])
        assert seq.media == prompt.media
    # 1 unique media item, 3 generate calls (first turn for both episodes, then two later turns)
    assert policy.vision_calls - before == 3
    policy.configure(cache_vision_features=True)
    check_episode_tokens(policy, episodes, [prompt])


def test_answer_ends_the_episode(toy: dict[str, Sample], policy: Policy) -> None:
    media = MediaPreparer(MEDIA, family=FAMILY).prepare(toy["image"])
    env = ZoomEnvironment(toy["image"], media)
    assert env.step("I think <answer>B</answer>") is None
    env = ZoomEnvironment(toy["image"], media, max_zooms=1)
    assert env.step("<zoom>0,0,0.5,0.5</zoom>") is not None
    assert env.step("<zoom>0,0,0.5,0.5</zoom>") is None  # zoom budget spent
    bad = ZoomEnvironment(toy["image"], media).step("<zoom>0.8,0.1,0.2,0.5</zoom>")
    assert bad is not None and bad.media == [] and "Invalid zoom" in bad.text
    # a malformed number is an invalid action (a reminder), never a crash
    for text in ("<zoom>0.1,0.1,0.5,0.5.</zoom>", "<zoom>.,0,1,1</zoom>"):
        reply = ZoomEnvironment(toy["image"], media).step(text)
        assert reply is not None and reply.media == [] and "<zoom>" in reply.text


def quadrant_image() -> Image.Image:
    arr = np.zeros((112, 112, 3), np.uint8)
    arr[:56, :56] = (230, 20, 20)  # top-left red
    arr[:56, 56:] = (20, 20, 230)  # top-right blue
    arr[56:, :] = (20, 200, 20)  # bottom green
    return Image.fromarray(arr)


def mean_rgb(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(0)


def test_zoom_returns_the_zoomed_region(policy: Policy, tmp_path: Path) -> None:
    image_path = tmp_path / "quadrants.png"
    quadrant_image().save(image_path)
    sample = Sample(id="q", problem_type="open", question="?", answer="red",
                    media=[MediaItem(type="image", path=str(image_path))])
    media = MediaPreparer(MEDIA, family=FAMILY).prepare(sample)
    env = ZoomEnvironment(sample, media, max_pixels=4 * 3136)
    obs = env.step("Let me look. <zoom>0.05, 0.05, 0.45, 0.45</zoom>")
    assert isinstance(obs, Observation) and len(obs.media) == 1 and obs.media[0].kind == "image"
    red = mean_rgb(obs.media[0].data)
    assert red[0] > 200 and red[1] < 40 and red[2] < 40, red
    blue = mean_rgb(env.step("<zoom>0.6,0.1,0.95,0.4</zoom>").media[0].data)
    assert blue[2] > 200 and blue[0] < 40, blue
    assert env.info == {"zooms": 2, "invalid_actions": 0}

    # the observation becomes a masked user turn with the zoomed image in it
    frag = observation_fragment(policy, obs)
    assert frag.media == [obs.media[0].key] and IMAGE in frag.mm_types and sum(frag.loss_mask) == 0
    assert policy.media[obs.media[0].key].kind == "image"


def test_zoom_on_video_reads_the_frame_at_the_time(tmp_path: Path) -> None:
    frames = np.zeros((16, 64, 64, 3), np.uint8)
    frames[:8] = (220, 30, 30)  # red for 2 s, then green
    frames[8:] = (30, 200, 30)
    path = write_mp4(tmp_path / "red-green.mp4", frames, 4.0)
    sample = Sample(id="v", problem_type="open", question="?", answer="x",
                    media=[MediaItem(type="video", path=str(path))])
    media = MediaPreparer(MEDIA, family=FAMILY).prepare(sample)
    early = ZoomEnvironment(sample, media).step("<zoom>0.2,0.2,0.8,0.8@0.5</zoom>").media[0].data
    late = ZoomEnvironment(sample, media).step("<zoom>0.2,0.2,0.8,0.8@3.5</zoom>").media[0].data
    assert mean_rgb(early)[0] > 180 and mean_rgb(early)[1] < 70
    assert mean_rgb(late)[1] > 160 and mean_rgb(late)[0] < 70


def test_turn_after_a_zoom_observation(policy: Policy, toy: dict[str, Sample]) -> None:
    """A zoom action, the environment's image turn, then a sampled turn: masks, log-probs, tower calls."""
    sample = toy["video"]
    preparer = MediaPreparer(MEDIA, family=FAMILY)
    prompt, media = encode_prompt(policy, preparer, sample, PROMPT)
    action = "<zoom>0.1,0.1,0.6,0.6@1.0</zoom>"
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    seq = prompt.extend(policy.tokenizer(action, add_special_tokens=False)["input_ids"] + [end], trained=True)
    obs = ZoomEnvironment(sample, media).step(action)
    assert obs is not None and obs.media
    frag = observation_fragment(policy, obs)
    seq = seq.extend(frag.ids, trained=False, mm_types=frag.mm_types, media=frag.media)
    assert len(seq.media) == 2
    torch.manual_seed(3)
    policy.configure(cache_vision_features=False)  # sharing within the call (across calls: tests/test_vision_once.py)
    before = policy.vision_calls
    gens = HFBackend(policy, record_logprobs=True).generate([seq], n=3, params=SamplingParams(max_new_tokens=6, temperature=0.7))[0]
    assert policy.vision_calls - before == 2  # the video and the zoomed image, once each for 3 samples
    policy.configure(cache_vision_features=True)
    full = [seq.extend(g.token_ids, trained=True) for g in gens]
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs(full, temperature=0.7)
    for i, g in enumerate(gens):
        got = logp[i][mask[i].bool()]
        n_action = len(got) - len(g.logprobs)
        assert n_action == len(policy.tokenizer(action, add_special_tokens=False)["input_ids"]) + 1
        torch.testing.assert_close(got[n_action:], torch.tensor(g.logprobs), rtol=0, atol=1e-4)


def test_stop_string_ends_generation(model_dir: Path) -> None:
    """Teach a tiny model one reply, then check that ``</answer>`` stops it and marks it finished."""
    policy = load_policy(model_dir)  # a private copy: this test trains it
    tok = policy.tokenizer
    prompt = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "Colour?"}]}]))
    target = tok("<answer>red</answer> and then more words", add_special_tokens=False)["input_ids"]
    seq = prompt.extend(target, trained=True)
    policy.set_trainable(vision=False, merger=False)
    opt = torch.optim.Adam([p for p in policy.model.parameters() if p.requires_grad], lr=3e-3)
    policy.model.train()
    for _ in range(150):
        logp, _, mask = policy.forward_logprobs([seq])
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if float(loss.detach()) < 0.02:
            break
    backend = HFBackend(policy, record_logprobs=True)
    free = backend.generate([prompt], n=1, params=SamplingParams(max_new_tokens=len(target), greedy=True))[0][0]
    assert free.text.startswith("<answer>red</answer> and"), free.text
    assert not free.finished  # cut by max_new_tokens
    params = SamplingParams(max_new_tokens=len(target), greedy=True, stop=["</answer>"])
    stopped = backend.generate([prompt], n=2, params=params)[0]
    for g in stopped:
        assert g.finished and g.text.endswith("</answer>") and g.text == "<answer>red</answer>"
        assert len(g.token_ids) == len(g.logprobs) < len(target)
    # batched with a row that runs longer: the stopped row is padded, and padding is never kept as a token
    longer = prompt.extend(tok("<answer>red</answer> and", add_special_tokens=False)["input_ids"], trained=False)
    together = backend.generate([prompt, longer], n=1, params=params)
    assert together[0][0].token_ids == stopped[0].token_ids
    assert not set(together[0][0].token_ids) & {tok.convert_tokens_to_ids("<|endoftext|>")}
    # the checkpoint's own generation settings (e.g. a repetition penalty) do not change what is sampled
    policy.model.generation_config.repetition_penalty = 3.0
    policy.model.generation_config.no_repeat_ngram_size = 1
    again = backend.generate([prompt], n=1, params=SamplingParams(max_new_tokens=len(target), greedy=True))[0][0]
    assert again.token_ids == free.token_ids
    assert policy.model.training  # the backend restores the train/eval mode


def test_rollout_service_answers_as_evaluation_in_any_model_mode(model_dir: Path, tmp_path: Path) -> None:
    from tiny_runs import TINY_RUN

    from mmrl.config import load_run_config
    from mmrl.engine.evaluate import evaluate
    from mmrl.engine.service import RolloutService
    from mmrl.model import checkpointing_switch

    toy = make_toy(tmp_path / "toy", 0, size={"train": 0, "val": 0, "test": 4}, tasks=["color"], progress=False)
    samples = load_samples(toy / "test.jsonl").samples
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, "rollout.max_new_tokens=12"])
    policy = load_policy(model_dir, device="cpu")
    service = RolloutService.from_config(policy, cfg)
    _, preds = evaluate(service, samples, max_new_tokens=12, show_progress=False)
    policy.model.train()
    checkpointing_switch(policy.model, True)
    answers = service.generate(samples, max_new_tokens=12)
    assert [a[0].text for a in answers] == [p["completion"] for p in preds]
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in policy.model.modules())
    assert policy.model.training and checkpointing  # as the caller left it
    assert len(policy.media) == 0  # the service freed what it encoded
