"""Sequence parallelism (``train.sequence_parallel_size``, :mod:`mmrl.model.sequence_parallel`): one sample's tokens
spread over a group of gloo CPU ranks give the one-process log-probs, loss and gradients.

Each case runs ``tests/sequence_parallel_probe.py`` once in one process (the plain padding-free pass; padded for
Qwen3.5, whose recurrent layers rule packing out) and under ``torchrun`` with 2 and 4 ranks in one group, on a tiny
model and a real 64-frame H.264 video (plus an image and a text-only sequence, two answers sharing the prompt), and
compares. For Qwen3.5 the packed row holds three sequences, so its Gated DeltaNet layers must restart their state
at each: run over the gathered row whole instead, the log-probs of the later sequences moved by 3e-3 (measured).

Tolerance: fp32 round-off. The group computes the same operations on the same numbers, but a projection runs over
a slice of the rows (another blocking of the matrix product) and each parameter's gradient is the sum of the ranks'
partial sums in another order; measured: log-probs within 5e-7, entropies 4e-6, every gradient within 2e-6 of its
tensor's largest entry. The bounds below leave an order of magnitude for other BLAS builds; a wrong slice, a lost
or doubled gradient, or a position off by one moves them by 1e-2 or more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mmrl.engine.distributed import World
from mmrl_common.errors import ConfigError
from video.writer import write_mp4

# their own group, not "torchrun": that group runs on one worker in turn and is the suite's longest path (~1,180 s
# of `make test`'s main run with these in it); these 4-rank runs go beside it on the other worker
pytestmark = pytest.mark.xdist_group("sequence_parallel")

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
PROBE = str(Path(__file__).with_name("sequence_parallel_probe.py"))


def long_video(path: Path, frames: int = 64, size: int = 64, fps: float = 8.0) -> Path:
    """A real H.264 MP4: a coloured square moving over a gradient, ``frames`` frames."""
    rng = np.random.default_rng(3)
    bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    _, xx = np.mgrid[0:size, 0:size]
    out = np.empty((frames, size, size, 3), np.uint8)
    for i in range(frames):
        img = (bg[None, None, :] * 0.6 + (xx[..., None] * 0.4 * 255 / size)).astype(np.uint8)
        x, y = (3 * i) % (size - 16), (2 * i) % (size - 16)
        img[y:y + 16, x:x + 16] = fg
        out[i] = img
    return write_mp4(path, out, fps)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("sp")
    env = {**os.environ, "MMRL_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return long_video(root / "long.mp4"), env


def probe(family: str, ranks: int, video: Path, env: dict[str, str], out: Path) -> dict:
    cmd = [sys.executable, PROBE, family, str(video), str(out)]
    if ranks > 1:
        cmd = [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), *cmd[1:]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"])
def test_group_of_2_and_4_ranks_equals_one_process(family: str, setup, tmp_path: Path) -> None:
    video, env = setup
    one = probe(family, 1, video, env, tmp_path / "one.pt")
    assert one["video_tokens"] >= 32  # 64 frames: 32 temporal patches, each at least one merged token
    mask = one["mask"].bool()
    assert one["grads"]["model.visual.patch_embed.proj.weight"].abs().sum() > 0  # the tower is in the graph
    for ranks in (2, 4):
        got = probe(family, ranks, video, env, tmp_path / f"sp{ranks}.pt")
        assert torch.equal(got["mask"], one["mask"])
        torch.testing.assert_close(got["logp"][mask], one["logp"][mask], rtol=0, atol=5e-6)
        torch.testing.assert_close(got["ent"][mask], one["ent"][mask], rtol=0, atol=5e-5)
        torch.testing.assert_close(got["loss"], one["loss"], rtol=1e-6, atol=1e-7)
        assert set(got["grads"]) == set(one["grads"])
        far = {}
        for name, want in one["grads"].items():
            scale = float(want.abs().max())
            gap = float((got["grads"][name] - want).abs().max())
            if gap > 2e-5 * scale + 1e-9:
                far[name] = (gap, scale)
        assert not far, f"{ranks} ranks: gradients off beyond fp32 round-off (gap, largest): {list(far.items())[:3]}"


def test_group_size_must_divide_the_ranks() -> None:
    with pytest.raises(ConfigError, match=r"train.sequence_parallel_size=3 does not divide the 4 ranks"):
        World(rank=0, size=4).sequence_group(3)
    assert World(rank=0, size=4).sequence_group(1) is None


# ------------------------------------------------------------------------------------------------ training
MMRL = str(Path(sys.executable).with_name("mmrl"))
REWARD = '''
from rewards import register_reward


@register_reward("text_length")
def text_length(completions, **_):
    """Longer completions score higher: random models' rollouts differ, so advantages are not zero."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
'''
RUN = [
    "model.tiny_family=qwen2_5_vl", "model.init=random", "model.attn_implementation=varlen",
    "data.toy_size={train: 4, val: 2, test: 2}", "data.toy_tasks=[color]",
    "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
    "data.media.min_frames=16", "data.media.max_frames=16", "data.media.fps=8",
    "rollout.group_size=4", "rollout.max_new_tokens=4", "rollout.seed_per_prompt=true",
    # 2 prompts x 4 rollouts: each of the 2 data-parallel groups rolls out one prompt (on both of its ranks) and
    # trains it in two micro-batches (3 + 1), each sequence's tokens split over the group's 2 ranks
    "train.prompts_per_step=2", "train.micro_batch_size=3", "train.steps=4", "train.save_every=2",
    "train.keep_checkpoints=2", "train.log_every=0", "train.cpu_threads=1", "train.lr=1e-3",
    "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
    "rewards=[{name: text_length}]", "grpo.kl_coef=0.01", "grpo.entropy_coef=0.01",
]


@pytest.fixture(scope="module")
def run_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sp_train")
    (root / "text_length.py").write_text(REWARD)
    return {**os.environ, "MMRL_CACHE": str(root / "cache"), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
            "TQDM_DISABLE": "1", "MMRL_TEST_REWARD": str(root / "text_length.py")}


def command(out: Path, env: dict[str, str], ranks: int, *extra: str) -> list[str]:
    args = ["train", "--quiet", "--out", str(out), *RUN, f"imports=[{env['MMRL_TEST_REWARD']}]", *extra]
    if ranks == 1:
        return [MMRL, *args]
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "mmrl", *args]


def train(out: Path, env: dict[str, str], ranks: int, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command(out, env, ranks, *extra), check=False, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def rl_rows(run: Path) -> list[dict]:
    import json

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


@pytest.mark.slow
def test_two_data_parallel_by_two_sequence_parallel_equals_one_process_and_resumes(run_env: dict[str, str],
                                                                                   tmp_path: Path) -> None:
    import signal
    import time

    import psutil
    from synthetic_media import model_weights

    single, straight, killed = tmp_path / "single", tmp_path / "straight", tmp_path / "killed"
    train(single, run_env, 1)
    train(straight, run_env, 4, "train.sequence_parallel_size=2")
    one, four = rl_rows(single), rl_rows(straight)
    assert [r["step"] for r in four] == [1, 2, 3, 4]
    for a, b in zip(one, four):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # the same rollouts
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-3, abs=1e-7), a["step"]
    assert any(abs(r["loss"]) > 1e-4 for r in one) and all(r["reward_std"] > 0 for r in one)
    w1, w4, w0 = model_weights(single / "final"), model_weights(straight / "final"), model_weights(single / "checkpoint-2")
    assert set(w1) == set(w4)
    # per tensor, the runs' updates agree to 1% of the update's size (tests/test_distributed.py says why not a plain
    # allclose: Adam turns round-off-sized gradients into learning-rate-sized moves)
    far = {}
    for k in w1:
        moved = float((w1[k] - w0[k]).abs().max())
        gap = float((w1[k] - w4[k]).abs().max())
        if gap > 1e-2 * moved + 1e-7:
            far[k] = (gap, moved)
    assert not far, f"weights differ beyond fp32 round-off (gap, update): {list(far.items())[:3]}"

    # killed on every rank after checkpoint-2, then resumed: the uninterrupted run's end, bit for bit
    proc = subprocess.Popen(command(killed, run_env, 4, "train.sequence_parallel_size=2"), env=run_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    while not (killed / "checkpoint-2" / "trainer_state.pt").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
        time.sleep(0.05)
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert not (killed / "final").exists() and not (killed / "checkpoint-4").exists()
    train(killed, run_env, 4, "train.sequence_parallel_size=2", "--resume")
    w5 = model_weights(killed / "final")
    differ = [k for k in w4 if not torch.equal(w4[k], w5[k])]
    assert not differ, f"{len(differ)} tensors differ after the resume, e.g. {differ[:3]}"
    for a, b in zip(four, rl_rows(killed)):
        assert a["loss"] == b["loss"], a["step"]


def test_what_cannot_be_split_is_refused_with_the_setting_named(setup) -> None:
    """An attention implementation without the all-to-all and a group the heads do not divide over are refused
    by name; Qwen3.5 (its Gated DeltaNet layers run whole per sequence on every rank) is not."""
    from mmrl.model import load_policy
    from mmrl.model.sequence_parallel import check_policy
    from mmrl.toy.tiny_models import ensure_tiny

    _, env = setup
    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", env["MMRL_CACHE"])
    try:
        qwen35 = load_policy(ensure_tiny("qwen3_5"), device="cpu", attn_implementation="varlen")
        check_policy(qwen35, 2)
        qwen35_sdpa = load_policy(ensure_tiny("qwen3_5"), device="cpu")
        with pytest.raises(ConfigError, match=r"needs model.attn_implementation=varlen"):
            check_policy(qwen35_sdpa, 2)
        sdpa = load_policy(ensure_tiny("qwen2_5_vl"), device="cpu")
        with pytest.raises(ConfigError, match=r"needs model.attn_implementation=varlen"):
            check_policy(sdpa, 2)
        check_policy(sdpa, 1)  # off: nothing to check
        varlen = load_policy(ensure_tiny("qwen2_5_vl"), device="cpu", attn_implementation="varlen")
        with pytest.raises(ConfigError, match=r"4 attention heads do not divide over 3 ranks"):
            check_policy(varlen, 3)
        check_policy(varlen, 4)
    finally:
        mp.undo()


def test_the_linear_attention_wrapper_is_inert_without_a_group_and_follows_a_deepcopy(setup) -> None:
    """Qwen3.5's Gated DeltaNet forward, wrapped for sequence parallelism: without a sequence group it is the
    layer's own forward (a one-process pass is unchanged); a deep copy of the model (the trainer's KL reference)
    computes with the copy's weights, not the original's."""
    import copy

    from mmrl.model import load_policy
    from mmrl.model.recurrent import linear_layers
    from mmrl.model.sequence_parallel import SegmentedLinearAttention, install_linear_attention
    from mmrl.toy.tiny_models import ensure_tiny

    _, env = setup
    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", env["MMRL_CACHE"])
    try:
        policy = load_policy(ensure_tiny("qwen3_5"), device="cpu", attn_implementation="varlen")
    finally:
        mp.undo()
    layer = linear_layers(policy.model)[0]
    x = torch.randn(1, 9, layer.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = layer(x)
        assert install_linear_attention(policy.base.language_model) == len(linear_layers(policy.model)) >= 1
        first = layer.forward
        assert isinstance(first, SegmentedLinearAttention)
        install_linear_attention(policy.base.language_model)  # a second install keeps the first, unwrapped twice
        assert layer.forward is first
        assert not isinstance(layer.forward.forward, SegmentedLinearAttention)
        assert torch.equal(layer(x), plain)
        assert torch.equal(layer(x, mmrl_sequence_group=None), plain)
        copied = linear_layers(copy.deepcopy(policy.model))[0]
        assert torch.equal(copied(x), plain)
        copied.out_proj.weight.zero_()
        assert float(plain.abs().max()) > 0 and float(copied(x).abs().max()) == 0
        assert torch.equal(layer(x), plain)
