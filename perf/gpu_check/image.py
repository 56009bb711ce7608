"""The lent GPU machine's image and what ``make gpu-check`` carries to it (standard library only).

The image (the device notes: one NVIDIA H100 or H200, Python 3.12 with torch 2.11 and transformers 5.17, no
network) holds :data:`IMAGE_PACKAGES`; whatever else the training path imports travels as wheels
(:data:`WHEELS`, downloaded by ``make gpu-wheels``, which reads them from here:
``python -m perf.gpu_check.image wheels``) or as DeepSpeed's wheel built here (:data:`BUILT_WHEELS`).
The environment stage checks on the machine that every dependency the training path imports is there;
``tests/test_gpu_image.py`` runs the environment and CPU stages in a Python that sees the image's packages and
the carried wheels only, so a dependency that would be missing there fails here first.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

IMAGE_PYTHON = "3.12"


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# The image's Python packages: the device notes' list "Python packages already there" (KINDS.md, read on a machine
# running the image 'cuda' on 2026-11-17), the image of both lent kinds (nvidia-h100-x1, nvidia-h200).
_IMAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
"""
IMAGE_PACKAGES = frozenset(norm(n) for n in _IMAGE_LIST.split())
# The versions read there (the device notes' "pip list" row, 2026-11), where one was read.
IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
                  "torchmetrics": "1.9.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0"}

# What travels as wheels for Python IMAGE_PYTHON on x86-64 (`make gpu-wheels` downloads exactly these): every
# distribution the training path imports that the image lacks or holds at a version pyproject.toml refuses
# (transformers: the image's 5.17 against >=5.18), and what they import in turn; the versions are
# constraints.txt's pins (the project's tested set). tests/test_gpu_image.py checks the set both ways.
WHEELS = {
    "transformers": "5.23.0",  # the image's 5.17 is below pyproject.toml's minimum
    "qwen-vl-utils": "0.0.14",
    "av": "18.1.0",  # video/writer.py (the toy world's videos) and the video reader
    "rapidfuzz": "3.14.6",  # rewards/video_r1_metrics.py, imported by every reward
    "math-verify": "0.9.0",  # LaTeX numbers in answers (rewards/answers.py, on first use)
    "latex2sympy2-extended": "1.11.0",  # math-verify's parser
    "antlr4-python3-runtime": "4.13.2",  # latex2sympy2-extended's parser runtime
    "mathruler": "0.1.0",  # ARES's grader (rewards/accuracy.py grader: mathruler, on first use); 15 KB
    "pylatexenc": "2.11",  # mathruler's LaTeX reader (mathruler declares no requirements; sympy is the image's)
    # DeepSpeed's (the deepspeed stage; mmrl imports it where it is installed)
    "hjson": "3.1.0", "pydantic": "2.14.3", "pydantic-core": "2.50.4", "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5", "typing-extensions": "4.16.0",  # pydantic wants >=4.16; the image's is unread
}
# Built here from its source archive (DeepSpeed publishes no wheel): a pure-Python wheel.
BUILT_WHEELS = {"deepspeed": "0.19.8"}
# Kernels a GPU run of some models wants (pyproject.toml's gpu extra, at constraints.txt's pins): downloaded when
# they fit the carry (`make gpu-wheels` drops them otherwise, saying so: python -m perf.gpu_check.image fit), not
# part of the wheel set the training path needs (the acceptance run trains Qwen2.5-VL, which imports none of
# them). fla-core: Qwen3.5's Gated DeltaNet layers (mmrl.model.kernels; transformers uses it wherever it imports,
# so it travels to the GPU only and never into this project's CPU environment), pure Python, 1.1 MB; it imports
# einops and, on CUDA, triton (both in the image). causal-conv1d stays behind: PyPI has its source only, a CUDA
# build.
KERNEL_WHEELS = {"fla-core": "0.6.0"}
# pyproject.toml dependencies that stay behind, and why (the carry is 64 MiB: ~7.6 MB of tracked files and
# ~58 MB of wheels leave no room for these)
NOT_CARRIED = {
    "decord": "optional: video/reader.py uses PyAV (carried) where decord does not import; its wheel is 13.6 MB",
    "rouge-score": "Video-R1's free-form answer reward only (rewards/video_r1_metrics.py imports it when a "
                   "free_form answer is scored); the acceptance run's toy needle task is multiple choice; with "
                   "nltk it is 1.7 MB",
    "datasets": "a `datasets` folder as training data only (data_pipelines/loaders.py imports it then); the "
                "acceptance run trains on the toy world",
}

# The training path: what the environment stage imports (the train and profile stages run these)
TRAIN_MODULES = ("mmrl.model", "mmrl.run", "mmrl.engine.trainer", "mmrl.cli", "mmrl.cli.commands", "mmrl.toy.tiny_models",
                 "rewards", "video", "vision", "data_pipelines.toy.video_tasks")


def kernel_pins() -> list[str]:
    """``NAME==VERSION`` of each kernel wheel (the Makefile's GPU_KERNEL_PKGS)."""
    return [f"{name}=={version}" for name, version in KERNEL_WHEELS.items()]


def kernel_wheel_files(folder: Path) -> list[Path]:
    """The kernel wheels (:data:`KERNEL_WHEELS`) present in ``folder``."""
    names = {norm(n) for n in KERNEL_WHEELS}
    return sorted(f for f in Path(folder).glob("*.whl") if norm(f.name.split("-")[0]) in names)


def carried() -> dict[str, str]:
    """Every distribution that travels to the image: name -> version."""
    return {**WHEELS, **BUILT_WHEELS}


def wheel_pins() -> list[str]:
    """``NAME==VERSION`` of each downloaded wheel (the Makefile's GPU_WHEEL_PKGS)."""
    return [f"{name}=={version}" for name, version in WHEELS.items()]


def imported_distributions(own: tuple[str, ...] = ("mmrl",)) -> dict[str, str | None]:
    """The distributions of every module imported so far in this process (``sys.modules``), name -> installed
    version; ``own`` (the project, imported from the repository) left out."""
    import importlib.metadata as md

    owners = md.packages_distributions()
    out: dict[str, str | None] = {}
    for top in sorted({name.split(".")[0] for name in list(sys.modules)}):
        for dist in owners.get(top, []):
            key = norm(dist)
            if key in own or key in out:
                continue
            try:
                out[key] = md.version(dist)
            except md.PackageNotFoundError:
                out[key] = None
    return out


# what one call of the lent machine carries: the working tree (tracked and untracked-not-ignored files) and the
# carried folders together
CARRY_LIMIT = 64 * 2**20


def carry_bytes(repo: Path, carried_dirs: list[Path]) -> dict[str, int]:
    """The bytes a call would send: the working tree's files (``git ls-files``: tracked, and untracked that git
    does not ignore) and the carried folders'."""
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((repo / n.decode()).stat().st_size for n in names if n and (repo / n.decode()).is_file())
    extra = sum(f.stat().st_size for d in carried_dirs for f in Path(d).rglob("*") if f.is_file())
    return {"tree": tree, "carried": extra, "total": tree + extra}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["wheels"]:
        print(" ".join(wheel_pins()))
        return 0
    if argv == ["built"]:
        print(" ".join(f"{n}=={v}" for n, v in BUILT_WHEELS.items()))
        return 0
    if argv == ["kernels"]:
        print(" ".join(kernel_pins()))
        return 0
    if argv[:1] in (["carry"], ["fit"]) and len(argv) > 1:
        repo = Path(__file__).resolve().parent.parent.parent
        folders = [Path(a) for a in argv[1:]]
        size = carry_bytes(repo, folders)
        if argv[0] == "fit":  # the kernel wheels go when the carry would exceed the limit with them
            dropped = []
            for wheel in [w for f in folders for w in kernel_wheel_files(f)]:
                if size["total"] <= CARRY_LIMIT:
                    break
                size["total"] -= wheel.stat().st_size
                wheel.unlink()
                dropped.append(wheel.name)
            if dropped:
                print(f"left out {', '.join(dropped)}: with them a call would send more than the "
                      f"{CARRY_LIMIT / 2**20:.0f} MiB it may (the GPU run computes what they would with its "
                      "PyTorch fallbacks)")
            return 0
        mib = {k: v / 2**20 for k, v in size.items()}
        print(f"a call carrying {' '.join(argv[1:])} sends {mib['total']:.1f} MiB of the {CARRY_LIMIT / 2**20:.0f} "
              f"MiB a call may (working tree {mib['tree']:.1f} MiB, carried {mib['carried']:.1f} MiB)")
        return 0 if size["total"] <= CARRY_LIMIT else 1
    print("usage: python -m perf.gpu_check.image wheels|built|kernels|carry DIR...|fit DIR...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
