"""``make gpu-check`` on the lent GPU machine's image: the image's packages (``perf.gpu_check.image``, as the
device notes list them) plus the wheels ``make gpu-wheels`` carries, nothing else.

The image cannot be had here (Python 3.12, torch 2.11), so it is reproduced as far as packages go: a virtual
environment whose site folder links, from this project's environment, only the distributions the image holds or
the wheels carry (their files and their metadata, so ``importlib`` finds nothing else either), in which the
runner's environment and CPU stages run. A distribution the training path imports that neither holds fails there
as it would on the machine."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from perf.gpu_check import image
from perf.gpu_check.image import (
    BUILT_WHEELS,
    IMAGE_PACKAGES,
    IMAGE_VERSIONS,
    NOT_CARRIED,
    WHEELS,
    carried,
    norm,
)
from perf.gpu_check.runner import FAILED

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("gpu_check")
# the image's platform, for the markers of a wheel's requirements
MARKERS = {"python_version": image.IMAGE_PYTHON, "python_full_version": f"{image.IMAGE_PYTHON}.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def installed() -> dict[str, md.Distribution]:
    return {norm(d.metadata["Name"]): d for d in md.distributions()}


def requires(dist: md.Distribution) -> list[Requirement]:
    """A distribution's own requirements on the image's platform (no extras)."""
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(MARKERS):
            out.append(req)
    return out


def pyproject_dependencies() -> dict[str, SpecifierSet]:
    from perf.gpu_check.stages import requirements

    return {norm(name): SpecifierSet(spec) for name, spec in requirements().items()}


def view_allowed() -> set[str]:
    """The distributions the image view holds: the image's and the carried ones. Where this project's version of
    an image package is not the image's (huggingface-hub 2.4 here, 1.33 there), its own requirements come with it
    (the image's version brings what it needs there)."""
    have = installed()
    allowed = set(IMAGE_PACKAGES) | set(carried())
    todo = [n for n, v in IMAGE_VERSIONS.items() if n in have and have[n].version != v and n not in carried()]
    while todo:  # their requirements, and those requirements' own
        for req in requires(have[todo.pop()]):
            if norm(req.name) not in allowed and norm(req.name) in have:
                allowed.add(norm(req.name))
                todo.append(norm(req.name))
    return allowed


def make_view(dest: Path, allowed: set[str]) -> Path:
    """A virtual environment whose site folder links the ``allowed`` distributions of this environment (every
    top-level file and folder their RECORD names, their metadata included); its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    assert site.is_dir(), site
    for name, dist in installed().items():
        if name not in allowed:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
    return dest / "bin" / "python"


def run_check(python: Path, work: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": "", "MMRL_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([str(python), "-m", "perf.gpu_check", "--mode", "cpu", "--work", str(work / "work"),
                           "--out", str(work / "out"), "--name", "image", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image as this machine can have it: its packages and the carried wheels, nothing else."""
    return make_view(tmp_path_factory.mktemp("image-view") / "venv", view_allowed())


# ---------------------------------------------------------------------------------------------- the wheel set
def test_every_dependency_the_project_declares_is_in_the_image_carried_or_left_behind_with_a_reason() -> None:
    """pyproject.toml's dependencies, each: in the image at a version its minimum allows (where the device notes
    read one; transformers' 5.17 is not), or carried at an allowed version, or named in NOT_CARRIED."""
    deps = pyproject_dependencies()
    for name, spec in deps.items():
        if name in carried():
            assert Version(carried()[name]) in spec, (name, carried()[name], spec)
        elif name in IMAGE_PACKAGES:
            if name in IMAGE_VERSIONS:
                assert Version(IMAGE_VERSIONS[name]) in spec, (name, IMAGE_VERSIONS[name], spec)
        else:
            assert NOT_CARRIED.get(name), f"{name} is neither in the image nor carried nor left behind"
    # a name left behind is a dependency of the project, and neither in the image nor carried
    for name in NOT_CARRIED:
        assert name in deps and name not in IMAGE_PACKAGES and name not in carried(), name
    # the image's transformers is older than the project allows: it travels
    assert Version(IMAGE_VERSIONS["transformers"]) not in deps["transformers"] and "transformers" in WHEELS


def test_the_carried_versions_are_the_projects_own_and_their_requirements_are_met_there() -> None:
    """Each wheel's version is constraints.txt's pin (else this environment's), the one the image view here
    runs; every requirement of a carried distribution is in the image (at an allowed version where one was
    read) or carried (at an allowed version)."""
    text = (REPO / "constraints.txt").read_text()
    pins = {norm(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.MULTILINE)}
    have = installed()
    for name, version in carried().items():
        assert version == pins.get(name, have[name].version), (name, version, pins.get(name))
        assert have[name].version == version, (name, have[name].version, version)
        for req in requires(have[name]):
            need = norm(req.name)
            there = carried().get(need) or IMAGE_VERSIONS.get(need)
            assert need in carried() or need in IMAGE_PACKAGES, f"{name} needs {need}: not in the image, not carried"
            if there:
                assert req.specifier.contains(there, prereleases=True), (name, str(req), there)
    assert not set(WHEELS) & set(BUILT_WHEELS)


def test_the_makefile_downloads_the_wheel_set_and_builds_deepspeed() -> None:
    done = subprocess.run(["make", "-n", "gpu-wheels"], cwd=REPO, capture_output=True, text=True, check=True)
    download = next(line for line in done.stdout.replace("\\\n", " ").splitlines() if "pip download" in line)
    assert download.split()[-len(WHEELS):] == image.wheel_pins()
    assert f"pip wheel -q --no-deps --no-build-isolation -w gpu-wheels deepspeed=={BUILT_WHEELS['deepspeed']}" \
        in done.stdout
    assert "perf.gpu_check.image carry gpu-wheels" in done.stdout  # it says what a call would send


def test_what_importing_the_training_path_loads_is_in_the_image_view_or_optional() -> None:
    """Every distribution that importing the training path loads in this (full) environment is in the image
    view, or is one a package imports only where it is installed (transformers' mistral-common, ...): the view,
    which lacks those, imports the training path without them (test below)."""
    code = ("import importlib, json, sys; [importlib.import_module(m) for m in sys.argv[1:]]; "
            "from perf.gpu_check.image import imported_distributions; print(json.dumps(imported_distributions()))")
    done = subprocess.run([sys.executable, "-c", code, *image.TRAIN_MODULES], cwd=REPO, capture_output=True,
                          text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    missing = loaded - view_allowed()
    # a dependency the project declares must not be among them (it would be needed, not optional)
    assert not missing & set(pyproject_dependencies()), missing & set(pyproject_dependencies())
    assert "rapidfuzz" in loaded and "rapidfuzz" in carried()  # the import that stopped the first lent run


# ---------------------------------------------------------------------------------------------- the image view
def test_a_package_missing_from_the_image_fails_the_environment_stage_and_nothing_else_runs(tmp_path: Path) -> None:
    """The image without rapidfuzz (as before it was carried) and without math-verify's parser runtime (imported
    only when an answer holds LaTeX): the environment stage names both, the stages after it do not run."""
    python = make_view(tmp_path / "venv", view_allowed() - {"rapidfuzz", "antlr4-python3-runtime"})
    done = run_check(python, tmp_path, "--stages", "environment,train")
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "out" / "image.json").read_text())
    env = data["stages"]["environment"]
    failed = {c[0]: c[2] for c in env["checks"] if not c[1]}
    assert "rapidfuzz" in failed["mmrl's training modules import"]
    assert "rapidfuzz>=3 is installed and imports" in failed
    assert "antlr4" in failed["math-verify is installed and imports"]
    assert data["stages"]["train"]["status"] == "not run"


@pytest.mark.slow
def test_the_environment_and_cpu_stages_pass_in_the_image_view(view: Path, tmp_path: Path) -> None:
    """Everything the environment, train and profile stages import is in the image or carried; each dependency
    was imported from the view (not from this project's environment). The GPU tests are collected there and
    fail where they must without CUDA: at their first test, which asks for a CUDA device."""
    done = run_check(view, tmp_path, "--stages", "environment,train,profile,gpu-tests")
    assert done.returncode == FAILED, (done.stdout + done.stderr)[-4000:]
    data = json.loads((tmp_path / "out" / "image.json").read_text())
    assert {s: r["status"] for s, r in data["stages"].items()} == {"environment": "ok", "train": "ok",
                                                                    "profile": "ok", "gpu-tests": "failed"}
    tests = data["stages"]["gpu-tests"]["result"]
    assert tests["tests"] > 0 and len(tests["failed"]) == 1 and "test_a_cuda_device_is_there" in tests["failed"][0]
    env = data["stages"]["environment"]["result"]
    site = str(view.parent.parent)
    for name, row in env["dependencies"].items():
        if name in NOT_CARRIED:
            assert "not_carried" in row
        else:
            assert row["from"].startswith(site), (name, row)
    # what came from neither the image's list nor the wheels: only what this project's newer huggingface-hub
    # brings (the image's own version brings its own)
    shims = view_allowed() - set(IMAGE_PACKAGES) - set(carried())
    assert set(env["outside_image"]) <= shims, env["outside_image"]
    imported = set(data["stages"]["train"]["result"]["distributions"])
    assert imported <= view_allowed() and not imported & set(NOT_CARRIED)
    assert {"rapidfuzz", "av", "qwen-vl-utils", "transformers"} <= imported


def test_deepspeed_imports_in_the_image_view(view: Path) -> None:
    """The deepspeed stage's import (mmrl imports DeepSpeed where it is installed): its own requirements are in
    the image or carried."""
    env = {**os.environ, "PYTHONPATH": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(view), "-c", "import deepspeed, pydantic, hjson; print(deepspeed.__version__)"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == BUILT_WHEELS["deepspeed"]
