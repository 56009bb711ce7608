"""``python -m perf [--reps N] [--build-reps N] [--only SECTION]`` (step, rollout, longvideo, build, semantic,
libraries, decode, memory, trl, scaling, sequence-parallel): print tables of timings and of memory: the peak of one
training micro-batch, the optimizer update's bytes per parameter, and a ZeRO-3 checkpoint's peak on each rank.

* ``--only trl``: mmrl's GRPO step against TRL's ``GRPOTrainer`` as interleaved pairs of step blocks (mmrl,
  TRL, mmrl, TRL, ... after a warm-up pair; the median of the per-pair samples/s ratios) at about 1M and 23M
  parameters, with per-stage seconds for both (generation, the rest of the rollout, log-prob/reference
  passes, forward+backward, optimizer and the rest) and what each side does (:mod:`perf.trl_compare`);
  ``--trl-sizes small`` runs one size only, ``--trl-pairs-only`` leaves out the sections after the pairs (the
  framework overhead, the video step, HF vs vLLM generation);
* ``--only update``: the GRPO update at Qwen2.5-VL-3B depth and tiny width (1,024 vision tokens, 1 prompt x G=8),
  the real-model preset before issue 58 (sdpa, 2 rows a micro-batch) against the preset as it is, in one run:
  seconds per trained token, aten operations and attention calls an update, and their ratios
  (:mod:`perf.update_speed`; ``--update-reps`` alternating timed updates after a warm-up, median);
* ``--only sequence-parallel``: the update's per-rank resident set at ``train.sequence_parallel_size`` 1, 2 and
  4 on gloo CPU ranks, and its ratio to one process (:mod:`perf.sequence_parallel`);
* ``--only scaling``: the update's weak scaling, 2 gloo ranks against one process at equal work per rank
  (the ratio of update seconds per step; 1.0 is perfect) and the ranks' work balance (:mod:`perf.scaling`);
* ``--only longvideo``: generation on 2 long-video prompts (16 frames at 336x336, 1,152 video tokens, a prompt of
  1,200 tokens) x G=8 x 16 tokens with the prompt prefilled once per group (``rollout.prefill_once``) vs
  repeated G times, interleaved repetitions after a warm-up, median seconds, the speed-up and whether both
  drew the same tokens under the same seed (:mod:`perf.longvideo`), on the default tiny model
  (``--longvideo-size small``: the hidden-512 x 4-layer text model);
* ``--only decode``: seconds per video of each video decoder that runs here (decord, PyAV, torchcodec where FFmpeg's
  libraries load), on the same MP4 files of three kinds, opening + the frames a run samples and opening + every
  frame, with the ratio to PyAV's, and ``data.media.decode_timeout``'s cost (:mod:`perf.decode`; ``--decode-reps``);
* ``--only libraries``: hand-written code against the library that replaced it or does the same, in one run
  (:mod:`perf.libraries`): Video-R1's word edit distance on a 512 x 512-word pair, the old Python DP vs
  rapidfuzz; the scoring part of the variance filters (VAS's edit diversity, Temporal-R1's ``variance_filter``
  on OCR answers) on a 1,000-prompt pool, before (the old DP, measured on ``--lib-before-prompts`` prompts and
  scaled to the pool) and after; mmrl's BERTScore vs torchmetrics' on the same model;
* the other sections: see :mod:`perf`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from perf.toy_media import FAMILY, FRAMES, SIDE, toy_video

G = 8
PROMPTS = 2


def _setup(root: Path):
    from mmrl.model import MediaInput, load_policy
    from mmrl.toy.tiny_models import make_tiny
    from video import sample_video

    # a video budget that keeps 112x112 frames as they are: grid (8, 8, 8) = 512 patches, 128 tokens per video
    path = make_tiny(FAMILY, root / "model", seed=0, video_max_pixels=SIDE * SIDE)
    policy = load_policy(path)
    prompts, grid = [], None
    for i in range(PROMPTS):
        data = sample_video(toy_video(root / f"v{i}.mp4", i), "qwen", nframes=FRAMES, min_pixels=SIDE * SIDE,
                            max_pixels=SIDE * SIDE, image_patch_size=14)
        item = MediaInput(key=f"video-{i}", kind="video", data=data)
        messages = [{"role": "user", "content": [{"type": "video"},
                                                  {"type": "text", "text": "Which way does the square move?"}]}]
        prompts.append(policy.encode(policy.render(messages), [item]))
        grid = policy.media[item.key].grid_thw.tolist()
    return policy, prompts, grid


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _compare(policy, runs: dict[str, Callable[[], None]], reps: int) -> dict[str, tuple[float, int]]:
    """Warm up each mode once, then interleave ``reps`` repetitions; median seconds and tower calls."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    calls: dict[str, int] = {}
    for name, fn in runs.items():
        fn()
    for _ in range(reps):
        for name, fn in runs.items():
            before = policy.vision_calls
            times[name].append(_timed(fn))
            calls[name] = policy.vision_calls - before
    return {k: (statistics.median(v), calls[k]) for k, v in times.items()}


def bench_step(policy, prompts, reps: int) -> dict[str, tuple[float, int]]:
    rng = np.random.default_rng(0)
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    seqs = [p.extend(rng.integers(40, 250, size=int(rng.integers(16, 48))).tolist() + [end], trained=True)
            for p in prompts for _ in range(G)]
    policy.set_trainable()
    policy.model.train()

    def step(shared: bool) -> Callable[[], None]:
        def run() -> None:
            policy.configure(share_vision_features=shared)
            policy.model.zero_grad(set_to_none=True)
            logp, _, mask = policy.forward_logprobs(seqs)
            (-(logp * mask).sum() / mask.sum()).backward()
        return run

    return _compare(policy, {"shared": step(True), "per-sequence": step(False)}, reps)


def bench_rollout(policy, prompts, reps: int) -> dict[str, tuple[float, int]]:
    policy.model.eval()

    def shared() -> None:
        policy.configure(share_vision_features=True)
        torch.manual_seed(0)
        policy.generate(prompts, max_new_tokens=16, num_return_sequences=G)

    def repeated() -> None:
        policy.configure(share_vision_features=False)
        torch.manual_seed(0)
        policy.generate([p for p in prompts for _ in range(G)], max_new_tokens=16, num_return_sequences=1)

    return _compare(policy, {"shared": shared, "per-sequence": repeated}, reps)


def bench_build(root: Path, reps: int) -> list[tuple[str, float]]:
    """Median seconds to build the small toy world and a tiny model of each family, each into a new folder."""
    from data_pipelines.toy import make_toy
    from mmrl.toy.tiny_models import FAMILIES, make_tiny

    builds: dict[str, Callable[[Path], object]] = {
        "toy world, size small (make_toy)": lambda out: make_toy(out, seed=0, size="small", progress=False),
    }
    for family in FAMILIES:
        builds[f"tiny model {family} (make_tiny)"] = lambda out, family=family: make_tiny(family, out, seed=0)
    rows = []
    for i, (name, build) in enumerate(builds.items()):
        build(root / f"warm-up-{i}")  # imports and first-call caches are not part of the figure
        seconds = []
        for r in range(reps):
            t0 = time.perf_counter()
            build(root / f"build-{i}-{r}")
            seconds.append(time.perf_counter() - t0)
        rows.append((name, statistics.median(seconds)))
    return rows


def _print_builds(rows: list[tuple[str, float]], reps: int) -> None:
    head = f"{'build':<52} {'seconds':>11}"
    print(f"builds: median of {reps} after one warm-up build, each into a new folder\n")
    print(head)
    print("-" * len(head))
    for name, seconds in rows:
        print(f"{name:<52} {seconds:>11.2f}")
    print()


# ------------------------------------------------------------------------------------------------ memory
MEM_VOCAB = 151936  # Qwen2/2.5/3-VL's vocabulary (embedding rows)
MEM_PROMPT = 16  # prompt tokens per sequence (not trained on)
MEM_SIZE = {"hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate_size": 128}
# (label, chunk_tokens (0: the full log-softmax at once), entropy_grad); every mode asks for entropies as the
# trainer does.
MEM_MODES = (
    ("before: full log-softmax, entropies without grad", 0, False),
    ("before: full log-softmax, entropies with grad", 0, True),
    ("after: chunked, entropies without grad", None, False),
    ("after: chunked, entropies with grad", None, True),
)


def memory_case(model_dir: str, vocab: int, seqs: int, tokens: int, chunk: int | None, entropy_grad: bool,
                device: str, threads: int) -> Callable[[], dict]:
    """Setup (not measured) of one micro-batch in a fresh process: the tiny model with a ``vocab``-row
    embedding and LM head, ``seqs`` text sequences of ``MEM_PROMPT`` prompt + ``tokens`` response tokens
    (random ids). The returned ``work`` is the measured part: forward_logprobs, a scalar loss, backward."""
    from transformers import AutoConfig, AutoProcessor

    from mmrl.model import Policy, TokenSeq
    from mmrl.toy.tiny_models import build_model

    torch.set_num_threads(threads)
    config = AutoConfig.from_pretrained(model_dir)
    config.text_config.vocab_size = vocab
    policy = Policy(build_model(FAMILY, config, seed=0).to(device), AutoProcessor.from_pretrained(model_dir))
    policy.set_trainable()
    policy.model.train()
    # ids above the tiny tokenizer's own (its special tokens, vision placeholders included, are below 2000)
    rng = np.random.default_rng(0)
    batch = [TokenSeq(ids=rng.integers(2000, vocab, MEM_PROMPT + tokens).tolist(),
                      mm_types=[0] * (MEM_PROMPT + tokens), loss_mask=[0] * MEM_PROMPT + [1] * tokens)
             for _ in range(seqs)]

    def work() -> dict:
        logp, ent, mask = policy.forward_logprobs(batch, with_entropy=True, entropy_grad=entropy_grad,
                                                  chunk_tokens=chunk)
        loss = -(logp * mask).sum() / mask.sum()
        if entropy_grad:  # a loss term that uses the entropies (entropy_coef != 0)
            loss = loss - 1e-3 * (ent * mask).sum() / mask.sum()
        loss.backward()
        return {"loss": loss.item(), "tokens": int(mask.sum())}

    return work


@dataclasses.dataclass
class OutOfMemory:
    """A mode whose process the system killed for memory: its peak is above ``peak_bytes`` (what was free)."""

    start_bytes: int = 0
    peak_bytes: int = 0
    method: str = "out of memory"

    @property
    def extra_bytes(self) -> int:
        return self.peak_bytes


def bench_memory(root: Path, seqs: int, tokens: int, *, device: str = "auto", shrink: bool = True
                 ) -> tuple[dict, list[tuple]]:
    """Peak memory of one training micro-batch in each of :data:`MEM_MODES`, each in a fresh process
    (:func:`mmrl.engine.memory.measure_in_subprocess`). Where the machine cannot hold the full log-softmax of
    ``seqs`` x ``tokens`` rows, the number of sequences is halved until it can (said in the returned info)."""
    # by its import name: spawned children cannot find functions of the ``python -m perf`` main module
    from mmrl.engine.memory import GB, available_bytes, measure_in_subprocess
    from mmrl.model import PolicyOptions, resolve_device
    from mmrl.toy.tiny_models import make_tiny
    from perf.__main__ import memory_case

    dev = resolve_device(device)
    model_dir = make_tiny(FAMILY, root / "memory-model", seed=0, **MEM_SIZE)

    def need(n: int) -> float:  # the unchunked modes hold up to five (rows x vocabulary) fp32 tensors at once
        return 5 * n * tokens * MEM_VOCAB * 4 + GB
    avail = available_bytes(dev)
    asked = seqs
    while shrink and avail is not None and seqs > 1 and need(seqs) > 0.8 * avail:
        seqs //= 2
    info = {"device": str(dev), "asked": asked, "seqs": seqs, "tokens": tokens, "vocab": MEM_VOCAB,
            "available_gb": None if avail is None else avail / GB, "need_gb": need(asked) / GB,
            "chunk": PolicyOptions.logprob_chunk_tokens, "threads": torch.get_num_threads()}
    rows = []
    for label, chunk, entropy_grad in MEM_MODES:
        try:
            peak, out = measure_in_subprocess(memory_case, str(model_dir), MEM_VOCAB, seqs, tokens, chunk,
                                              entropy_grad, str(dev), torch.get_num_threads(),
                                              device=str(dev) if dev.type == "cuda" else None)
        except RuntimeError as exc:  # killed for memory (--memory-no-shrink): its peak is above what was free
            if "out of memory" not in str(exc) or avail is None:
                raise
            peak, out = OutOfMemory(start_bytes=0, peak_bytes=avail, method="out of memory"), None
        rows.append((label, peak, out))
    return info, rows


def _print_memory(info: dict, rows: list[tuple]) -> None:
    from mmrl.engine.memory import GB

    print(f"memory: peak of ONE training micro-batch (forward_logprobs with entropies + scalar loss + backward), "
          f"tiny {FAMILY} (hidden {MEM_SIZE['hidden_size']}, {MEM_SIZE['layers']} layers) with a "
          f"{info['vocab']}-token vocabulary, {info['seqs']} sequences x {info['tokens']} response tokens "
          f"(+{MEM_PROMPT} prompt tokens); chunk {info['chunk']} rows; device {info['device']}; each mode in a "
          "fresh process")
    if info["seqs"] != info["asked"]:
        print(f"NOTE: {info['asked']} x {info['tokens']} needs about {info['need_gb']:.0f} GB for the unchunked "
              f"modes and {info['available_gb']:.0f} GB are available: measured at {info['seqs']} sequences")
    how = next((p.method for _, p, _ in rows if not isinstance(p, OutOfMemory)), "")
    print(f"counted: {'live CUDA tensor bytes' if how.startswith('cuda') else 'resident set (VmHWM)'} "
          f"({how}); 'peak' is above what was in use before the micro-batch (model and inputs loaded)\n")
    head = f"{'mode':<52} {'peak GB':>9} {'absolute GB':>12} {'vs before':>10}"
    print(head)
    print("-" * len(head))
    before = rows[0][1].extra_bytes
    oom = isinstance(rows[0][1], OutOfMemory)
    for label, peak, _ in rows:
        if isinstance(peak, OutOfMemory):
            print(f"{label:<52} {'> ' + format(peak.extra_bytes / GB, '.1f'):>9} {'killed':>12} "
                  f"{'(out of memory)':>10}")
            continue
        print(f"{label:<52} {peak.extra_bytes / GB:>9.2f} {peak.peak_bytes / GB:>12.2f} "
              f"{('< ' if oom else '') + format(peak.extra_bytes / before, '.2f') + 'x':>10}")
    after = next(p for label, p, _ in rows if label.startswith("after: chunked, entropies without"))
    bound = "below " if oom else ""
    print(f"\nafter/before (entropies without grad): {bound}{after.extra_bytes / before:.3f} (target <= 0.333)"
          + ("; 'before' did not fit in the free memory, so its peak is above what was free and the ratio is "
             "an upper bound" if oom else "") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    parser.add_argument("--reps", type=int, default=9, help="timed repetitions per mode (median reported)")
    parser.add_argument("--build-reps", type=int, default=3, help="timed builds of each fixture (median reported)")
    parser.add_argument("--only", choices=["step", "rollout", "longvideo", "build", "semantic", "libraries", "memory",
                                           "trl", "scaling", "update", "decode", "sequence-parallel"],
                        default=None)
    parser.add_argument("--decode-reps", type=int, default=5,
                        help="timed repetitions of every decoder on every file in the decode section (median)")
    parser.add_argument("--lib-before-prompts", type=int, default=10,
                        help="with libraries: prompts of the 1,000-prompt pool the old edit-distance DP is timed on "
                             "(scaled to the pool; 1000 measures all of it: about 20 minutes)")
    parser.add_argument("--update-reps", type=int, default=2,
                        help="timed updates of each arm in the update section, alternating after a warm-up (median)")
    parser.add_argument("--scaling-ranks", type=int, default=2, help="gloo ranks of the weak-scaling case")
    parser.add_argument("--trl-steps", type=int, default=3, help="steps per alternating block in the TRL comparison")
    parser.add_argument("--trl-rounds", type=int, default=4,
                        help="timed pairs of blocks (mmrl, then TRL) after a warm-up pair; the median ratio is reported")
    parser.add_argument("--trl-sizes", default="tiny,small",
                        help="comma-separated model sizes of the TRL comparison (tiny: ~1M, small: ~23M parameters)")
    parser.add_argument("--trl-pairs-only", action="store_true",
                        help="with --only trl: the interleaved pairs alone (no overhead, video-step or vLLM sections)")
    parser.add_argument("--longvideo-reps", type=int, default=5,
                        help="timed repetitions of each mode in the long-video generation case (median reported)")
    parser.add_argument("--longvideo-size", choices=["tiny", "small"], default="tiny",
                        help="the text model of the long-video case (tiny: hidden 128 x 2 layers, the default "
                             "tiny model; small: hidden 512 x 4 layers)")
    parser.add_argument("--memory-seqs", type=int, default=16, help="sequences in the measured micro-batch")
    parser.add_argument("--memory-tokens", type=int, default=512, help="response tokens per sequence")
    parser.add_argument("--device", default="auto", help="device of the memory measurement (auto: CUDA if any)")
    parser.add_argument("--memory-no-shrink", action="store_true",
                        help="measure at --memory-seqs even where the unchunked modes may not fit (the estimate "
                             "of five full-vocabulary tensors is an upper bound)")
    args = parser.parse_args(argv)
    if args.only in (None, "update"):
        from perf.update_speed import measure, print_update

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-update-") as tmp:
            print_update(measure(Path(tmp), reps=args.update_reps))
        sys.stdout.flush()
    if args.only == "update":
        return 0
    if args.only in (None, "scaling"):
        from perf.scaling import bench_scaling, print_scaling

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-scaling-") as tmp:
            print_scaling(bench_scaling(Path(tmp), ranks=args.scaling_ranks))
        sys.stdout.flush()
    if args.only == "scaling":
        return 0
    if args.only in (None, "sequence-parallel"):
        from perf.sequence_parallel import bench_sequence_parallel, print_sequence_parallel

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-sp-") as tmp:
            print_sequence_parallel(bench_sequence_parallel(Path(tmp)))
        sys.stdout.flush()
    if args.only == "sequence-parallel":
        return 0
    if args.only in (None, "trl"):
        from perf.trl_compare import print_trl, run_trl

        print_trl(run_trl(args.trl_steps, args.trl_rounds, sizes=args.trl_sizes.split(",")))
        sys.stdout.flush()
    if args.only in (None, "trl") and not args.trl_pairs_only:
        from perf.trl_compare import SIZES, overhead, print_overhead, print_video_step, video_step

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-overhead-") as tmp:
            print_overhead(overhead(Path(tmp), size=SIZES["small"]), "small")
        with tempfile.TemporaryDirectory(prefix="mmrl-perf-video-") as tmp:
            print_video_step(video_step(Path(tmp)))
        from perf.trl_compare import generation, print_generation

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-generation-") as tmp:
            print_generation(generation(Path(tmp)))
        sys.stdout.flush()
    if args.only == "trl":
        return 0
    if args.only == "memory":
        _memory_section(args)
        return 0
    if args.only in (None, "longvideo"):
        from perf.longvideo import bench_longvideo, print_longvideo

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-longvideo-") as tmp:
            print_longvideo(bench_longvideo(Path(tmp), reps=args.longvideo_reps, size=args.longvideo_size))
        sys.stdout.flush()
    if args.only == "longvideo":
        return 0
    if args.only in (None, "semantic"):
        from perf.semantic import bench_semantic, print_semantic

        print_semantic(bench_semantic(min(args.reps, 3)), min(args.reps, 3))
        sys.stdout.flush()
    if args.only == "semantic":
        return 0
    if args.only in (None, "libraries"):
        from perf.libraries import print_libraries, run_libraries

        print_libraries(run_libraries(min(args.reps, 5), args.lib_before_prompts))
        sys.stdout.flush()
    if args.only == "libraries":
        return 0
    if args.only in (None, "decode"):
        from perf.decode import bench_decode, print_decode

        with tempfile.TemporaryDirectory(prefix="mmrl-perf-decode-") as tmp:
            print_decode(bench_decode(Path(tmp), reps=args.decode_reps))
        sys.stdout.flush()
    if args.only == "decode":
        return 0
    if args.only in (None, "build"):
        with tempfile.TemporaryDirectory(prefix="mmrl-perf-build-") as tmp:
            _print_builds(bench_build(Path(tmp), args.build_reps), args.build_reps)
        sys.stdout.flush()
    if args.only == "build":
        return 0
    with tempfile.TemporaryDirectory(prefix="mmrl-perf-") as tmp:
        t0 = time.perf_counter()
        policy, prompts, grid = _setup(Path(tmp))
        print(f"model: tiny {FAMILY}, {sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f}M parameters; "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads; setup {time.perf_counter() - t0:.1f} s")
        print(f"batch: {PROMPTS} prompts x G={G} rollouts; each video {FRAMES} frames at {SIDE}x{SIDE} "
              f"(grid t,h,w = {grid}); prompt length {len(prompts[0])} tokens; median of {args.reps} "
              "interleaved repetitions after a warm-up\n")
        rows = []
        if args.only in (None, "step"):
            rows.append(("train step: forward+backward of forward_logprobs", bench_step(policy, prompts, args.reps)))
        if args.only in (None, "rollout"):
            rows.append((f"rollout: generate {G} x 16 new tokens per prompt", bench_rollout(policy, prompts, args.reps)))
        head = f"{'benchmark':<52} {'shared (s)':>11} {'per-seq (s)':>12} {'speed-up':>9} {'tower calls':>13}"
        print(head)
        print("-" * len(head))
        for name, r in rows:
            (ts, cs), (tu, cu) = r["shared"], r["per-sequence"]
            print(f"{name:<52} {ts:>11.3f} {tu:>12.3f} {tu / ts:>8.2f}x {f'{cs} vs {cu}':>13}")
        sys.stdout.flush()
    if args.only is None:
        print()
        _memory_section(args)
    return 0


def _memory_section(args: argparse.Namespace) -> None:
    """One micro-batch's log-prob memory, the update's bytes per parameter, a ZeRO-3 checkpoint's peaks."""
    from perf.update_memory import bench_update, bench_zero3_checkpoint, print_update, print_zero3_checkpoint

    with tempfile.TemporaryDirectory(prefix="mmrl-perf-memory-") as tmp:
        _print_memory(*bench_memory(Path(tmp), args.memory_seqs, args.memory_tokens, device=args.device,
                                    shrink=not args.memory_no_shrink))
        sys.stdout.flush()
        print_update(bench_update(Path(tmp)))
        sys.stdout.flush()
        print_zero3_checkpoint(bench_zero3_checkpoint(Path(tmp)))
        sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
