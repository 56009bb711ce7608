"""mmrl's GRPO step against TRL's ``GRPOTrainer`` (the anchor), side by side in one process.

Both train the same tiny Qwen2.5-VL folder on the same two 112x112 images (questions with open answers),
with G=8 completions per prompt, 16 new tokens at most (a random-weight model almost never ends earlier;
the mean completion length of each is reported; no stop strings on either side), temperature 1, fp32, no KL
reference (beta 0), one optimizer update per batch of 16 sequences, AdamW at the same learning rate, and the
same reward (the completion's length in characters, so groups have non-zero advantages).

Measured as interleaved pairs: TRL's own training loop runs, and as each block of TRL steps begins a callback
first runs a block of as many mmrl steps (A B A B A B ...); the first pair is a warm-up. Each pair gives a
ratio of samples/s (TRL block seconds / mmrl block seconds); the median of those ratios is reported, with
each side's median seconds per step. Stage clocks (instance attributes over the bound methods, nothing else
changed) split each step into generation, the rest of the rollout, log-prob/reference passes without grad,
forward+backward and the optimizer with the rest (:data:`STAGE_NOTES` says what each covers on each side).

What could not be made equal: TRL generates with ``model.generate`` on the prompt repeated G times and
recomputes the vision features in every pass; mmrl generates G sequences per prompt from one prompt
encoding, prefills each prompt once per group (``rollout.prefill_once``), shares the vision features across a
group, runs the prompt once per group in training (``train.shared_prefix``; with sdpa, where it costs less, in
one packed pass with the group's completions) and packs its log-prob passes
without padding (``train.padding_free``) where those settings are on. Activation checkpointing is off on both
sides (TRL's default turns it on; mmrl's leaves it off). Each framework's own defaults are otherwise kept.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

QUESTION = "Describe the picture."


def _images(root: Path, n: int, side: int) -> list[Path]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        p = root / f"image{i}.png"
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def _length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(c if isinstance(c, str) else c[-1]["content"])) / 10 for c in completions]


def register_bench_reward() -> None:
    from rewards import register_reward
    from rewards.registry import REWARDS

    if "bench_length" not in REWARDS:
        register_reward("bench_length", locate_errors=False)(_length_reward)


class _TRLTimer:
    """What TRL logs that the table shows: the mean completion length of each step."""

    def __init__(self) -> None:
        self.lengths: list[float] = []


def trl_trainer(model_dir: Path, images: list[Path], out: Path, *, steps: int, group: int, tokens: int, lr: float):
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    timer = _TRLTimer()

    class Timer(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                timer.lengths.append(float(logs["completions/mean_length"]))

    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
             "image": Image.open(p).convert("RGB")} for p in images]
    data = Dataset.from_list(rows * (steps + 1))
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=len(images) * group, num_generations=group,
        gradient_accumulation_steps=1, max_completion_length=tokens, max_steps=steps, learning_rate=lr,
        beta=0.0, temperature=1.0, top_p=1.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        bf16=False, fp16=False, seed=0, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
        gradient_checkpointing=False)  # TRL's default is on; mmrl's (model.gradient_checkpointing) off
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32")
    processor = AutoProcessor.from_pretrained(model_dir, padding_side="left")
    trainer = GRPOTrainer(model=model, reward_funcs=[_length_reward], args=args, train_dataset=data,
                          processing_class=processor, callbacks=[Timer()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # its per-step dicts would drown the table
    return trainer, timer


def mmrl_trainer(model_dir: Path, images: list[Path], out: Path, *, group: int, tokens: int, lr: float):
    import json

    from data_pipelines.loaders import load_samples
    from mmrl.config import load_run_config
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import PolicyOptions, load_policy

    register_bench_reward()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"img{i}", "problem_type": "open", "question": QUESTION,
                                        "answer": "noise", "media": [{"type": "image", "path": str(p)}]}) + "\n"
                            for i, p in enumerate(images)))
    cfg = load_run_config("image-qa", overrides=[
        f"model.path={model_dir}", f"data.train={data}", "rewards=[{name: bench_length}]",
        f"rollout.group_size={group}", f"rollout.max_new_tokens={tokens}", "rollout.temperature=1.0",
        "rollout.stop=[]",  # TRL stops on end-of-turn only (a stop string costs a check at every token)
        f"train.prompts_per_step={len(images)}", f"train.micro_batch_size={len(images) * group}",
        f"train.lr={lr}", "grpo.kl_coef=0.0", "grpo.ppo_epochs=1", "train.log_rollouts=0", "train.save_every=0",
        "data.check_media=none", "train.health_window=0"])
    samples = load_samples(data).samples
    policy = load_policy(model_dir, device="cpu")
    policy.configure(PolicyOptions.from_config(cfg))  # the log-prob and vision-cache settings, as mmrl train
    return GRPOTrainer(cfg, policy, samples, run_dir=out / "run", show_progress=False)


STAGES = ("generation", "other rollout", "log-prob/ref passes", "forward+backward", "optimizer + rest")
STAGE_NOTES = {
    "mmrl": "generation = Policy.generate (vision tower, prompt prefill once per group, decoding); other rollout = "
            "media/prompt preparation, rewards; log-prob/ref passes = reference_pass; forward+backward = the "
            "micro-batches' forward_logprobs, loss and backward; optimizer + rest = AdamW step, advantages, "
            "scheduler, step statistics",
    "TRL": "generation = _generate_single_turn (model.generate on the prompt repeated G times, vision included); "
           "other rollout = the rest of _prepare_inputs (chat template, image processing, tokenizing, rewards, "
           "advantages); log-prob/ref passes = _get_per_token_logps_and_entropies without grad; forward+backward = "
           "training_step less _prepare_inputs (compute_loss, backward); optimizer + rest = on_step_begin to "
           "on_step_end less training_step (clipping, AdamW step, scheduler, zero_grad)",
}


class _Clock:
    """Seconds per stage of the current step, added up by the wrapped methods; one dict per finished step."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def add(self, key: str, seconds: float) -> None:
        self.now[key] = self.now.get(key, 0.0) + seconds

    def wrap(self, obj: Any, name: str, key: str, when=None) -> None:
        """Time ``obj.name`` into ``key`` (an instance attribute over the bound method: timing only);
        ``when()`` False: not counted."""
        fn = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            if when is not None and not when():
                return fn(*a, **kw)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.add(key, time.perf_counter() - t0)

        setattr(obj, name, timed)

    def finish(self, total: float) -> None:
        self.now["step"] = total
        self.steps.append(self.now)
        self.now = {}


def _mmrl_stages(raw: dict[str, float]) -> dict[str, float]:
    gen, ref, fb = raw.get("generate", 0.0), raw.get("reference", 0.0), raw.get("micro_steps", 0.0)
    rollout = raw.get("rollout", gen)
    return {"generation": gen, "other rollout": rollout - gen, "log-prob/ref passes": ref, "forward+backward": fb,
            "optimizer + rest": raw["step"] - rollout - ref - fb, "step": raw["step"]}


def _trl_stages(raw: dict[str, float]) -> dict[str, float]:
    gen, lp = raw.get("generate", 0.0), raw.get("logps_nograd", 0.0)
    prep, train = raw.get("prepare", 0.0), raw.get("training_step", 0.0)
    return {"generation": gen, "other rollout": prep - gen - lp, "log-prob/ref passes": lp,
            "forward+backward": train - prep, "optimizer + rest": raw["step"] - train, "step": raw["step"]}


def _mean_stages(steps: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.mean(s[k] for s in steps) for k in steps[0]} if steps else {}


def compare(root: Path, *, size: dict[str, int], steps: int = 3, rounds: int = 3, group: int = 8,
            tokens: int = 16, lr: float = 1e-6) -> dict[str, Any]:
    """mmrl and TRL as interleaved pairs: a block of ``steps`` mmrl steps, then a block of ``steps`` TRL steps,
    and again (A B A B ...): one untimed warm-up pair, then ``rounds`` timed pairs. TRL's own loop runs; a
    callback runs each mmrl block as a TRL block begins (before TRL's step timer starts). Per pair, the ratio
    of the two blocks' samples/s (= TRL block seconds / mmrl block seconds); reported: the per-pair ratios
    and their median, each framework's median s/step and the mean seconds per step of each stage."""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from mmrl.toy.tiny_models import make_tiny
    from perf.pairs import median_pair_ratio, pair_ratios

    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, image_min_pixels=112 * 112, image_max_pixels=112 * 112, **size)
    params = sum(t.numel() for t in load_file(str(model_dir / "model.safetensors")).values())
    images = _images(root, 2, 112)
    torch.manual_seed(0)
    total = steps * (rounds + 1)
    trl, timer = trl_trainer(model_dir, images, root / "trl", steps=total, group=group, tokens=tokens, lr=lr)
    mm = mmrl_trainer(model_dir, images, root / "mmrl", group=group, tokens=tokens, lr=lr)

    # stage clocks (instance attributes over the bound methods; nothing else changes)
    mm_clock, trl_clock = _Clock(), _Clock()
    mm_clock.wrap(mm.policy, "generate", "generate")
    mm_clock.wrap(mm, "reference_pass", "reference")
    mm_clock.wrap(mm, "_micro_step", "micro_steps")
    trl_clock.wrap(trl, "_generate_single_turn", "generate")
    trl_clock.wrap(trl, "_get_per_token_logps_and_entropies", "logps_nograd", when=lambda: not torch.is_grad_enabled())
    trl_clock.wrap(trl, "_prepare_inputs", "prepare")
    trl_clock.wrap(trl, "training_step", "training_step")

    mm_blocks: list[float] = []
    trl_blocks: list[float] = []
    mm_lengths: list[float] = []
    t_begin = [0.0]

    class Pairs(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % steps == 0:  # a new pair: first its mmrl block
                block = 0.0
                for _ in range(steps):
                    t0 = time.perf_counter()
                    stats = mm.train_step()
                    mm.step += 1
                    took = time.perf_counter() - t0
                    block += took
                    mm_clock.add("rollout", float(stats.get("time/rollout_s", 0.0)))
                    mm_clock.finish(took)
                    mm_lengths.append(float(stats.get("response_length", float("nan"))))
                mm_blocks.append(block)
                trl_blocks.append(0.0)
            t_begin[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            took = time.perf_counter() - t_begin[0]
            trl_blocks[-1] += took
            trl_clock.finish(took)

    trl.add_callback(Pairs())
    trl.train()
    n = 2 * group
    mm_times = [s["step"] for s in mm_clock.steps[steps:]]
    trl_times = [s["step"] for s in trl_clock.steps[steps:]]
    trl_lengths = timer.lengths[steps:]
    ratios = pair_ratios(trl_blocks[1:], mm_blocks[1:])
    trl_s, mm_s = statistics.median(trl_times), statistics.median(mm_times)
    return {"parameters_m": params / 1e6, "trl_s_per_step": trl_s, "mmrl_s_per_step": mm_s,
            "trl_samples_per_s": n / trl_s, "mmrl_samples_per_s": n / mm_s,
            "pair_ratios": ratios, "ratio": median_pair_ratio(trl_blocks[1:], mm_blocks[1:]),
            "mmrl_blocks_s": mm_blocks[1:], "trl_blocks_s": trl_blocks[1:], "steps": steps,
            "mmrl_stages": _mean_stages([_mmrl_stages(s) for s in mm_clock.steps[steps:]]),
            "trl_stages": _mean_stages([_trl_stages(s) for s in trl_clock.steps[steps:]]),
            "trl_mean_length": statistics.mean(trl_lengths) if trl_lengths else float("nan"),
            "mmrl_mean_length": statistics.mean(mm_lengths[steps:]), "steps_timed": len(mm_times)}


# the two model sizes of the comparison: the default tiny model (~1M parameters) and one where model compute
# dominates (~20M)
SIZES = {"tiny": {}, "small": {"hidden_size": 512, "layers": 4, "heads": 8, "kv_heads": 4,
                               "intermediate_size": 2048, "vision_depth": 4, "vision_hidden_size": 256,
                               "vision_heads": 4, "vision_intermediate_size": 1024}}


def run_trl(steps: int, rounds: int, sizes: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """:func:`compare` at each model size of ``sizes`` (names in :data:`SIZES`; default: all of them)."""
    import tempfile

    unknown = [s for s in sizes or () if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown TRL comparison size(s) {', '.join(unknown)}; choose from {', '.join(SIZES)}")
    out = []
    for name, size in SIZES.items():
        if sizes is not None and name not in sizes:
            continue
        with tempfile.TemporaryDirectory(prefix=f"mmrl-perf-trl-{name}-") as tmp:
            out.append((name, compare(Path(tmp), size=size, steps=steps, rounds=rounds)))
    return out


FAIRNESS = (
    ("same on both sides: the same tiny Qwen2.5-VL folder and two 112x112 images, 2 prompts x G=8, <= 16 new "
     "tokens, temperature 1, no stop strings, fp32 on the CPU, beta 0 (no reference), one AdamW update per batch of "
     "16 at the same learning rate, the same length reward, activation checkpointing off (TRL's default is on, "
     "mmrl's off), one process (the same torch threads)"),
    ("mmrl (its defaults): one prompt encoding per group, vision features shared across the group, the prompt "
     "prefilled once per group in generation (rollout.prefill_once), the shared-prefix training forward "
     "(train.shared_prefix), the per-step vision cache, padding-free log-prob passes (train.padding_free), "
     "chunked log-softmax"),
    ("TRL (its defaults): model.generate with the prompt repeated G times (G prefills and vision-tower runs per "
     "prompt), the padded batch in the loss forward (vision recomputed), no old-log-prob pass (on-policy)"),
)


def print_trl(rows: list[tuple[str, dict[str, Any]]]) -> None:
    import torch

    print(f"GRPO step, mmrl vs TRL {_trl_version()} GRPOTrainer: tiny Qwen2.5-VL, 2 prompts x G=8 on 112x112 "
          f"images, <= 16 new tokens, fp32, beta 0, one update per batch; torch {torch.get_num_threads()} "
          "thread(s); interleaved pairs (a block of mmrl steps, then a block of TRL steps, A B A B ...) after one "
          "warm-up pair; ratio = the median of the per-pair ratios of samples/s")
    for line in FAIRNESS:
        print(f"  {line}")
    head = (f"{'model':<16} {'TRL s/step':>11} {'mmrl s/step':>12} {'TRL samples/s':>14} {'mmrl samples/s':>15} "
            f"{'mmrl/TRL':>9} {'mean len TRL/mmrl':>18}")
    print(head)
    print("-" * len(head))
    for name, r in rows:
        label = "{} ({:.1f}M)".format(name, r["parameters_m"])
        lengths = "{:.1f} / {:.1f}".format(r["trl_mean_length"], r["mmrl_mean_length"])
        print(f"{label:<16} {r['trl_s_per_step']:>11.3f} {r['mmrl_s_per_step']:>12.3f} "
              f"{r['trl_samples_per_s']:>14.1f} {r['mmrl_samples_per_s']:>15.1f} {r['ratio']:>8.2f}x {lengths:>18}")
    print("(s/step and samples/s: medians over the timed steps; mmrl/TRL: the median of the per-pair ratios)\n")
    for name, r in rows:
        print(f"pairs, {name} ({r['parameters_m']:.1f}M), {r['steps']} steps per block:")
        ph = f"{'pair':>5} {'mmrl block s':>13} {'TRL block s':>12} {'mmrl/TRL samples/s':>19}"
        print(ph)
        print("-" * len(ph))
        for i, (a, b, q) in enumerate(zip(r["mmrl_blocks_s"], r["trl_blocks_s"], r["pair_ratios"]), 1):
            print(f"{i:>5} {a:>13.3f} {b:>12.3f} {q:>18.2f}x")
        print(f"{'median':>5} {'':>13} {'':>12} {r['ratio']:>18.2f}x\n")
        print(f"per-stage seconds per step, {name} ({r['parameters_m']:.1f}M): mean over the timed steps")
        sh = f"{'stage':<22} {'mmrl s':>8} {'TRL s':>8} {'TRL/mmrl':>9}"
        print(sh)
        print("-" * len(sh))
        for stage in (*STAGES, "step"):
            a, b = r["mmrl_stages"].get(stage, 0.0), r["trl_stages"].get(stage, 0.0)
            ratio = f"{b / a:.2f}x" if a > 1e-4 else "-"
            print(f"{stage:<22} {a:>8.3f} {b:>8.3f} {ratio:>9}")
        print()
    for side, note in STAGE_NOTES.items():
        print(f"  stages, {side}: {note}")
    print()


def _trl_version() -> str:
    import trl

    return trl.__version__


def overhead(root: Path, *, size: dict[str, int], steps: int = 4, group: int = 8, tokens: int = 16) -> dict[str, float]:
    """mmrl's framework overhead: the share of a GRPO step's time spent outside model forward passes,
    backward passes and ``generate`` (media preparation, batching, rewards, advantages, logging), measured
    with timers around those three on the same image setting as :func:`compare` (first step untimed)."""
    from mmrl.toy.tiny_models import make_tiny

    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, image_min_pixels=112 * 112, image_max_pixels=112 * 112, **size)
    images = _images(root, 2, 112)
    mm = mmrl_trainer(model_dir, images, root / "mmrl", group=group, tokens=tokens, lr=1e-6)
    spent = {"generate": 0.0, "forward": 0.0, "backward": 0.0}
    inside_generate = [False]

    def timed(fn, key):
        def run(*a, **kw):
            t0 = time.perf_counter()
            inside_generate[0] = inside_generate[0] or key == "generate"
            try:
                return fn(*a, **kw)
            finally:
                if key == "generate":
                    inside_generate[0] = False
                spent[key] += time.perf_counter() - t0
        return run

    starts: list[float] = []

    def pre(*_):
        starts.append(time.perf_counter())

    def post(*_):
        t = time.perf_counter() - starts.pop()
        if not inside_generate[0]:
            spent["forward"] += t

    base = mm.policy.base
    for module in (base, mm.policy.model.lm_head, *([mm.ref.model.model, mm.ref.model.lm_head] if mm.ref else [])):
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
    mm.policy.model.generate = timed(mm.policy.model.generate, "generate")  # an instance attribute: timing only
    mm.updater.backward = timed(mm.updater.backward, "backward")
    mm.train_step()
    mm.step += 1
    for k in spent:
        spent[k] = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        mm.train_step()
        mm.step += 1
    total = time.perf_counter() - t0
    model_time = sum(spent.values())
    return {"step_s": total / steps, **{f"{k}_s": v / steps for k, v in spent.items()},
            "overhead_share": (total - model_time) / total}


def print_overhead(r: dict[str, float], name: str) -> None:
    print(f"mmrl framework overhead ({name} model, images as above): {r['step_s']:.3f} s/step = generate "
          f"{r['generate_s']:.3f} + forward {r['forward_s']:.3f} + backward {r['backward_s']:.3f} + the rest "
          f"{r['step_s'] - r['generate_s'] - r['forward_s'] - r['backward_s']:.3f} s: overhead "
          f"{100 * r['overhead_share']:.1f}% of the step\n")


def video_step(root: Path, *, steps: int = 3, group: int = 8, tokens: int = 16, frames: int = 16) -> dict[str, Any]:
    """mmrl's GRPO step on video prompts (2 prompts x G, ``frames`` frames at 112x112, short answers) with the
    shared-prefix forward and the per-step vision cache on, vs both off, and with a KL reference (so the
    reference pass counts too). Two trainers on the same model folder; their steps alternate after one
    untimed step each; medians."""
    import json

    from data_pipelines.loaders import load_samples
    from mmrl.config import load_run_config
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import make_tiny
    from perf.toy_media import toy_video

    register_bench_reward()
    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, video_max_pixels=112 * 112, **SIZES["small"])
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({
        "id": f"v{i}", "problem_type": "open", "question": "Which way does the square move?", "answer": "left",
        "media": [{"type": "video", "path": str(toy_video(root / f"v{i}.mp4", i)),
                   "sampling": {"nframes": frames}}]}) + "\n" for i in range(2)))
    samples = load_samples(data).samples
    trainers = {}
    for name, on in (("on", True), ("off", False), ("frozen", True)):
        cfg = load_run_config("video-qa", overrides=[
            f"model.path={model_dir}", f"data.train={data}", "rewards=[{name: bench_length}]",
            f"rollout.group_size={group}", f"rollout.max_new_tokens={tokens}", "train.prompts_per_step=2",
            f"train.micro_batch_size={2 * group}", "grpo.kl_coef=0.01", "train.log_rollouts=0", "train.save_every=0",
            "data.check_media=none", "train.health_window=0", f"data.media.max_frames={frames}",
            f"data.media.min_frames={frames}", "data.media.video_max_pixels=12544", "data.media.video_min_pixels=12544",
            f"train.shared_prefix={str(on).lower()}", f"model.cache_vision_features={str(on).lower()}",
            *(["model.freeze_vision=true", "model.freeze_merger=true"] if name == "frozen" else [])])
        policy = load_policy(model_dir, device="cpu")
        policy.set_trainable(vision=not cfg.model.freeze_vision, merger=not cfg.model.freeze_merger)
        policy.configure(shared_prefix=cfg.train.shared_prefix, cache_vision_features=cfg.model.cache_vision_features)
        trainers[name] = GRPOTrainer(cfg, policy, samples, run_dir=root / name, show_progress=False)
    times: dict[str, list[float]] = {name: [] for name in trainers}
    calls: dict[str, list[int]] = {name: [] for name in trainers}
    for rep in range(steps + 1):
        for name, tr in trainers.items():
            t0 = time.perf_counter()
            stats = tr.train_step()
            tr.step += 1
            if rep:
                times[name].append(time.perf_counter() - t0)
                calls[name].append(int(stats.get("vision_calls", -1)))
    prompt_len = len(trainers["on"].prepare([0])[0][0].seq)
    trainers["on"].policy.clear_media()
    return {"on_s": statistics.median(times["on"]), "off_s": statistics.median(times["off"]),
            "on_calls": statistics.median(calls["on"]), "off_calls": statistics.median(calls["off"]),
            "frozen_calls": statistics.median(calls["frozen"]), "unique_items": len(samples),
            "prompt_tokens": prompt_len, "frames": frames}


def print_video_step(r: dict[str, Any]) -> None:
    print(f"mmrl video GRPO step (small model, 2 prompts x G=8, {r['frames']} frames at 112x112, prompt "
          f"{r['prompt_tokens']} tokens, <= 16 new tokens, KL reference): shared prefix + per-step vision cache "
          f"on {r['on_s']:.3f} s/step ({r['on_calls']:.0f} tower runs), both off {r['off_s']:.3f} s/step "
          f"({r['off_calls']:.0f} tower runs): on/off = {r['on_s'] / r['off_s']:.2f} (target <= 0.5); with a "
          f"frozen tower {r['frozen_calls']:.0f} tower runs per step for {r['unique_items']} unique videos\n")


def generation(root: Path, *, reps: int = 5, group: int = 8, tokens: int = 16) -> dict[str, Any] | None:
    """HF ``generate`` against the vLLM engine (``rollout.backend=vllm``) on the CPU: the same policy (the
    ~23M model), 2 image prompts x G completions of at most ``tokens`` tokens, interleaved repetitions after
    a warm-up, medians; and one weight push to the engine. None when vLLM is not installed."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    from mmrl.config import MediaConfig, PromptConfig
    from mmrl.engine.media import MediaPreparer
    from mmrl.engine.prompts import encode_prompt
    from mmrl.engine.rollout import HFBackend, SamplingParams, make_backend
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import make_tiny

    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, image_min_pixels=112 * 112, image_max_pixels=112 * 112,
                  **SIZES["small"])
    images = _images(root, 2, 112)
    policy = load_policy(model_dir, device="cpu")
    policy.model.eval()
    engine = make_backend("vllm", policy)  # before the prompts are encoded: it keeps their media
    preparer = MediaPreparer(MediaConfig(image_min_pixels=112 * 112, image_max_pixels=112 * 112), family=policy.family)
    from data_pipelines.schema import MediaItem, Sample

    prompts = [encode_prompt(policy, preparer, Sample(id=f"g{i}", problem_type="open", question=QUESTION,
                                                      answer="x", media=[MediaItem(type="image", path=str(p))]),
                             PromptConfig())[0] for i, p in enumerate(images)]
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    hf = HFBackend(policy)
    times: dict[str, list[float]] = {"hf": [], "vllm": [], "push": []}
    for rep in range(reps + 1):
        for name, backend in (("hf", hf), ("vllm", engine)):
            t0 = time.perf_counter()
            backend.generate(prompts, n=group, params=params)
            if rep:
                times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine.after_update(policy)
        if rep:
            times["push"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def print_generation(r: dict[str, Any] | None) -> None:
    if r is None:
        print("generation HF vs vLLM: vLLM is not installed here (make setup-vllm-cpu)\n")
        return
    print(f"generation, 2 image prompts x G=8 x <= 16 tokens (small model, CPU): HF generate {r['hf']:.3f} s, "
          f"vLLM {r['vllm']:.3f} s (HF/vLLM {r['hf'] / r['vllm']:.2f}x); a weight push to vLLM {r['push']:.3f} s\n")
