"""``python -m perf.sequence_parallel``: the update's per-rank activation memory under sequence parallelism
(``train.sequence_parallel_size``, :mod:`mmrl.model.sequence_parallel`) at group sizes 1, 2 and 4, on gloo CPU
ranks.

Each size runs this file as a worker (one process for size 1, ``torchrun`` with that many ranks otherwise, every
rank in one group) on the same micro-batch: a long video prompt (``FRAMES`` frames, ``SIDE`` x ``SIDE`` pixels)
and its ``ANSWERS`` answers, on a tiny Qwen2.5-VL of ``SIZE``. A rank's number is the peak of its resident set
(psutil, sampled every 2 ms by a thread) during the forward and backward of the micro-batch, above its resident
set just before: the activations, the vision tower's included, and the gradients the backward creates (the same
on every size: a whole copy of the weights' gradients per rank). Size 1 runs the same packed, whole-sequence pass
as the groups (``shared_prefix`` off), so the sizes differ only in the split.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

FAMILY = "qwen2_5_vl"
SIZE = {"hidden_size": 512, "layers": 4, "heads": 8, "kv_heads": 4, "intermediate_size": 1536,
        "vision_depth": 2, "vision_hidden_size": 128, "vision_heads": 4, "vision_intermediate_size": 256}
FRAMES, SIDE, FPS = 128, 112, 8.0
ANSWERS, ANSWER_TOKENS = 2, 64


def _video(path: Path) -> Path:
    import numpy as np

    from video.writer import write_mp4

    rng = np.random.default_rng(5)
    bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    _, xx = np.mgrid[0:SIDE, 0:SIDE]
    out = np.empty((FRAMES, SIDE, SIDE, 3), np.uint8)
    for i in range(FRAMES):
        img = (bg[None, None, :] * 0.6 + (xx[..., None] * 0.4 * 255 / SIDE)).astype(np.uint8)
        x, y = (3 * i) % (SIDE - 24), (2 * i) % (SIDE - 24)
        img[y:y + 24, x:x + 24] = fg
        out[i] = img
    return write_mp4(path, out, FPS)


def worker(model_dir: str, video: str, out: str) -> None:
    """One rank: the micro-batch's forward and backward, its resident-set peak written (rank 0) for all ranks."""
    import psutil

    from mmrl.engine import distributed
    from mmrl.model import MediaInput, RankBinding, load_policy
    from video import sample_video

    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = distributed.init("cpu")
    policy = load_policy(model_dir, device="cpu", attn_implementation="varlen")
    policy.configure(shared_prefix=False)
    policy.model.train()
    group = world.sequence_group(world.size) if world.active else None
    policy.bind_ranks(RankBinding(sequence_group=group))
    data = sample_video(video, "qwen", nframes=FRAMES, min_pixels=SIDE * SIDE, max_pixels=SIDE * SIDE)
    media = MediaInput(key="v", kind="video", data=data, timestamps=list(data.timestamps))
    content = [{"type": "video"}, {"type": "text", "text": "Where does the square go?"}]
    prompt = policy.encode(policy.render([{"role": "user", "content": content}]), [media])
    g = torch.Generator().manual_seed(0)
    seqs = [prompt.extend(torch.randint(100, 300, (ANSWER_TOKENS,), generator=g).tolist(), trained=True)
            for _ in range(ANSWERS)]
    proc = psutil.Process()
    world.barrier()
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            done.wait(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    logp, _, mask = policy.forward_logprobs(seqs)
    (-(logp * mask).sum() / mask.sum()).backward()
    done.set()
    thread.join()
    peak[0] = max(peak[0], proc.memory_info().rss)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in policy.model.parameters() if p.grad is not None)
    rows = world.gather({"peak_mb": (peak[0] - before) / 2**20, "grads_mb": grads / 2**20})
    if world.is_main:
        Path(out).write_text(json.dumps({"ranks": rows, "tokens": sum(len(s) for s in seqs),
                                         "video_tokens": sum(t == policy.video_token_id for t in prompt.ids)}))
    distributed.finish()


def bench_sequence_parallel(root: Path, sizes: tuple[int, ...] = (1, 2, 4)) -> list[dict]:
    """Each group size's per-rank peaks (a fresh process group per size)."""
    from mmrl.toy.tiny_models import make_tiny

    model = make_tiny(FAMILY, root / "model", seed=0, video_max_pixels=SIDE * SIDE, **SIZE)
    video = _video(root / "long.mp4")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    results = []
    for n in sizes:
        out = root / f"sp{n}.json"
        cmd = [sys.executable, "-m", "perf.sequence_parallel", str(model), str(video), str(out)]
        if n > 1:
            torchrun = str(Path(sys.executable).with_name("torchrun"))
            cmd = [torchrun, "--standalone", "--nproc_per_node", str(n), "-m", "perf.sequence_parallel",
                   str(model), str(video), str(out)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:
            raise RuntimeError(f"sequence-parallel worker of size {n} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        results.append({"size": n, **json.loads(out.read_text())})
    return results


def print_sequence_parallel(results: list[dict]) -> None:
    first = results[0]
    print(f"\n## Sequence parallelism: the update's per-rank resident set (gloo CPU ranks; {first['tokens']} tokens, "
          f"{first['video_tokens']} of them video, {FRAMES} frames at {SIDE}x{SIDE}; hidden {SIZE['hidden_size']}, "
          f"{SIZE['layers']} layers)\n")
    print("| group size | peak above the start, max over ranks (MB) | mean over ranks (MB) | of it, gradients (MB) "
          "| vs size 1 |")
    print("| --- | --- | --- | --- | --- |")
    base = max(r["peak_mb"] for r in first["ranks"])
    for res in results:
        peaks = [r["peak_mb"] for r in res["ranks"]]
        print(f"| {res['size']} | {max(peaks):.0f} | {sum(peaks) / len(peaks):.0f} | {res['ranks'][0]['grads_mb']:.0f} "
              f"| {max(peaks) / base:.2f} |")


def main() -> None:
    """No arguments: the bench and its table; three (model folder, video, output file): one worker rank."""
    if len(sys.argv) == 4:
        worker(*sys.argv[1:4])
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mmrl-perf-sp-") as tmp:
        print_sequence_parallel(bench_sequence_parallel(Path(tmp)))


if __name__ == "__main__":
    main()
