"""Sequence parallelism (``train.sequence_parallel_size``, :mod:`mmrl.model.sequence_parallel`): one sample's tokens
spread over a group of gloo CPU ranks give the one-process log-probs, loss and gradients.

Each case runs ``tests/sequence_parallel_probe.py`` once in one process (the plain padding-free pass) and under
``torchrun`` with 2 and 4 ranks in one group, on a tiny model and a real 64-frame H.264 video (plus an image and a
text-only sequence, two answers sharing the prompt), and compares.

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

pytestmark = pytest.mark.xdist_group("torchrun")

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
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
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
