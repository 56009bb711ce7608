"""What each stage of ``make gpu-check`` runs, in a process of its own (started by :mod:`perf.gpu_check.runner`):

    python -m perf.gpu_check.stages STAGE --spec SPEC.json --result RESULT.json

A stage writes ``RESULT.json`` (``result``: its numbers; ``checks``: ``[name, passed, detail]`` rows; ``error``
or ``skipped``) every time it learns something, so a stage that is stopped at its timeout still leaves what it
measured. It exits non-zero when it raised or a check failed.

``python -m perf.gpu_check.stages mmrl ARGS...`` runs ``mmrl ARGS...`` with torch's deterministic algorithms on
(a GPU run resumed from a checkpoint can then equal the uninterrupted run bit for bit).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from perf.gpu_check import FAMILY, H100_GB, REAL_OVERRIDES, REAL_SIZES, peak_flops
from perf.gpu_check.image import imported_distributions

REPO = Path(__file__).resolve().parent.parent.parent
GB = 1e9
T0 = time.monotonic()

# The README's one-GPU commands (section "GPUs: one GPU, several GPUs, several nodes"), as KEY=VALUE overrides
# after `mmrl train --task video-qa --model DIR`: 3B full fine-tuning with HF rollouts, and 7B LoRA (with HF
# rollouts here: vLLM's CUDA build is not part of the acceptance run)
README_COMMANDS = {
    "3b": ["model.dtype=bf16", "model.gradient_checkpointing=true",
           "train.prompts_per_step=8", "train.lr=1e-6", "rollout.max_new_tokens=512",
           "prompt.answer_format=think_answer"],
    "7b": ["model.dtype=bf16", "model.gradient_checkpointing=true", "model.lora={r: 64, alpha: 128}",
           "train.lr=1e-5", "rollout.max_new_tokens=512"],
}
# the data in place of --data: the toy world's needle videos (24 s at 4 fps), sampled at 32 frames (the real-model
# preset's most) and fitted to the preset's largest pixel budget, 448 x 448 a frame (the worst case the settings
# allow: 4,096 vision tokens a prompt); 8 prompts x 8 answers (the recipe's group) a step
GPU_DATA = ["data.toy_tasks=[needle]", "data.toy_size={train: 16, val: 2, test: 2}",
            "data.toy_world={needle_frames: 32}", "data.media.video_min_pixels=200704",
            "data.media.video_max_pixels=200704"]
# the CPU mode: the same run on the tiny model in seconds (with the KL term the real-model preset gives the README's
# command under --model, so the reference pass runs and is timed as on the GPU)
CPU_RUN = ["grpo.kl_coef=0.001", "model.dtype=fp32", "train.micro_batch_size=4", "train.prompts_per_step=2", "rollout.group_size=2",
           "rollout.max_new_tokens=4", "data.toy_tasks=[color]", "data.toy_size={train: 4, val: 2, test: 2}",
           "data.media.min_frames=4", "data.media.max_frames=4", "data.media.video_min_pixels=3136",
           "data.media.video_max_pixels=3136", "train.cpu_threads=1"]
# the deepspeed stage's runs (as tests/test_deepspeed_one_process.py on CPU): 4 steps, checkpoints at 2 and 4
DS_RUN = ["data.toy_size={train: 4, val: 2, test: 2}", "data.toy_tasks=[color]", "data.media.min_frames=4",
          "data.media.max_frames=4", "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
          "rollout.group_size=2", "rollout.max_new_tokens=4", "train.prompts_per_step=2",
          "train.micro_batch_size=4", "train.steps=4", "train.save_every=2", "train.keep_checkpoints=4",
          "train.lr=1e-3", "train.cpu_threads=1", "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
          "grpo.entropy_coef=0.01", "grpo.kl_coef=0.01"]


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


class Recorder:
    """The stage's result file, rewritten at every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"result": {}, "checks": []}
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)

    def set(self, **values: Any) -> None:
        self.data["result"].update(values)
        self.flush()

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.data["checks"].append([name, bool(ok), str(detail)])
        self.flush()
        say(f"check {'PASS' if ok else 'FAIL'}: {name}" + (f" ({detail})" if detail != "" else ""))
        return bool(ok)

    def skip(self, why: str) -> None:
        self.data["skipped"] = why
        self.flush()

    def error(self, text: str) -> None:
        self.data["error"] = text
        self.flush()

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.data["checks"])


# ------------------------------------------------------------------------------------------------ shared helpers
def gpu_mode(spec: dict[str, Any]) -> bool:
    import torch

    return spec.get("mode") == "gpu" and torch.cuda.is_available()


def cap_memory(spec: dict[str, Any], rec: Recorder) -> None:
    """Hold a card larger than ``cap_gb`` (default: an H100 80GB's) to that much (the caching allocator
    refuses beyond it, as the smaller card would)."""
    import torch

    if not gpu_mode(spec):
        return
    total = torch.cuda.get_device_properties(0).total_memory
    cap = (spec.get("cap_gb") or H100_GB) * GB
    if total > cap * 1.001:
        torch.cuda.set_per_process_memory_fraction(cap / total, 0)
        rec.set(memory_cap_gb=round(cap / GB, 2), memory_fraction=round(cap / total, 4))
        say(f"memory held to {cap / GB:.1f} GB of the card's {total / GB:.1f} GB")
    else:
        rec.set(memory_cap_gb=round(total / GB, 2), memory_fraction=1.0)


def model_folder(spec: dict[str, Any], rec: Recorder, *, tiny: bool = False) -> Path:
    """The model the stage trains: on a GPU a random-weight model of the published configuration (built once in
    the work folder, bf16), else (or with ``tiny``) mmrl's tiny Qwen2.5-VL."""
    import torch

    from mmrl.toy.tiny_models import make_sized, make_tiny

    work = Path(spec["work"])
    if tiny or not gpu_mode(spec):
        folder = work / "model-tiny"
        if not (folder / "config.json").exists():
            make_tiny(FAMILY, folder, seed=0, overwrite=True)
        return folder
    size = spec.get("size", "3b")
    folder = work / f"model-{size}"
    if not (folder / "config.json").exists():  # written atomically: a folder with its config is complete
        say(f"building a random-weight Qwen2.5-VL-{size.upper()} (the published configuration) in {folder}")
        t0 = time.perf_counter()
        make_sized(FAMILY, folder, size=REAL_SIZES[size], dtype=torch.bfloat16, device="cuda",
                   config_overrides=REAL_OVERRIDES, overwrite=True)
        import gc

        gc.collect()  # the built model's tensors are freed before the stage's peaks are measured
        torch.cuda.empty_cache()
        rec.set(model_build_s=round(time.perf_counter() - t0, 1))
    return folder


def parameters(folder: Path) -> int:
    """Parameters stored in a model folder (read from the safetensors headers, tied weights once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                total += math.prod(st.get_slice(key).get_shape())
    return total


def run_overrides(spec: dict[str, Any]) -> list[str]:
    """The train stage's KEY=VALUE overrides (after ``--task video-qa --model DIR``)."""
    steps = [f"train.steps={int(spec.get('steps', 2))}", "eval.before_rl=false", "eval.after_rl=false",
             "train.log_every=1"]
    if gpu_mode(spec):
        return README_COMMANDS[spec.get("size", "3b")] + GPU_DATA + steps
    return CPU_RUN + steps


def run_config(spec: dict[str, Any], model: Path) -> Any:
    """The configuration ``mmrl train --task video-qa --model MODEL OVERRIDES`` resolves to (the real-model preset
    included, as the command line applies it)."""
    from mmrl.cli.commands import add_train_parser, config_from_args, own_model_base

    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--task", "video-qa", "--model", str(model), *run_overrides(spec)])
    return config_from_args(args, base=own_model_base(args))


def process_peak_gb() -> float:
    """The process's resident-set high-water mark (the CPU mode's peak), GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


# ------------------------------------------------------------------------------------------------ environment
# reported where installed: the extras a run may use (none is needed by the acceptance run but deepspeed, whose
# stage says when it is missing)
OPTIONAL = ("deepspeed", "peft", "vllm", "flash-attn")


def requirements() -> dict[str, str]:
    """pyproject.toml's dependencies: name -> version specifier ('' for none)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.DOTALL | re.MULTILINE)
    out = {}
    for item in re.findall(r'"([^"]+)"', block.group(1) if block else ""):
        item = item.split(";")[0].strip()
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", item)
        if m:
            out[m.group(1).lower()] = m.group(2).strip()
    return out


def satisfies(version: str, spec: str) -> bool:
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version) in SpecifierSet(spec)
    except ImportError:  # packaging is a dependency of transformers; this is only a fallback
        def parts(v: str) -> tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

        return all(parts(version) >= parts(s[2:]) for s in spec.split(",") if s.startswith(">="))


def matmul_tflops() -> float:
    """A bf16 8192^3 matrix product's rate on the GPU, TFLOP/s (the median of 10 after 3 warm-ups)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(13):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / statistics.median(times) / 1e12


def _where(module: Any) -> str | None:
    """The folder a module was imported from (the site folder it lives in)."""
    origin = getattr(module, "__file__", None)
    return str(Path(origin).parent.parent) if origin else None


def _dist_modules() -> dict[str, list[str]]:
    """Each installed distribution's importable top-level modules (normalised name -> modules)."""
    import importlib.metadata as md

    from perf.gpu_check.image import norm

    out: dict[str, list[str]] = {}
    for top, dists in md.packages_distributions().items():
        if top.isidentifier() and not top.startswith("_"):
            for dist in dists:
                out.setdefault(norm(dist), []).append(top)
    return out


def _main_module(dist: str, modules: list[str]) -> str | None:
    """The module that stands for a distribution: the one named like it (``math-verify``: ``math_verify``),
    else the first (``pillow``: ``PIL``)."""
    named = [m for m in modules if m.lower() == dist.replace("-", "_")]
    return (named or sorted(modules) or [None])[0]


def stage_environment(spec: dict[str, Any], rec: Recorder) -> None:
    """The machine, and every dependency the training path imports: ``pyproject.toml``'s (less those
    :data:`perf.gpu_check.image.NOT_CARRIED` leaves behind), each imported here (the ones the code imports on
    first use too) at its minimum version, and every distribution that importing the training path
    (:data:`perf.gpu_check.image.TRAIN_MODULES`) loaded, with where it came from."""
    import importlib
    import importlib.metadata as md

    from perf.gpu_check.image import NOT_CARRIED, TRAIN_MODULES, imported_distributions, norm

    work = Path(spec["work"])
    rec.set(python=platform.python_version(), executable=sys.executable, platform=platform.platform(),
            cpus=os.cpu_count(), mode_asked=spec.get("mode"))
    try:
        for module in TRAIN_MODULES:
            importlib.import_module(module)
        rec.check("mmrl's training modules import", True, ", ".join(TRAIN_MODULES))
    except Exception as exc:  # noqa: BLE001 - the message is the result
        rec.check("mmrl's training modules import", False, f"{type(exc).__name__}: {exc}")
    reqs = {norm(name): need for name, need in requirements().items()}
    modules = _dist_modules()
    missing_hint = "`make gpu-wheels` where pip can reach an index, then carry gpu-wheels/"
    dependencies: dict[str, Any] = {}
    for dist, need in reqs.items():
        if dist in NOT_CARRIED:
            dependencies[dist] = {"requires": need, "not_carried": NOT_CARRIED[dist]}
            continue
        try:
            version: str | None = md.version(dist)
        except md.PackageNotFoundError:
            version = None
        row: dict[str, Any] = {"version": version, "requires": need}
        error = None
        name = _main_module(dist, modules.get(dist, []))
        if version is not None and name:
            try:
                row["from"] = _where(importlib.import_module(name))
            except Exception as exc:  # noqa: BLE001 - the message is the result
                error = f"import {name}: {type(exc).__name__}: {exc}"
        dependencies[dist] = row
        ok = version is not None and satisfies(version, need) and error is None
        rec.check(f"{dist}{need} is installed and imports", ok,
                  error or version or f"missing: {missing_hint}")
    imported = imported_distributions()
    packages: dict[str, Any] = {}
    for dist in sorted(set(imported) | set(OPTIONAL)):
        if dist in imported:
            found = next((sys.modules[m] for m in modules.get(dist, []) if m in sys.modules), None)
            packages[dist] = {"version": imported[dist], "from": _where(found) if found else None,
                              "requires": reqs.get(dist, "")}
        else:
            try:
                packages[dist] = {"version": md.version(dist), "imported": False}
            except md.PackageNotFoundError:
                continue
    # on the lent machine every one of them is the image's or carried; elsewhere (another machine's own
    # environment) packages that others import where installed show here too
    from perf.gpu_check.image import IMAGE_PACKAGES, carried

    outside = sorted(d for d in imported if d not in IMAGE_PACKAGES and d not in carried())
    rec.set(dependencies=dependencies, packages=packages, outside_image=outside)
    if outside:
        say("imported, neither in the lent image's package list nor carried (on the lent machine: the list in "
            f"perf/gpu_check/image.py is out of date): {', '.join(outside)}")
    import torch

    cuda = torch.cuda.is_available()
    rec.set(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=cuda, gpu=None,
            disk_free_gb=round(shutil.disk_usage(work).free / GB, 1),
            shm_free_gb=round(shutil.disk_usage("/dev/shm").free / GB, 1) if Path("/dev/shm").is_dir() else None,
            host_memory_gb=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1))
    if cuda:
        props = torch.cuda.get_device_properties(0)
        rec.set(gpu=props.name, gpus=torch.cuda.device_count(), gpu_memory_gb=round(props.total_memory / GB, 2),
                capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                bf16_peak_tflops=(peak_flops(props.name) or 0) / 1e12 or None)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=False)
            rec.set(driver=smi.stdout.strip() or None)
        except (OSError, subprocess.TimeoutExpired):
            pass
        rec.set(matmul_bf16_tflops=round(matmul_tflops(), 1))
    if spec.get("mode") == "gpu":
        rec.check("a CUDA device is there", cuda,
                  f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees "
                  + (torch.cuda.get_device_name(0) if cuda else "none; `python -m perf.gpu_check --mode cpu` is "
                     "the CPU mode"))


# ------------------------------------------------------------------------------------------------ GPU tests
def stage_gpu_tests(spec: dict[str, Any], rec: Recorder) -> None:
    import xml.etree.ElementTree as ET

    import pytest

    xml = Path(spec["work"]) / "stages" / "gpu-tests" / "junit.xml"
    xml.unlink(missing_ok=True)
    # without CUDA the first test fails and says why; -x stops there (the CPU mode only shows that a failing
    # stage is recorded)
    args = ["-m", "gpu", "tests/test_gpu.py", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={xml}"]
    if not gpu_mode(spec):
        args.append("-x")
    say("pytest " + " ".join(args))
    rc = int(pytest.main(args))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    if xml.exists():
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for s in suites:
            for k in counts:
                counts[k] += int(s.get(k, 0))
            for case in s.iter("testcase"):
                for bad in list(case.findall("failure")) + list(case.findall("error")):
                    first = (bad.get("message") or "").strip().splitlines()[:1]
                    failed.append(f"{case.get('name')}: {first[0][:300] if first else bad.tag}")
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    rec.set(pytest_exit=rc, tests=counts["tests"], passed=passed, failed=failed, skipped=counts["skipped"])
    rec.check("the GPU tests ran", counts["tests"] > 0, f"{counts['tests']} collected")
    rec.check("every GPU test passed", rc == 0 and not failed, f"{passed} passed, {len(failed)} failed")
    rec.check("no GPU test was skipped", counts["skipped"] == 0, counts["skipped"])


# ------------------------------------------------------------------------------------------------ train
def run_root(spec: dict[str, Any], rec: Recorder, params: int) -> Path:
    """Where the run folder goes: its checkpoint (bf16 weights, fp32 masters and Adam moments: 14 bytes a
    parameter) and ``final/`` (2) must fit; the work folder's disk, else /dev/shm, else the work folder anyway."""
    work = Path(spec["work"])
    need = params * 16 * 1.1 + 2 * GB
    rec.set(checkpoint_bytes_estimate_gb=round(params * 16 / GB, 1))
    if spec.get("run_root"):
        return Path(spec["run_root"])
    for root in (work, Path("/dev/shm")):
        if root.is_dir() and shutil.disk_usage(root).free >= need:
            return root / "gpu-check-runs" if root != work else work
    say(f"warning: neither {work} nor /dev/shm has {need / GB:.0f} GB free for the run's checkpoint")
    return work


def memory_peaks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's memory: each window's peak (``memory/<stage>_gb``, ``_reserved_gb``, ``_host_gb``: the largest of
    the rows, the RL steps' and the checkpoints' ``memory/save_gb``), and the whole run's: ``peak_gb``, the most
    allocated in any window, ``peak_reserved_gb``, the most the allocator held from the driver in any window
    (what the card must hold), each with the window that gave it. (A window's start resets the device's peak
    counter: only the windows' own readings cover the whole run.)"""
    out: dict[str, Any] = {}
    for key in sorted({k for r in rows for k in r if k.startswith("memory/")}):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        out[key] = round(max(vals), 2) if vals else None
    windows = {k: v for k, v in out.items() if v is not None and k != "memory/peak_gb"
               and not k.endswith("_host_gb")}
    for name, pick in (("peak_gb", lambda k: not k.endswith("_reserved_gb")),
                       ("peak_reserved_gb", lambda k: k.endswith("_reserved_gb"))):
        chosen = {k: v for k, v in windows.items() if pick(k)}
        if chosen:
            where = max(chosen, key=chosen.__getitem__)
            out[name], out[f"{name.removesuffix('_gb')}_window"] = chosen[where], where
    return out


def summarise_run(run_dir: Path, rows: list[dict[str, Any]], params: int, spec: dict[str, Any],
                  cfg_prompts: int, cfg_group: int, checkpoints: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Seconds per stage (the mean of the steps after the first), memory peaks per stage (the largest step or
    checkpoint) and the whole run's (:func:`memory_peaks`), tokens per second."""
    timed = rows[1:] or rows  # the first step warms caches and allocates: left out when there are more

    def mean(key: str) -> float | None:
        vals = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        return round(sum(vals) / len(vals), 3) if vals else None

    out: dict[str, Any] = {"steps": len(rows), "timed_steps": len(timed)}
    for key in ("time/rollout_s", "time/reference_s", "time/update_s", "time/sync_s", "time/step_s"):
        out[key.split("/")[1]] = mean(key)
    out["first_step_s"] = rows[0].get("time/step_s") if rows else None
    out.update(memory_peaks(rows + list(checkpoints)))
    out["response_length"] = mean("response_length")
    trained, update = mean("tokens/trained"), out["update_s"]
    out["trained_tokens_per_step"] = trained
    out["trained_tok_s"] = round(trained / update, 1) if trained and update else None
    gen = out["response_length"] * cfg_prompts * cfg_group if out["response_length"] else None
    out["generated_tok_s"] = round(gen / out["rollout_s"], 1) if gen and out["rollout_s"] else None
    peak = peak_flops(spec.get("device"))
    out["update_mfu_6nt"] = round(6 * params * trained / update / peak, 4) if peak and trained and update else None
    state = run_dir / "run_state.json"
    if state.exists():
        rl = json.loads(state.read_text()).get("stages", {}).get("rl", {})
        out["save_s"] = (rl.get("checkpoint_seconds") or [None])[-1]
    return out


# the allocator's trace of the train stage (`--memory-history`): how many events it keeps (the last ones)
HISTORY_ENTRIES = 2_000_000
# the project's own folders: an allocation is credited to the innermost of its frames in one of them
OWN_CODE = ("/mmrl/", "/perf/", "/rewards/", "/vision/", "/video/", "/data_pipelines/")


def memory_history_start(spec: dict[str, Any]) -> bool:
    """With ``--memory-history`` on a GPU: record every CUDA allocation and free, with its Python stack
    (``torch.cuda.memory._record_memory_history``), for :func:`peak_allocations`."""
    import torch

    if not spec.get("memory_history"):
        return False
    if not gpu_mode(spec):
        say("--memory-history: not recorded (CUDA's allocator only)")
        return False
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=HISTORY_ENTRIES)
    say(f"recording the allocator's history (the last {HISTORY_ENTRIES:,} events)")
    return True


def memory_history_stop(folder: Path) -> dict[str, Any]:
    """The recorded history's summary (:func:`peak_allocations`); recording stops."""
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    summary = peak_allocations(snapshot, device=torch.cuda.current_device())
    (folder / "memory_peak.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _site(frames: list[dict[str, Any]] | None) -> tuple[str, str]:
    """Where an allocation was made: the innermost frame in the project's code, and the innermost of all."""
    if not frames:
        return "(allocated before the recorded events)", ""

    def name(f: dict[str, Any]) -> str:
        path = str(f.get("filename", "?"))
        for marker in OWN_CODE + ("/torch/", "/transformers/", "/deepspeed/"):
            if marker in path:
                path = marker.strip("/") + "/" + path.split(marker, 1)[1]
                break
        return f"{path}:{f.get('line')} {f.get('name')}"

    own = next((f for f in frames if any(m in str(f.get("filename", "")) for m in OWN_CODE)), None)
    return (name(own) if own else "(no frame in mmrl's code)"), name(frames[0])


def peak_allocations(snapshot: dict[str, Any], device: int = 0, top: int = 20) -> dict[str, Any]:
    """The moment the recorded history held the most allocated bytes, and what was live then, grouped by where
    it was allocated (the innermost frame in mmrl's code, and the innermost frame): the GB, the blocks.

    ``snapshot`` is ``torch.cuda.memory._snapshot()``'s: ``segments`` (the blocks live at the end, with the
    frames of their allocation) and ``device_traces`` (the allocator's events, oldest first, the last
    ``max_entries`` of them). The events are replayed backwards from the end state, so a history that lost its
    oldest events still gives every moment it kept exactly; blocks allocated before its first event are
    credited to "(allocated before the recorded events)"."""
    events = [e for e in (snapshot.get("device_traces") or [[]] * (device + 1))[device]
              if e.get("action") in ("alloc", "free_completed")]
    end: dict[int, tuple[int, Any]] = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        for block in seg.get("blocks", []):
            if block.get("state") in ("active_allocated", "active_awaiting_free"):
                end[block["address"]] = (int(block["size"]), block.get("frames"))
    total = sum(size for size, _ in end.values())
    best, best_i = total, len(events)  # best_i: the state after events[:best_i]
    for i in range(len(events) - 1, -1, -1):
        total += -events[i]["size"] if events[i]["action"] == "alloc" else events[i]["size"]
        if total > best:
            best, best_i = total, i
    live = {addr: size for addr, (size, _) in end.items()}
    for e in reversed(events[best_i:]):
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        else:
            live[e["addr"]] = int(e["size"])
    frames: dict[int, Any] = {}
    for e in events[:best_i]:
        if e["action"] == "alloc":
            frames[e["addr"]] = e.get("frames")
    touched_after = {e["addr"] for e in events[best_i:]}
    groups: dict[tuple[str, str], list[int]] = {}
    for addr, size in live.items():
        where = frames.get(addr)
        if where is None and addr in end and addr not in touched_after:
            where = end[addr][1]
        row = groups.setdefault(_site(where), [0, 0])
        row[0] += size
        row[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    at = events[best_i - 1].get("time_us") if 0 < best_i <= len(events) else None
    return {"peak_allocated_gb": round(best / GB, 3), "events": len(events), "peak_after_event": best_i,
            "peak_time_us": at, "blocks": len(live),
            "top": [{"where": w, "innermost": inner, "gb": round(b / GB, 3), "blocks": n}
                    for (w, inner), (b, n) in ranked[:top]],
            "rest_gb": round(sum(b for _, (b, _n) in ranked[top:]) / GB, 3)}


def stage_train(spec: dict[str, Any], rec: Recorder) -> None:
    import torch

    from mmrl.cli import main as mmrl_main
    from mmrl.engine.run_log import read_metrics

    cuda = gpu_mode(spec)
    cap_memory(spec, rec)
    model = model_folder(spec, rec)
    params = parameters(model)
    rec.set(model=str(model), params=params, size=spec.get("size", "3b") if cuda else "tiny")
    root = run_root(spec, rec, params)
    run_dir = root / "train-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = ["train", "--task", "video-qa", "--model", str(model), "--out", str(run_dir), *run_overrides(spec)]
    rec.set(command="mmrl " + " ".join(shlex.quote(a) for a in argv), run_dir=str(run_dir))
    cfg = run_config(spec, model)
    rec.set(settings={"frames": cfg.data.media.max_frames, "video_pixels": cfg.data.media.video_max_pixels,
                      "prompts_per_step": cfg.train.prompts_per_step, "group_size": cfg.rollout.group_size,
                      "max_new_tokens": cfg.rollout.max_new_tokens, "micro_batch_size": cfg.train.micro_batch_size,
                      "micro_batch_tokens": cfg.train.micro_batch_tokens, "attention": cfg.model.attn_implementation,
                      "dtype": cfg.model.dtype, "gradient_checkpointing": cfg.model.gradient_checkpointing,
                      "lora": cfg.model.lora, "answer_format": cfg.prompt.answer_format})
    say(f"training: {rec.data['result']['command']}")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    history = memory_history_start(spec)
    t0 = time.perf_counter()
    rc: int | None = None
    try:
        rc = mmrl_main(argv)
    finally:  # an out-of-memory error or a stop keeps what was measured
        rec.set(train_exit=rc, wall_s=round(time.perf_counter() - t0, 1), distributions=imported_distributions())
        if history:
            rec.set(memory_history=memory_history_stop(Path(spec["work"]) / "stages" / "train"))
        logged = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        rows = [r for r in logged if r.get("stage") == "rl"]
        windows = [r for r in logged if r.get("stage") == "checkpoint"]
        # every window (StagePeaks.start) resets the device's peak counter: what it holds now is the time since
        # the last one (the checkpoint's, or where an error stopped the run), one more window of the run
        if cuda:
            windows.append({"memory/after_last_window_gb": torch.cuda.max_memory_allocated() / GB,
                            "memory/after_last_window_reserved_gb": torch.cuda.max_memory_reserved() / GB})
        else:
            rec.set(process_peak_gb=round(process_peak_gb(), 3))  # the stage process's, model building included
        if rows:
            rec.set(**summarise_run(run_dir, rows, params, spec, cfg.train.prompts_per_step, cfg.rollout.group_size,
                                    windows))
        else:
            rec.set(**memory_peaks(windows))
        keep = Path(spec["work"]) / "stages" / "train"
        for name in ("metrics.jsonl", "report.md", "config.yaml"):
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, keep / name)
        if root != Path(spec["work"]):  # /dev/shm is memory: the checkpoint goes
            shutil.rmtree(run_dir, ignore_errors=True)
    steps = int(spec.get("steps", 2))
    rec.check("the run finished", rc == 0, f"exit status {rc}")
    rec.check(f"{steps} RL steps logged", len(rows) == steps, len(rows))
    finite = all(math.isfinite(r.get("grad_norm", float("nan"))) and math.isfinite(r.get("loss", 0.0))
                 for r in rows)
    rec.check("every step's loss and gradient norm are finite", bool(rows) and finite)


# ------------------------------------------------------------------------------------------------ profile
def register_cpu_attention() -> None:
    """FLOP formulas for the CPU's fused attention kernel, which torch's counter does not know (CUDA's flash,
    memory-efficient and cuDNN kernels it does): the same count as the other attention kernels."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in fc.flop_registry:
        @fc.register_flop_formula(fwd, get_raw=True)
        def _fwd(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query.shape, key.shape, value.shape)
    if bwd is not None and bwd not in fc.flop_registry:
        @fc.register_flop_formula(bwd, get_raw=True)
        def _bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def _module_flops(counts: dict[str, dict[Any, int]], model: Any, attr: str) -> int | None:
    """The FLOPs counted inside the model's submodule ``attr`` (``visual``, ``language_model``). The counter names
    modules from the outermost one called: ``Outer.model.visual``, or the submodule's class name when mmrl calls
    it directly."""
    cls = next((type(m).__name__ for n, m in model.named_modules() if n.split(".")[-1] == attr), None)
    found = [sum(ops.values()) for name, ops in counts.items() if name.endswith(f".{attr}") or name == cls]
    return int(sum(found)) if found else None  # disjoint: nested calls and direct calls of the module


def _attention_flops(counts: dict[str, dict[Any, int]]) -> int:
    return int(sum(v for op, v in counts.get("Global", {}).items() if "attention" in str(op)))


def device_busy(prof: Any) -> float | None:
    """The share of a profiled pass during which the GPU ran anything: the union of the device's kernel (and copy)
    intervals over the pass's span, from its first host event to its last event of either kind. Each kernel is
    counted once (an aten op's own row carries its kernels' device time again, which ``key_averages`` shares
    would count twice). None without device events."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    device = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA)
    if not device or not events:
        return None
    start = min(e.time_range.start for e in events)
    end = max(e.time_range.end for e in events)
    busy, (lo, hi) = 0.0, device[0]
    for a, b in device[1:]:
        if a > hi:
            busy += hi - lo
            lo, hi = a, b
        else:
            hi = max(hi, b)
    busy += hi - lo
    return busy / (end - start) if end > start else None


def top_kernels(prof: Any, cuda: bool, n: int = 12) -> list[dict[str, Any]]:
    events = prof.key_averages()

    def self_time(e: Any) -> float:
        if cuda:
            return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)
        return float(e.self_cpu_time_total)

    total = sum(self_time(e) for e in events) or 1.0
    ranked = sorted(events, key=self_time, reverse=True)[:n]
    return [{"name": e.key[:120], "ms": round(self_time(e) / 1e3, 2), "calls": int(e.count),
             "share": round(self_time(e) / total, 3)} for e in ranked]


def sampled_vision_tokens(media: list[Any], processor: Any) -> int:
    """The vision tokens the decoded media make at the size mmrl sampled them (frames fitted to the settings'
    pixel budget): a processor whose own budget is smaller would resize them and give fewer."""
    video = processor.video_processor
    side = int(video.patch_size) * int(video.merge_size)
    total = 0
    for item in media:
        if item.kind == "video":
            frames = item.data.frames
            groups = -(-int(frames.shape[0]) // int(video.temporal_patch_size))
            total += groups * (int(frames.shape[-2]) // side) * (int(frames.shape[-1]) // side)
        else:
            width, height = item.data.size
            total += (height // side) * (width // side)
    return total


def profiled_rows(cfg: Any, prompt_tokens: int) -> int:
    """The rows of the update's first micro-batch for one group of ``rollout.group_size`` full-length answers to
    one prompt, by the trainer's own rule: the token budget (the group's shared prompt once) where the run sets one,
    else ``train.micro_batch_size`` rows."""
    from mmrl.model.packing import token_budget_chunks

    group, answer = int(cfg.rollout.group_size), int(cfg.rollout.max_new_tokens)
    budget = int(cfg.train.micro_batch_tokens or 0)
    if budget <= 0:
        return min(group, int(cfg.train.micro_batch_size))
    prefix = prompt_tokens if cfg.train.shared_prefix else 0
    chunks = token_budget_chunks(list(range(group)), [prompt_tokens + answer] * group, budget, groups=[0] * group,
                                 prefixes=[prefix] * group)
    return len(chunks[0])


def stage_profile(spec: dict[str, Any], rec: Recorder) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mmrl.engine.distributed import device_for
    from mmrl.engine.media import MediaPreparer
    from mmrl.engine.prompts import encode_prompt
    from mmrl.model import load_policy
    from mmrl.run import configure_policy, load_split

    cuda = gpu_mode(spec)
    cap_memory(spec, rec)
    model = model_folder(spec, rec)
    cfg = run_config(spec, model)
    say(f"loading {model}")
    policy = load_policy(model, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                         device=device_for(cfg.model.device))
    configure_policy(policy, cfg)  # as `mmrl train` sets the policy up
    policy.model.train()
    samples, _ = load_split(cfg, "train", show_progress=False)
    prompt, media = encode_prompt(policy, MediaPreparer(cfg.data.media, family=policy.family), samples[0],
                                  cfg.prompt)
    rows, answer = profiled_rows(cfg, len(prompt)), cfg.rollout.max_new_tokens
    g = torch.Generator().manual_seed(0)
    words = int(policy.processor.tokenizer.vocab_size)  # ordinary tokens (the special ones come after them)
    seqs = [prompt.extend(torch.randint(0, words, (answer,), generator=g).tolist(), trained=True)
            for _ in range(rows)]
    vision_tokens = sum(1 for t in prompt.mm_types if t)
    rec.set(micro_batch={"rows": rows, "prompt_tokens": len(prompt), "vision_tokens": vision_tokens,
                         "answer_tokens": answer, "tokens": sum(len(s) for s in seqs),
                         "shared_prefix": bool(cfg.train.shared_prefix), "attention": cfg.model.attn_implementation,
                         "gradient_checkpointing": bool(cfg.model.gradient_checkpointing), "dtype": cfg.model.dtype})
    say(f"micro-batch: {rows} rows of {len(prompt)} prompt tokens ({vision_tokens} vision) + {answer} answer tokens")
    sampled = sampled_vision_tokens(media, policy.processor)
    rec.check("the processor keeps the frames mmrl sampled (vision tokens equal the sampled frames' size)",
              vision_tokens == sampled, f"{vision_tokens} in the prompt, {sampled} from the sampled frames")
    trainable = [p for p in policy.model.parameters() if p.requires_grad]

    def forward() -> torch.Tensor:
        policy.weights_changed()  # no vision features cached from the last pass: the tower runs, as in a step
        logp, _ent, mask = policy.forward_logprobs(seqs, temperature=cfg.rollout.temperature, with_entropy=True,
                                                   entropy_grad=bool(cfg.grpo.entropy_coef))
        return -(logp * mask).sum() / mask.sum()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def zero() -> None:
        for p in trainable:
            p.grad = None

    say("warm-up pass")
    forward().backward()
    zero()
    sync()
    register_cpu_attention()
    say("counting FLOPs")
    with FlopCounterMode(display=False) as fwd_counter:
        loss = forward()
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    zero()
    sync()
    fwd, bwd = fwd_counter.get_flop_counts(), bwd_counter.get_flop_counts()
    f_total, b_total = int(fwd_counter.get_total_flops()), int(bwd_counter.get_total_flops())
    rec.set(flops_forward=f_total, flops_backward=b_total,
            flops_vision_forward=_module_flops(fwd, policy.model, "visual"),
            flops_language_forward=_module_flops(fwd, policy.model, "language_model"),
            flops_attention_forward=_attention_flops(fwd), flops_attention_backward=_attention_flops(bwd))
    reps = 3 if cuda else 1
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / GB if cuda else None
    for i in range(reps):
        say(f"timed pass {i + 1}/{reps}")
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            forward().backward()
            end.record()
            sync()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            forward().backward()
            times.append(time.perf_counter() - t0)
        zero()
    seconds = statistics.median(times)
    peak = peak_flops(torch.cuda.get_device_name(0)) if cuda else None
    model_flops = 3 * f_total  # forward + backward (twice the forward): without the checkpointed recompute
    rec.set(seconds=round(seconds, 4), seconds_all=[round(t, 4) for t in times],
            model_flops=model_flops, hardware_flops=f_total + b_total,
            achieved_tflops=round(model_flops / seconds / 1e12, 2),
            mfu=round(model_flops / seconds / peak, 4) if peak else None,
            hfu=round((f_total + b_total) / seconds / peak, 4) if peak else None,
            tokens_per_s=round(sum(len(s) for s in seqs) / seconds, 1))
    if cuda:
        rec.set(peak_gb=round(torch.cuda.max_memory_allocated() / GB, 2), allocated_before_gb=round(before, 2))
    else:
        rec.set(peak_gb=round(process_peak_gb(), 3))
    say("profiling one pass")
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        forward().backward()
        sync()
    zero()
    rec.set(top_kernels=top_kernels(prof, cuda))
    if cuda:
        busy = device_busy(prof)
        rec.set(gpu_busy=None if busy is None else round(busy, 4))
    rec.check("FLOPs counted in the forward and the backward", f_total > 0 and b_total > 0,
              f"{f_total:.3e} + {b_total:.3e}")
    vis = rec.data["result"]["flops_vision_forward"]
    rec.check("the vision tower's FLOPs are counted", bool(vis), vis)
    rec.check("attention FLOPs are counted", rec.data["result"]["flops_attention_forward"] > 0,
              rec.data["result"]["flops_attention_forward"])


# ------------------------------------------------------------------------------------------------ DeepSpeed
def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _ds_train(out: Path, extra: list[str], env: dict[str, str], log: Path) -> int:
    cmd = [sys.executable, "-m", "perf.gpu_check.stages", "mmrl", "train", "--quiet", "--out", str(out), *extra]
    say("mmrl " + " ".join(shlex.quote(a) for a in cmd[4:]))
    with open(log, "a") as f:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        print(log.read_text()[-3000:], flush=True)
    return done.returncode


def stage_deepspeed(spec: dict[str, Any], rec: Recorder) -> None:
    try:
        import deepspeed
    except Exception as exc:  # noqa: BLE001 - any import failure means the stage cannot run here
        rec.skip(f"deepspeed does not import ({type(exc).__name__}: {exc}); `make gpu-wheels` carries it")
        return
    import torch

    cuda = gpu_mode(spec)
    model = model_folder(spec, rec, tiny=True)
    rec.set(deepspeed=deepspeed.__version__, model=str(model), params=parameters(model))
    env = {**os.environ, PARENT_ENV: str(os.getpid())}  # its runs die with this stage (die_with_parent)
    if cuda:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (torch's deterministic algorithms)
        settings = ["model.dtype=bf16", "model.attn_implementation=eager"]  # eager: no atomics in attention's backward
    else:
        env["DS_ACCELERATOR"] = "cpu"
        settings = ["model.dtype=fp32"]
    base = ["--model", str(model), *DS_RUN, *settings]
    work = Path(spec["work"]) / "deepspeed"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "runs.log"
    for zero in spec.get("zero") or ["zero2", "zero3"]:
        straight, resumed = work / zero / "straight", work / zero / "resumed"
        t0 = time.perf_counter()
        if not rec.check(f"{zero}: 4 steps in one process", _ds_train(straight, [*base, f"train.deepspeed={zero}"],
                                                                       env, log) == 0):
            continue
        rec.check(f"{zero}: the checkpoint holds DeepSpeed's state", (straight / "checkpoint-2" / "deepspeed").is_dir())
        # as if killed after checkpoint-2: the run folder without what came later, then --resume
        shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-4", "final"))
        (resumed / "latest").write_text("checkpoint-2\n")
        state = json.loads((resumed / "run_state.json").read_text())
        state["stages"].pop("rl", None)
        (resumed / "run_state.json").write_text(json.dumps(state))
        if not rec.check(f"{zero}: resumed from checkpoint-2", _ds_train(resumed, [*base, f"train.deepspeed={zero}",
                                                                                   "--resume"], env, log) == 0):
            continue
        a, b = _weights(straight / "final"), _weights(resumed / "final")
        start = _weights(straight / "checkpoint-2")
        differ = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
        worst = max((float((a[k].float() - b[k].float()).abs().max()) for k in a if k in b), default=0.0)
        moved = sum(1 for k in start if k in a and not torch.equal(start[k], a[k]))
        rec.set(**{f"{zero}_tensors": len(a), f"{zero}_tensors_differing_after_resume": len(differ),
                   f"{zero}_max_abs_diff_after_resume": worst, f"{zero}_tensors_moved_after_step_2": moved,
                   f"{zero}_seconds": round(time.perf_counter() - t0, 1)})
        rec.check(f"{zero}: steps 3-4 moved the weights", moved > 0, f"{moved} of {len(start)} tensors")
        rec.check(f"{zero}: the resumed run's final weights equal the uninterrupted run's bit for bit", not differ,
                  f"{len(differ)} of {len(a)} tensors differ, max |diff| {worst:.2e}" if differ else f"{len(a)} tensors")


STAGES = {"environment": stage_environment, "gpu-tests": stage_gpu_tests, "train": stage_train,
          "profile": stage_profile, "deepspeed": stage_deepspeed}


def run_mmrl(argv: list[str]) -> int:
    """``mmrl ARGV`` with torch's deterministic algorithms (warnings name any operation that has none)."""
    import torch

    if torch.cuda.is_available():
        torch.use_deterministic_algorithms(True, warn_only=True)
    from mmrl.cli import main

    return main(argv)


PARENT_ENV = "GPU_CHECK_PARENT_PID"  # the runner (perf.gpu_check.runner) or a stage that starts `mmrl` sets it


def die_with_parent() -> None:
    """On Linux, have the kernel send this process SIGKILL when the process that started it ends
    (``PR_SET_PDEATHSIG``): a runner killed outright (SIGKILL runs none of its clean-up) takes its stage with
    it, and a stage its ``mmrl`` runs, so no orphan keeps the GPU's memory. Asked for only where the parent
    named itself in ``GPU_CHECK_PARENT_PID``; a parent that ended before the request ends this process now."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["mmrl"]:
        return run_mmrl(argv[1:])
    p = argparse.ArgumentParser(prog="python -m perf.gpu_check.stages")
    p.add_argument("stage", choices=list(STAGES))
    p.add_argument("--spec", required=True)
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    rec = Recorder(Path(args.result))
    say(f"stage {args.stage} ({spec.get('mode')} mode), Python {platform.python_version()}, {sys.executable}")
    try:
        STAGES[args.stage](spec, rec)
    except BaseException as exc:  # noqa: BLE001 - recorded, then the stage fails
        text = traceback.format_exc()
        print(text, flush=True)
        rec.error(f"{type(exc).__name__}: {str(exc)[:2000]}")
        return 1
    return 0 if rec.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
