"""Decode seconds per video for each video decoder this machine can run (``data.media.decoder``), on the same files,
in one run (``python -m perf --only decode``; issue 61, item 13).

The files: real H.264 MP4s written by :func:`video.writer.write_mp4` (libx264, yuv420p, the encoder's default group
of pictures with B-frames) in three kinds, two files each (a square moving over a drifting gradient, drawn per seed):

* ``toy``: 112x112, 16 frames at 8 fps (2 s), the size of the toy world and the tests;
* ``long``: 336x336, 240 frames at 8 fps (30 s), a long toy video;
* ``clip``: 640x360, 150 frames at 30 fps (5 s), a camera-like clip.

Two kinds of work, each timed from the opening to the last frame in memory (the reader's work alone: the resize to
the pixel budget after it is the same for every decoder and is left out):

* ``sampled``: what a run decodes of a video by default, the frames qwen-vl-utils' rule takes at
  ``data.media``'s defaults (2 fps, 4 to 16 frames), through :func:`video.open_video` and ``get_frames``;
* ``all``: every frame of the video, in order.

Each repetition times every decoder once on every file, the decoders' order rotating from one repetition to the
next, after one warm-up repetition; reported: the median over the repetitions of the mean seconds per video of a
kind, and its ratio to PyAV's (measured in the same run). One more row times ``auto`` (decord here) with
``decode_timeout=60`` against ``auto`` without: the cost of running each call on a thread of its own. A decoder
that cannot run here (not installed; torchcodec without FFmpeg's libraries) is named with the reason, not timed.
Timings only; nothing is asserted.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

KINDS: dict[str, tuple[int, int, int, float]] = {  # name: (height, width, frames, fps)
    "toy": (112, 112, 16, 8.0),
    "long": (336, 336, 240, 8.0),
    "clip": (360, 640, 150, 30.0),
}
FILES_PER_KIND = 2
SAMPLING = {"fps": 2.0, "min_frames": 4, "max_frames": 16}  # MediaConfig's defaults
TIMEOUT_S = 60.0


def draw_video(path: Path, height: int, width: int, frames: int, fps: float, seed: int) -> Path:
    """A square moving over a gradient whose colours drift with time, as an H.264 MP4 (every frame differs)."""
    from video.writer import write_mp4

    rng = np.random.default_rng(seed)
    bg, fg = rng.integers(0, 200, 3), rng.integers(120, 256, 3).astype(np.uint8)
    yy, xx = np.mgrid[0:height, 0:width]
    side = max(8, min(height, width) // 5)

    def frame(i: int) -> np.ndarray:
        img = np.stack([(bg[c] + xx * (c + 1) * 96 // width + yy * 64 // height + i * (c + 2)) % 256
                        for c in range(3)], axis=-1).astype(np.uint8)
        x = (5 * i + 17 * seed) % (width - side)
        y = (3 * i + 11 * seed) % (height - side)
        img[y:y + side, x:x + side] = fg
        return img

    return write_mp4(path, (frame(i) for i in range(frames)), fps)


def make_files(root: Path) -> dict[str, list[Path]]:
    """:data:`FILES_PER_KIND` files of each of :data:`KINDS` under ``root``."""
    return {kind: [draw_video(root / f"{kind}-{s}.mp4", h, w, n, fps, seed=s) for s in range(FILES_PER_KIND)]
            for kind, (h, w, n, fps) in KINDS.items()}


def decoders() -> tuple[list[str], dict[str, str]]:
    """The decoders that can run here, and why each of the others cannot."""
    from video.decoders import DECODERS, decoder_problem

    ok, not_here = [], {}
    for name in DECODERS:
        if name == "auto":
            continue
        problem = decoder_problem(name)
        if problem is None:
            ok.append(name)
        else:
            not_here[name] = problem
    return ok, not_here


def _work(path: Path, decoder: str, timeout: float | None, every: bool) -> int:
    """Open ``path`` and decode its sampled frames (or all of them); the frames decoded."""
    from video import open_video
    from video.sampling import get_policy

    with open_video(path, decoder, timeout=timeout) as reader:  # type: ignore[arg-type]
        idx = list(range(reader.num_frames)) if every else get_policy("qwen")(reader.num_frames, reader.fps,
                                                                                **SAMPLING)
        return len(reader.get_frames(idx))


def bench_decode(root: Path, *, reps: int = 5) -> dict[str, Any]:
    """Median seconds per video of each arm (decoder, timeout) on each kind of file and each kind of work."""
    t0 = time.perf_counter()
    files = make_files(root)
    write_s = time.perf_counter() - t0
    ok, not_here = decoders()
    arms: list[tuple[str, str, float | None]] = [(d, d, None) for d in ok]
    if "decord" in ok:
        arms += [("auto, no timeout", "auto", None), (f"auto, decode_timeout={TIMEOUT_S:g}", "auto", TIMEOUT_S)]
    seconds: dict[tuple[str, str, str], list[float]] = {}
    frames: dict[tuple[str, str], int] = {}
    for rep in range(reps + 1):  # the first one warms up (imports, the decoders' first calls) and is not kept
        shift = rep % len(arms)
        for label, decoder, timeout in arms[shift:] + arms[:shift]:
            for work in ("sampled", "all"):
                for kind, paths in files.items():
                    start = time.perf_counter()
                    n = sum(_work(p, decoder, timeout, work == "all") for p in paths)
                    took = (time.perf_counter() - start) / len(paths)
                    frames[(kind, work)] = n // len(paths)
                    if rep:
                        seconds.setdefault((label, kind, work), []).append(took)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {"arms": [a[0] for a in arms], "not_here": not_here, "median": med, "frames": frames, "reps": reps,
            "write_s": write_s, "versions": _versions(ok)}


def _versions(ok: list[str]) -> dict[str, str]:
    import importlib

    out: dict[str, str] = {}
    for name in ok:
        mod = importlib.import_module({"decord": "decord", "pyav": "av", "torchcodec": "torchcodec"}[name])
        out[name] = str(getattr(mod, "__version__", "?"))
        if name == "torchcodec":
            out[name] += f" on FFmpeg {getattr(mod, 'ffmpeg_major_version', '?')}"
    return out


def print_decode(result: dict[str, Any]) -> None:
    med, frames = result["median"], result["frames"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    print(f"decode: seconds per video, the opening to the last frame in memory, median of {result['reps']} "
          f"repetitions after a warm-up, every decoder on the same {FILES_PER_KIND} files of each kind ({versions}; "
          f"files written in {result['write_s']:.1f} s)")
    for name, why in result["not_here"].items():
        print(f"  not measured: {name}: {why}")
    print()
    head = f"{'kind':<34} {'decoder':<26} {'sampled (s)':>12} {'x pyav':>7} {'all (s)':>9} {'x pyav':>7}"
    print(head)
    print("-" * len(head))
    for kind, (h, w, n, fps) in KINDS.items():
        what = f"{kind}: {w}x{h}, {n} fr @ {fps:g} fps"
        sampled, every = frames[(kind, "sampled")], frames[(kind, "all")]
        for label in result["arms"]:
            s, a = med[(label, kind, "sampled")], med[(label, kind, "all")]
            ps, pa = med.get(("pyav", kind, "sampled")), med.get(("pyav", kind, "all"))
            rs = f"{s / ps:.2f}" if ps else "-"
            ra = f"{a / pa:.2f}" if pa else "-"
            print(f"{what:<34} {label:<26} {s:>12.4f} {rs:>7} {a:>9.4f} {ra:>7}")
            what = f"  ({sampled} sampled, {every} all)" if label == result["arms"][0] else ""
        print()
    if "auto, no timeout" in result["arms"]:
        key = f"auto, decode_timeout={TIMEOUT_S:g}"
        ratios = [med[(key, kind, w)] / med[("auto, no timeout", kind, w)] for kind in KINDS for w in ("sampled", "all")]
        print(f"decode_timeout's thread per call: {key} / auto, no timeout = {min(ratios):.2f} to {max(ratios):.2f} "
              "over the kinds and works above\n")
