"""``python -m perf.gpu_check`` (``make gpu-check``): the acceptance run on a GPU, and its CPU mode.

On a machine with CUDA it

1. checks device placement: ``model.device=auto`` is the GPU, a loaded model sits there, and building a vLLM
   engine (where vLLM's CUDA build is installed) leaves the process's current device as it was;
2. builds a random-weight model of the real Qwen2.5-VL-3B configuration (``--size 7b``: 7B, where memory
   allows; the vocabulary's 151,936 rows and the vision tower's windows included, mmrl's own small tokenizer
   and processor), on the GPU, saved in bf16;
3. trains it for a few steps on the toy videos in bf16 with activation checkpointing, with HF rollouts and,
   where vLLM is installed, with vLLM rollouts (sleep mode, waking, the weight push each step);
4. prints and writes (``--out``) a table: per-stage seconds (rollout, reference, update, weight sync,
   checkpoint), peak GPU memory, trained and generated tokens per second, and the update's model-FLOPs
   utilisation (6 x parameters x trained tokens / update seconds / the GPU's dense bf16 peak).

Without CUDA it runs the same code on a tiny model in seconds (``make test`` runs it, so it cannot rot) and
says that no GPU figure was measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

FAMILY = "qwen2_5_vl"
# The published Qwen2.5-VL configurations (config.json of Qwen/Qwen2.5-VL-3B-Instruct and -7B-Instruct).
VISION = {"vision_depth": 32, "vision_hidden_size": 1280, "vision_heads": 16, "vision_intermediate_size": 3420}
REAL = {
    "3b": {"size": {"hidden_size": 2048, "layers": 36, "heads": 16, "kv_heads": 2, "intermediate_size": 11008,
                    "tie_word_embeddings": True, **VISION}},
    "7b": {"size": {"hidden_size": 3584, "layers": 28, "heads": 28, "kv_heads": 4, "intermediate_size": 18944,
                    "tie_word_embeddings": False, **VISION}},
}
REAL_OVERRIDES = {"text_config": {"vocab_size": 151936},
                  "vision_config": {"window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}}
# dense bf16 peak FLOP/s by device name (vendor data sheets), for the utilisation column
PEAK_BF16 = (("H200", 989e12), ("H100 SXM", 989e12), ("H100 80GB HBM3", 989e12), ("H100 PCIe", 756e12),
             ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))


def peak_flops(name: str) -> float | None:
    return next((v for key, v in PEAK_BF16 if key in name), None)


def environment() -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "cuda": torch.version.cuda,
                           "gpu": None, "gpu_memory_gb": None}
    for name in ("deepspeed", "vllm", "flash_attn", "peft"):
        if importlib.util.find_spec(name) is not None:
            try:
                env[name] = __import__(name).__version__
            except Exception as exc:  # noqa: BLE001 - a broken install is worth reporting, not fatal
                env[name] = f"installed, import failed: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = props.name
        env["gpu_memory_gb"] = round(props.total_memory / 1e9, 1)
        env["gpus"] = torch.cuda.device_count()
    return env


def placement_checks(tiny_dir: Path, with_vllm: bool) -> list[tuple[str, bool, str]]:
    """``(check, passed, detail)`` rows."""
    from mmrl.policy import load_policy, resolve_device

    rows = []
    cuda = torch.cuda.is_available()
    dev = resolve_device("auto")
    rows.append(("model.device=auto is the GPU" if cuda else "model.device=auto is the CPU (no CUDA device)",
                 dev.type == ("cuda" if cuda else "cpu"), str(dev)))
    policy = load_policy(tiny_dir, device="auto")
    where = {p.device.type for p in policy.model.parameters()}
    rows.append(("a loaded model's every parameter is on that device", where == {dev.type}, ", ".join(sorted(where))))
    if with_vllm and cuda:
        from mmrl.rollout import make_backend

        before = torch.cuda.current_device()
        backend = make_backend("vllm", policy, gpu_memory_utilization=0.2, max_model_len=2048)
        after = torch.cuda.current_device()
        rows.append(("building the vLLM engine keeps the current device", before == after, f"{before} -> {after}"))
        del backend
    return rows


def model_folder(size: str, root: Path) -> Path:
    from mmrl.tiny_models import make_sized, make_tiny

    if size == "tiny":
        return make_tiny(FAMILY, root / "model-tiny", seed=0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return make_sized(FAMILY, root / f"model-{size}", size=REAL[size]["size"], dtype=torch.bfloat16, device=dev,
                      config_overrides=REAL_OVERRIDES)


def overrides(size: str, backend: str, steps: int, model: Path, out: Path) -> list[str]:
    gpu = torch.cuda.is_available()
    o = [f"model.path={model}", "model.dtype=bf16" if gpu else "model.dtype=fp32", "data.toy_tasks=[color]",
         "data.toy_size={train: 16, val: 2, test: 2}", f"train.steps={steps}", f"train.save_every={steps}",
         "train.log_every=0", "train.lr=1e-6", "train.health_window=0", "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
         "rollout.group_size=4", "rollout.temperature=1.0", f"out={out}", "train.cpu_threads=auto"]
    if gpu:
        o += ["model.gradient_checkpointing=true", "train.micro_batch_size=2", "train.prompts_per_step=4",
              "rollout.max_new_tokens=64", "data.media.max_frames=8", "data.media.min_frames=8",
              "data.media.video_max_pixels=200704", "data.media.video_min_pixels=200704"]
    else:
        o += ["train.micro_batch_size=4", "train.prompts_per_step=2", "rollout.max_new_tokens=8",
              "data.media.max_frames=4", "data.media.min_frames=4", "data.media.video_max_pixels=3136",
              "data.media.video_min_pixels=3136"]
    if backend == "vllm":
        o += ["rollout.backend=vllm", "rollout.record_logprobs=true"]
        if gpu:
            o += ["rollout.vllm.enable_sleep_mode=true", "rollout.vllm.gpu_memory_utilization=0.3"]
    return o


def run_one(size: str, backend: str, steps: int, model: Path, root: Path) -> dict[str, Any]:
    from mmrl.config import load_run_config
    from mmrl.run import train
    from mmrl.run_log import read_metrics

    out = root / f"run-{size}-{backend}"
    cfg = load_run_config("video-qa", overrides=overrides(size, backend, steps, model, out))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = train(cfg, run_dir=out, show_progress=False)
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(out) if r.get("stage") == "rl"]
    timed = rows[1:] or rows  # the first step compiles, warms caches and allocates: left out when there are more

    def mean(key: str) -> float | None:
        vals = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else None

    n = parameters(model)
    generated = [r["response_length"] * cfg.train.prompts_per_step * cfg.rollout.group_size for r in timed
                 if "response_length" in r]
    update = mean("time/update_s")
    trained = mean("tokens/trained")
    peak = peak_flops(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    return {
        "size": size, "backend": backend, "params": n, "steps": len(rows), "timed_steps": len(timed),
        "rollout_s": mean("time/rollout_s"), "reference_s": mean("time/reference_s"), "update_s": update,
        "sync_s": mean("time/sync_s"), "step_s": mean("time/step_s"),
        "save_s": (summary["stages"]["rl"].get("checkpoint_seconds") or [None])[-1],
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
        "trained_tok_s": trained / update if trained and update else None,
        "generated_tok_s": (sum(generated) / len(generated)) / mean("time/rollout_s") if generated else None,
        "mfu": 6 * n * trained / update / peak if peak and trained and update else None,
        "gap": max((r.get("rollout_logprob_gap") or 0.0) for r in rows) if backend == "vllm" else None,
        "wall_s": wall,
    }


def parameters(folder: Path) -> int:
    """Parameters stored in a model folder (read from the safetensors headers, tied weights once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                total += int(torch.Size(st.get_slice(key).get_shape()).numel())
    return total


def _count_text(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def table(env: dict[str, Any], checks: list[tuple[str, bool, str]], rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = ".2f") -> str:
        return "–" if v is None else format(v, fmt)

    gpu = env.get("gpu")
    lines = [f"# mmrl GPU check ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, "
             + ", ".join(f"{k} {env[k]}" for k in ("deepspeed", "vllm", "flash_attn", "peft") if k in env)
             + f"; device: {gpu or 'CPU'}" + (f" ({env['gpu_memory_gb']} GB)" if gpu else ""), ""]
    if not gpu:
        lines += [("**No CUDA device: this is the CPU mode on a tiny model. No GPU figure (memory, utilisation, "
                  "GPU speed) was measured.**"), ""]
    lines += ["| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in checks]
    lines += ["", ("| model | rollouts | parameters | steps | rollout s | reference s | update s | sync s | "
              "checkpoint s | peak GPU GB | trained tok/s | generated tok/s | update MFU | max log-prob gap |"),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['backend']} | {_count_text(r['params'])} | {r['steps']} | {f(r['rollout_s'])} | "
            f"{f(r['reference_s'])} | {f(r['update_s'])} | {f(r['sync_s'])} | {f(r['save_s'])} | "
            f"{f(r['peak_gpu_gb'], '.1f')} | {f(r['trained_tok_s'], '.0f')} | {f(r['generated_tok_s'], '.0f')} | "
            f"{f(r['mfu'] * 100 if r['mfu'] is not None else None, '.1f')}{'%' if r['mfu'] is not None else ''} | "
            f"{f(r['gap'], '.1e')} |")
    lines += ["", ("Seconds are per step, averaged over the steps after the first; MFU counts 6 x parameters x "
              "trained tokens (prompt and completion of every sequence) per update second against the GPU's dense "
              "bf16 peak; the peak is the largest allocated CUDA memory of the whole run.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "3b", "7b"], default=None,
                   help="model size (default: 3b with CUDA, tiny without)")
    p.add_argument("--backend", choices=["hf", "vllm", "both"], default=None,
                   help="rollout backends (default: both where vLLM imports on a GPU, else hf)")
    p.add_argument("--steps", type=int, default=3, help="RL steps per run (default 3)")
    p.add_argument("--out", default="runs/gpu-check", help="folder of the report (gpu_check.md, gpu_check.json)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    size = args.size or ("3b" if cuda else "tiny")
    has_vllm = importlib.util.find_spec("vllm") is not None
    backend = args.backend or ("both" if cuda and has_vllm else "hf")
    backends = ["hf", "vllm"] if backend == "both" else [backend]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    with tempfile.TemporaryDirectory(prefix="mmrl-gpu-check-") as tmp:
        root = Path(tmp)
        from mmrl.tiny_models import make_tiny

        checks = placement_checks(make_tiny(FAMILY, root / "placement", seed=0), "vllm" in backends)
        model = model_folder(size, root)
        rows = [run_one(size, b, args.steps, model, root) for b in backends]
    report = table(env, checks, rows)
    (out / "gpu_check.md").write_text(report)
    (out / "gpu_check.json").write_text(json.dumps({"environment": env, "checks": checks, "runs": rows}, indent=2,
                                                    default=str) + "\n")
    print(report)
    print(f"written: {out / 'gpu_check.md'}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
