"""The vLLM engine is sized for its run: batch, sequence and media limits and the processor's image budget come
from the run's configuration and data (``settings_from_config`` -> ``engine_args`` -> ``vllm.LLM``).

The first tests read the exact keyword arguments the backend builds ``vllm.LLM`` with, from a real recipe, a
real tiny model and real toy records (no engine needed); the one marked ``vllm`` builds the engine on vLLM's
CPU build and reads the limits back from the engine's own configuration, then checks that the engine
tokenises the run's media as the trainer's processor does (equal greedy answers and log-probs), that a prompt it would tokenise otherwise stops
with both counts named, and that closing it leaves vLLM's process groups.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
import torch
from PIL import Image

from data_pipelines.loaders import load_samples
from data_pipelines.schema import MediaItem, Sample
from data_pipelines.toy import make_toy
from mmrl.config import load_run_config
from mmrl.engine.backends.vllm import TEXT_TOKENS, engine_args, settings_from_config
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.rollout import HFBackend, SamplingParams, backend_from_config
from mmrl.model import load_policy
from mmrl.toy.tiny_models import make_tiny
from mmrl_common.errors import MmrlError
from video.writer import write_mp4

RUN = ["rollout.backend=vllm", "model.tiny_family=qwen2_5_vl", "train.prompts_per_step=3", "rollout.group_size=4",
       "eval.batch_size=2", "rollout.max_new_tokens=8", "prompt.answer_format=answer",
       "data.media.image_min_pixels=3136", "data.media.image_max_pixels=12544",  # 16 tokens
       "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",  # 4 tokens a frame
       "data.media.min_frames=4", "data.media.max_frames=4"]
NOT_ENGINE = ("kv_cache_gb", "sleep_level")  # the backend's own settings, not vLLM's


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("limits")
    toy = make_toy(root / "toy", 0, size={"train": 2, "val": 1, "test": 1}, tasks=["color", "scan"],
                   progress=False)
    samples = [*load_samples(toy / "train.jsonl").samples, *load_samples(toy / "test.jsonl").samples]
    assert {s.media[0].type for s in samples} == {"image", "video"} and all(len(s.media) == 1 for s in samples)
    policy = load_policy(make_tiny("qwen2_5_vl", root / "model", seed=0))
    policy.model.eval()
    return policy, samples


def _kwargs(policy, samples, *overrides: str) -> dict:
    cfg = load_run_config("video-qa", overrides=[*RUN, *overrides])
    settings = settings_from_config(cfg, policy, samples)
    return engine_args(policy, **{k: v for k, v in settings.items() if k not in NOT_ENGINE})


def test_the_engine_arguments_come_from_the_run(world) -> None:
    policy, samples = world
    cfg = load_run_config("video-qa", overrides=RUN)
    got = _kwargs(policy, samples)
    # the toy's video records ask for 8 frames (sampling.nframes) over data.media's 4
    assert {s.media[0].sampling.get("nframes") for s in samples if s.media[0].type == "video"} == {8}
    # 2,048 text tokens, a video of 8 frames (4 temporal groups of 2 x 2 tokens), an image of 16 tokens and
    # the 8 new tokens of one turn, within the model's context
    max_len = min(2048 + 4 * 4 + 16 + 8, policy.model.config.text_config.max_position_embeddings)
    assert got["max_model_len"] == max_len
    assert got["max_num_seqs"] == 12  # 3 prompts x 4 rollouts in one call (one process: one engine)
    assert got["max_num_batched_tokens"] == max_len  # a whole prompt in one step
    # one image or one video per record; the largest image of the run is 16 tokens (4 x 4 of 28 pixels),
    # the largest video 8 frames of 2 x 2 tokens
    assert got["limit_mm_per_prompt"] == {"image": {"count": 1, "width": 112, "height": 112},
                                          "video": {"count": 1, "num_frames": 8, "width": 56, "height": 56}}
    # the image budget within the model folder's processor (its own lower bound: 4 tokens)
    assert policy.processor.image_processor.size["shortest_edge"] == 3136
    assert got["mm_processor_kwargs"] == {"images_kwargs": {"size": {"shortest_edge": 3136, "longest_edge": 12544}}}
    assert got["seed"] == cfg.train.seed and got["logprobs_mode"] == "raw_logprobs"
    assert cfg.rollout.record_logprobs  # on by default with vLLM


def test_the_engine_arguments_follow_the_layout_the_environment_and_the_settings(world) -> None:
    policy, samples = world
    # each video a clip per frame: eight one-frame clips
    frames = _kwargs(policy, samples, "prompt.video_layout=frames")["limit_mm_per_prompt"]
    assert frames["video"]["count"] == 8 and frames["image"]["count"] == 1
    # a zoom environment of three turns: each later turn may show new items; its crops' budget counts
    zoom = _kwargs(policy, samples, "rollout.environment=zoom", "rollout.max_turns=3",
                   "rollout.environment_kwargs={max_pixels: 25088}")
    assert zoom["limit_mm_per_prompt"]["image"] == {"count": 3, "width": 168, "height": 140}  # 32 tokens: 6 x 5
    assert zoom["mm_processor_kwargs"]["images_kwargs"]["size"]["longest_edge"] == 25088
    # a record's own larger budget counts; the folder's processor bound caps it (64 tokens for the tiny model)
    big = [*samples]
    image = next(s for s in big if s.media[0].type == "image")
    image.media[0].sampling = {"max_pixels": 10**6}
    try:
        capped = _kwargs(policy, big)
    finally:
        image.media[0].sampling = {}
    assert capped["mm_processor_kwargs"]["images_kwargs"]["size"]["longest_edge"] == 64 * 28 * 28
    # an evaluation batch larger than a step's rollouts sizes the engine
    assert _kwargs(policy, samples, "eval.batch_size=40")["max_num_seqs"] == 40
    # the settings win over the derived values
    own = _kwargs(policy, samples, "rollout.vllm.max_num_seqs=5", "rollout.vllm.max_num_batched_tokens=4096",
                  "rollout.vllm.max_media_per_prompt=2", "rollout.vllm.max_model_len=3000",
                  "rollout.vllm.mm_processor_kwargs={images_kwargs: {size: {shortest_edge: 784, longest_edge: 50176}}}")
    assert (own["max_num_seqs"], own["max_num_batched_tokens"], own["max_model_len"]) == (5, 4096, 3000)
    assert own["limit_mm_per_prompt"]["image"]["count"] == own["limit_mm_per_prompt"]["video"]["count"] == 2
    assert own["mm_processor_kwargs"]["images_kwargs"]["size"] == {"shortest_edge": 784, "longest_edge": 50176}


def test_the_sizes_of_a_run_without_its_data(world) -> None:
    """Without the records (``mmrl eval`` through the rollout service) the counts fall back to 8 each; without
    a policy (the benchmark runner, which bounds its own context) nothing is derived."""
    policy, _ = world
    cfg = load_run_config("video-qa", overrides=RUN)
    no_data = settings_from_config(cfg, policy)
    assert no_data["limit_mm_per_prompt"]["image"]["count"] == no_data["limit_mm_per_prompt"]["video"]["count"] == 8
    bare = settings_from_config(cfg)
    assert not {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "limit_mm_per_prompt",
                "mm_processor_kwargs"} & set(bare)


@pytest.fixture(scope="module")
def grounding(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen2.5-VL whose video processor keeps frames up to 768 tokens (as a real folder's does; the default
    tiny one shrinks them to 16), and real files at Temporal-R1's budgets: 4 s clips at 2 fps (8 frames) of
    448 x 896 pixels (401,408 a frame: its whole-video budget of 1,605,632 over 8 frames, x 2 as qwen-vl-utils'
    fetch_video counts it) and of 672 x 896 (602,112: its per-frame cap, qwen-vl-utils' VIDEO_MAX_PIXELS), and a
    112 x 112 image (16 tokens)."""
    root = tmp_path_factory.mktemp("grounding")
    policy = load_policy(make_tiny("qwen2_5_vl", root / "model", seed=0, video_max_pixels=768 * 28 * 28))
    rng = np.random.default_rng(0)
    out = {}
    for h, w in ((448, 896), (672, 896)):
        out[f"{h}x{w}"] = str(write_mp4(root / f"{h}x{w}.mp4", rng.integers(0, 256, (8, h, w, 3), dtype=np.uint8), 2.0))
    Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)).save(root / "image.png")
    out["image"] = str(root / "image.png")
    return policy, out


@pytest.mark.parametrize("whole_video_budget", [True, False])
def test_max_model_len_is_the_largest_prompt_the_processor_makes(grounding, whole_video_budget: bool) -> None:
    """Temporal-R1's recipe (data.media.video_total_pixels: one budget for all frames of a video, applied by the
    data pipeline): the engine's length is the text allowance, the vision tokens the policy's processor really
    makes for the run's largest video and image, and the answer; without the whole-video budget the largest video
    is the per-frame cap's."""
    policy, grounding_media = grounding
    overrides = ["data.media.max_frames=8",  # 8 frames keep the files small; the recipe's pixel budgets as they are
                 "data.media.image_min_pixels=3136", "data.media.image_max_pixels=12544", "rollout.max_new_tokens=64"]
    if not whole_video_budget:
        overrides.append("data.media.video_total_pixels=null")
    cfg = load_run_config("temporal-grounding", overrides=overrides)
    assert cfg.data.media.video_total_pixels == (1605632 if whole_video_budget else None)
    preparer = MediaPreparer(cfg.data.media, family=policy.family)
    prompts = []
    for clip in ("448x896", "672x896"):
        sample = Sample(clip, "temporal_grounding", "When does the door open?", [1.0, 2.0], None,
                        [MediaItem("video", grounding_media[clip]), MediaItem("image", grounding_media["image"])])
        prompts.append((sample, encode_prompt(policy, preparer, sample, cfg.prompt)[0]))
    policy.clear_media()
    vision = {s.id: sum(int((torch.as_tensor(p.ids) == t).sum()) for t in (policy.video_token_id, policy.image_token_id))
              for s, p in prompts}
    assert all(len(p.ids) - vision[s.id] < TEXT_TOKENS for s, p in prompts)  # the text fits its allowance
    got = settings_from_config(cfg, policy, [s for s, _ in prompts])["max_model_len"]
    assert got == TEXT_TOKENS + max(vision.values()) + cfg.rollout.max_new_tokens


@pytest.mark.vllm
def test_a_real_engine_gets_the_derived_limits_and_tokenises_as_the_trainer(world) -> None:
    policy, samples = world
    cfg = load_run_config("video-qa", overrides=RUN)
    backend = backend_from_config(cfg, policy, samples)
    try:
        want = _kwargs(policy, samples)
        assert backend.engine_args == want  # exactly what vllm.LLM was built with
        vc = backend.llm.llm_engine.vllm_config
        assert vc.scheduler_config.max_num_seqs == 12
        assert vc.scheduler_config.max_num_batched_tokens == want["max_model_len"] == vc.model_config.max_model_len
        mm = vc.model_config.multimodal_config
        assert mm.get_limit_per_prompt("image") == 1 and mm.get_limit_per_prompt("video") == 1
        assert mm.limit_per_prompt["video"].num_frames == 8 and mm.limit_per_prompt["image"].width == 112
        assert mm.mm_processor_kwargs == want["mm_processor_kwargs"]

        # the run's media through the engine: the same tokens and log-probs as the trainer's processor and model
        preparer = MediaPreparer(cfg.data.media, family=policy.family)
        greedy = SamplingParams(max_new_tokens=6, greedy=True, logprobs=True)
        for kind in ("image", "video"):
            sample = next(s for s in samples if s.media[0].type == kind)
            prompt = encode_prompt(policy, preparer, sample, cfg.prompt)[0]
            hf = HFBackend(policy).generate([prompt], n=1, params=greedy)[0][0]
            got = backend.generate([prompt], n=1, params=greedy)[0][0]
            assert got.token_ids == hf.token_ids, kind
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(hf.logprobs), rtol=0, atol=1e-5)

        # an image made outside the run's budgets (here: enlarged to 64 tokens; the engine's budget is 16) is
        # tokenised otherwise by the engine: the run stops, naming both counts
        bigger = MediaPreparer(dataclasses.replace(cfg.data.media, image_min_pixels=50176, image_max_pixels=50176),
                               family=policy.family)
        sample = next(s for s in samples if s.media[0].type == "image")
        prompt = encode_prompt(policy, bigger, sample, cfg.prompt)[0]
        with pytest.raises(MmrlError, match=rf"made \d+ prompt tokens of a prompt the policy's processor made "
                                            rf"{len(prompt.ids)}"):
            backend.generate([prompt], n=1, params=greedy)

        # closed before the process group goes: vLLM's model-parallel groups are left, the engine refuses work
        from vllm.distributed import parallel_state

        assert parallel_state.model_parallel_is_initialized()
        backend.close()
        assert not parallel_state.model_parallel_is_initialized() and backend.llm is None
        with pytest.raises(MmrlError, match="closed"):
            backend.generate([prompt], n=1, params=greedy)
        backend.close()  # twice is harmless
    finally:
        del backend
        gc.collect()

