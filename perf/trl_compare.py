"""mmrl's GRPO step against TRL's ``GRPOTrainer`` (the anchor), side by side in one process.

Both train the same tiny Qwen2.5-VL folder on the same two 112x112 images (questions with open answers),
with G=8 completions per prompt, 16 new tokens at most (a random-weight model almost never ends earlier;
the mean completion length of each is reported; no stop strings on either side), temperature 1, fp32, no KL reference (beta 0), one
optimizer update per batch of 16 sequences, AdamW at the same learning rate, and the same reward (the
completion's length in characters, so groups have non-zero advantages). Blocks of steps alternate (TRL,
mmrl, TRL, mmrl, ...) after one untimed warm-up block each, and the median seconds per step of each is
reported with samples (completions) per second and the ratio.

What could not be made equal: TRL generates with ``model.generate`` on the prompt repeated G times and
recomputes the vision features in every pass; mmrl generates G sequences per prompt from one prompt
encoding, shares the vision features across a group and runs the prompt once per group in training
(``train.shared_prefix``) where those settings are on. Each framework's own defaults are otherwise kept.
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


def _register_reward() -> None:
    from rewards import register_reward
    from rewards.registry import REWARDS

    if "bench_length" not in REWARDS:
        register_reward("bench_length", locate_errors=False)(_length_reward)


class _TRLTimer:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.lengths: list[float] = []
        self._t0 = 0.0


def trl_trainer(model_dir: Path, images: list[Path], out: Path, *, steps: int, group: int, tokens: int, lr: float):
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    timer = _TRLTimer()

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timer._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            timer.times.append(time.perf_counter() - timer._t0)

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
        bf16=False, fp16=False, seed=0, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True)
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
    from mmrl.policy import load_policy
    from mmrl.trainer import GRPOTrainer

    _register_reward()
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
    policy.logprob_chunk_tokens = cfg.train.logprob_chunk_tokens
    for name in ("shared_prefix", "cache_vision_features"):  # the speed settings, where this version has them
        for section in (cfg.train, cfg.model):
            if hasattr(section, name) and hasattr(policy, _POLICY_ATTR[name]):
                setattr(policy, _POLICY_ATTR[name], getattr(section, name))
    return GRPOTrainer(cfg, policy, samples, run_dir=out / "run", show_progress=False)


_POLICY_ATTR = {"shared_prefix": "shared_prefix_forward", "cache_vision_features": "cache_vision_features"}


def compare(root: Path, *, size: dict[str, int], steps: int = 3, rounds: int = 2, group: int = 8,
            tokens: int = 16, lr: float = 1e-6) -> dict[str, Any]:
    """Median seconds per GRPO step of TRL and mmrl, samples per second, and the ratio. TRL's loop runs and a
    callback runs ``steps`` mmrl steps after every ``steps`` TRL steps, so the two alternate in blocks; the
    first block of each is a warm-up."""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from mmrl.tiny_models import make_tiny

    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, image_min_pixels=112 * 112, image_max_pixels=112 * 112, **size)
    params = sum(t.numel() for t in load_file(str(model_dir / "model.safetensors")).values())
    images = _images(root, 2, 112)
    torch.manual_seed(0)
    total = steps * (rounds + 1)
    trl, timer = trl_trainer(model_dir, images, root / "trl", steps=total, group=group, tokens=tokens, lr=lr)
    mm = mmrl_trainer(model_dir, images, root / "mmrl", group=group, tokens=tokens, lr=lr)
    mm_times: list[float] = []
    mm_lengths: list[float] = []

    class Alternate(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % steps:
                return
            warm = state.global_step == steps
            for _ in range(steps):
                t0 = time.perf_counter()
                stats = mm.train_step()
                mm.step += 1
                if not warm:
                    mm_times.append(time.perf_counter() - t0)
                    mm_lengths.append(float(stats.get("response_length", float("nan"))))

    trl.add_callback(Alternate())
    trl.train()
    n = 2 * group
    trl_times, trl_lengths = timer.times[steps:], timer.lengths[steps:]
    trl_s, mm_s = statistics.median(trl_times), statistics.median(mm_times)
    return {"parameters_m": params / 1e6, "trl_s_per_step": trl_s, "mmrl_s_per_step": mm_s,
            "trl_samples_per_s": n / trl_s, "mmrl_samples_per_s": n / mm_s, "ratio": trl_s / mm_s,
            "trl_mean_length": statistics.mean(trl_lengths) if trl_lengths else float("nan"),
            "mmrl_mean_length": statistics.mean(mm_lengths), "steps_timed": len(mm_times)}


# the two model sizes of the comparison: the default tiny model (~1M parameters) and one where model compute
# dominates (~20M)
SIZES = {"tiny": {}, "small": {"hidden_size": 512, "layers": 4, "heads": 8, "kv_heads": 4,
                               "intermediate_size": 2048, "vision_depth": 4, "vision_hidden_size": 256,
                               "vision_heads": 4, "vision_intermediate_size": 1024}}


def run_trl(steps: int, rounds: int) -> list[tuple[str, dict[str, Any]]]:
    import tempfile

    out = []
    for name, size in SIZES.items():
        with tempfile.TemporaryDirectory(prefix=f"mmrl-perf-trl-{name}-") as tmp:
            out.append((name, compare(Path(tmp), size=size, steps=steps, rounds=rounds)))
    return out


def print_trl(rows: list[tuple[str, dict[str, Any]]]) -> None:
    import torch

    print(f"GRPO step, mmrl vs TRL {_trl_version()} GRPOTrainer: tiny Qwen2.5-VL, 2 prompts x G=8 on 112x112 "
          f"images, <= 16 new tokens, fp32, beta 0, one update per batch; torch {torch.get_num_threads()} "
          "thread(s); median s/step over alternating blocks after a warm-up block each")
    head = (f"{'model':<16} {'TRL s/step':>11} {'mmrl s/step':>12} {'TRL samples/s':>14} {'mmrl samples/s':>15} "
            f"{'mmrl/TRL':>9} {'mean len TRL/mmrl':>18}")
    print(head)
    print("-" * len(head))
    for name, r in rows:
        label = "{} ({:.1f}M)".format(name, r["parameters_m"])
        lengths = "{:.1f} / {:.1f}".format(r["trl_mean_length"], r["mmrl_mean_length"])
        print(f"{label:<16} {r['trl_s_per_step']:>11.3f} {r['mmrl_s_per_step']:>12.3f} "
              f"{r['trl_samples_per_s']:>14.1f} {r['mmrl_samples_per_s']:>15.1f} {r['ratio']:>8.2f}x {lengths:>18}")
    print()


def _trl_version() -> str:
    import trl

    return trl.__version__


def overhead(root: Path, *, size: dict[str, int], steps: int = 4, group: int = 8, tokens: int = 16) -> dict[str, float]:
    """mmrl's framework overhead: the share of a GRPO step's time spent outside model forward passes,
    backward passes and ``generate`` (media preparation, batching, rewards, advantages, logging), measured
    with timers around those three on the same image setting as :func:`compare` (first step untimed)."""
    from mmrl.tiny_models import make_tiny

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
    from mmrl.policy import load_policy
    from mmrl.tiny_models import make_tiny
    from mmrl.trainer import GRPOTrainer
    from perf.__main__ import _video

    _register_reward()
    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        make_tiny("qwen2_5_vl", model_dir, seed=0, video_max_pixels=112 * 112, **SIZES["small"])
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({
        "id": f"v{i}", "problem_type": "open", "question": "Which way does the square move?", "answer": "left",
        "media": [{"type": "video", "path": str(_video(root / f"v{i}.mp4", i)),
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
        policy.shared_prefix_forward = cfg.train.shared_prefix
        policy.cache_vision_features = cfg.model.cache_vision_features
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
    prompt_len = len(trainers["on"].prepare([0])[0].seq)
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
    from mmrl.media import MediaPreparer
    from mmrl.policy import load_policy
    from mmrl.prompts import encode_prompt
    from mmrl.rollout import HFBackend, SamplingParams, make_backend
    from mmrl.tiny_models import make_tiny

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
