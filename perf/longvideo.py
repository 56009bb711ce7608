"""Long-video generation with the prompt prefilled once per group (``rollout.prefill_once``) vs. the prompt
repeated G times before its prefill (HF ``generate`` with ``num_return_sequences=G``).

2 prompts, each a 16-frame video at 336x336 (grid t,h,w = 8, 24, 24: 1,152 video tokens) and a question (1,200
prompt tokens),
G=8 samples of 16 new tokens each, temperature 1, through the trainer's own rollout path (the HF backend,
``Policy.generate`` in inference mode, no log-probs kept), fp32 on the CPU. Both modes share the vision
features (one tower call per batch); only the prefill differs. After one warm-up call of each, repetitions
alternate (on, off, on, off, ...), each drawn under ``torch.manual_seed(0)``; the median seconds of each
mode, the speed-up and whether the two modes drew the same tokens are reported.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

FRAMES = 16
SIDE = 336  # 336 = 12 x 28: the frames stay as they are; 8 x 24 x 24 patches, 1,152 tokens after the merge
G = 8
PROMPTS = 2
NEW_TOKENS = 16
# The model: the default tiny one (hidden 128, 2 layers) reaches the target; "small" (the TRL comparison's text
# model, hidden 512 x 4 layers: ``--longvideo-size small``) shows the case where the model's compute counts more.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"hidden_size": 512, "layers": 4, "heads": 8, "kv_heads": 4, "intermediate_size": 2048},
}


def setup(root: Path, size: str) -> tuple[Any, list, list[int], float]:
    """The policy (tiny Qwen2.5-VL of ``size``), the 2 encoded video prompts, the video grid, parameters (M)."""
    from mmrl.model import MediaInput, load_policy
    from mmrl.toy.tiny_models import make_tiny
    from perf.toy_media import FAMILY, toy_video
    from video import sample_video

    pixels = SIDE * SIDE
    path = make_tiny(FAMILY, root / f"longvideo-model-{size}", seed=0, video_min_pixels=pixels,
                     video_max_pixels=pixels, **SIZES[size])
    policy = load_policy(path, device="cpu")
    prompts, grid = [], []
    question = "Which way does the square move, and does it ever touch the border of the frame?"
    for i in range(PROMPTS):
        data = sample_video(toy_video(root / f"long{i}.mp4", i, side=SIDE), "qwen", nframes=FRAMES, min_pixels=pixels,
                            max_pixels=pixels, image_patch_size=14)
        item = MediaInput(key=f"long-video-{i}", kind="video", data=data)
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
        prompts.append(policy.encode(policy.render(messages), [item]))
        grid = policy.media[item.key].grid_thw.tolist()
    params = sum(p.numel() for p in policy.model.parameters()) / 1e6
    return policy, prompts, grid, params


def bench_longvideo(root: Path, *, reps: int = 5, size: str = "tiny") -> dict[str, Any]:
    """Median seconds of one rollout call (2 prompts x G=8 x 16 tokens) with prefill-once on and off."""
    import torch

    from mmrl.engine.rollout import HFBackend, SamplingParams

    t0 = time.perf_counter()
    policy, prompts, grid, params = setup(root, size)
    setup_s = time.perf_counter() - t0
    policy.configure(share_vision_features=True)
    backend = HFBackend(policy)
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0)
    tokens: dict[str, list[list[int]]] = {}
    times: dict[str, list[float]] = {"on": [], "off": []}

    def call(mode: str) -> float:
        policy.configure(prefill_once=mode == "on")
        torch.manual_seed(0)
        start = time.perf_counter()
        out = backend.generate(prompts, n=G, params=sampling)
        seconds = time.perf_counter() - start
        drawn = [g.token_ids for group in out for g in group]
        if tokens.setdefault(mode, drawn) != drawn:  # the same seed must draw the same tokens in a mode too
            tokens[mode + " (changed)"] = drawn
        return seconds

    for mode in times:  # warm-up
        call(mode)
    for _ in range(reps):
        for mode, seconds in times.items():
            seconds.append(call(mode))
    policy.configure(prefill_once=True)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {"size": size, "parameters_m": params, "prompt_tokens": [len(p) for p in prompts], "grid": grid,
            "on_s": on, "off_s": off, "speedup": off / on, "reps": reps, "setup_s": setup_s,
            "on_all": times["on"], "off_all": times["off"],
            "same_tokens": tokens["on"] == tokens["off"] and len(tokens) == 2,
            "new_tokens": sum(len(t) for t in tokens["on"]) / len(tokens["on"])}


def print_longvideo(r: dict[str, Any]) -> None:
    import torch

    size = SIZES[r["size"]]
    model = (f"tiny Qwen2.5-VL '{r['size']}' (hidden {size.get('hidden_size', 128)}, {size.get('layers', 2)} "
             f"layers, {r['parameters_m']:.1f}M parameters)")
    print(f"long-video generation, prefill-once on vs off: {model}; {PROMPTS} prompts x G={G} x <= {NEW_TOKENS} "
          f"new tokens (mean {r['new_tokens']:.1f}), each prompt a {FRAMES}-frame video at {SIDE}x{SIDE} (grid "
          f"t,h,w = {r['grid']}) and a question: prompt length {' / '.join(map(str, r['prompt_tokens']))} tokens; "
          f"HF backend, fp32, torch {torch.get_num_threads()} thread(s); median of {r['reps']} interleaved "
          f"repetitions after a warm-up, torch.manual_seed(0) before each; setup {r['setup_s']:.1f} s")
    head = f"{'mode':<44} {'median s':>9} {'all reps (s)':>40}"
    print(head)
    print("-" * len(head))
    for label, key in (("prefill once per group (prefill_once=true)", "on"),
                       ("prompt repeated G times (prefill_once=false)", "off")):
        print(f"{label:<44} {r[key + '_s']:>9.3f} {' '.join(f'{t:.3f}' for t in r[key + '_all']):>40}")
    print(f"speed-up off/on: {r['speedup']:.2f}x (target >= 2x); same tokens under the same seed: "
          f"{'yes' if r['same_tokens'] else 'NO'}\n")
