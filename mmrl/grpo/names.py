"""The names of the GRPO families, without torch: the five registries and the built-in entries they declare.

A run config names an advantage estimator, a policy loss (with its own settings), a loss aggregation, KL
estimators and a token shaper; :class:`~mmrl.grpo.config.GRPOConfig` checks those names when it is built. The
registries live here, in a module that imports neither torch nor numpy, so that checking a config (and the
command line that shows one) does not load them. Each built-in entry is *declared* here by name, with the module
that registers its object (:meth:`mmrl_common.registry.Registry.declare`): the name is valid at once, and the
first look-up of the object (``get_advantage("grpo")``, ...) imports that module. The torch modules register the
real objects into these same registries (``@register_advantage("grpo")`` in :mod:`mmrl.grpo.advantages`, ...),
and so do methods and user plug-ins from their own modules: a plug-in imported before the config is checked
(the config's ``imports:``) makes its name valid like a built-in one.

A policy loss's own settings (``grpo.policy_loss_kwargs``) are checked at the same time, so the built-in losses'
settings, their defaults and their checks are declared here too (the losses read them merged with the run's
values, ``cfg.loss_settings``). ``tests/test_torch_free_names.py`` checks that these declarations and the
torch modules' registrations name the same entries, and that the declared defaults are the loss functions' own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mmrl_common.errors import ConfigError
from mmrl_common.registry import Registry, did_you_mean

ADVANTAGES: Registry[Any] = Registry("advantage estimator", "advantage_estimator")
POLICY_LOSSES: Registry[Any] = Registry("policy loss", "policy_loss")
AGGREGATIONS: Registry[Any] = Registry("loss aggregation", "loss_agg")
KL_ESTIMATORS: Registry[Any] = Registry("KL estimator", "kl_estimator")
SHAPERS: Registry[Any] = Registry("token shaper", "shaper")


# ------------------------------------------------------------------- the built-in losses' settings checks
def check_gspo_settings(s: dict[str, Any]) -> None:
    """``gspo``: ``clip_low`` in [0, 1), ``clip_high`` >= 0 (:func:`mmrl.grpo.losses.gspo_loss`)."""
    if not 0 <= s["clip_low"] < 1:
        raise ValueError(f"clip_low={s['clip_low']!r} must be in [0, 1) (GSPO's sequence ratios stay near 1: 3e-4)")
    if s["clip_high"] < 0:
        raise ValueError(f"clip_high={s['clip_high']!r} must be >= 0 (GSPO's default: 4e-4)")


def check_cov_ratio(s: dict[str, Any]) -> None:
    """``ratio`` of Clip-Cov and KL-Cov: a share of the valid tokens, in [0, 1]."""
    if not 0 <= s["ratio"] <= 1:
        raise ValueError(f"ratio={s['ratio']!r} is a share of the tokens: must be in [0, 1] (2e-4 is the "
                         "authors' default)")


def check_clip_cov_settings(s: dict[str, Any]) -> None:
    """``clip_cov``: the ratio, and ``lb`` below ``ub`` (:func:`mmrl.grpo.cov_losses.clip_cov_loss`)."""
    check_cov_ratio(s)
    if s["lb"] >= s["ub"]:
        raise ValueError(f"lb={s['lb']!r} must be below ub={s['ub']!r}")


def check_kl_cov_settings(s: dict[str, Any]) -> None:
    """``kl_cov``: the ratio, and ``coef`` >= 0 (:func:`mmrl.grpo.cov_losses.kl_cov_loss`)."""
    check_cov_ratio(s)
    if s["coef"] < 0:
        raise ValueError(f"coef={s['coef']!r} must be >= 0")


def loss_meta(settings: Mapping[str, Any] | None = None,
              check: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A policy loss's registry metadata: its settings with their defaults, and the check of their values."""
    return {"settings": dict(settings or {}), "check": check}


# ------------------------------------------------------------------------------- the built-in entries
_HERE = __name__.rpartition(".")[0]  # the package: mmrl.grpo

# registry -> module (under the package) -> the names it registers, each with its declared metadata
BUILTIN: dict[str, tuple[Registry[Any], dict[str, dict[str, Mapping[str, Any] | None]]]] = {
    "advantages": (ADVANTAGES, {"advantages": {"grpo": None, "dr_grpo": None, "batch_std": None, "rloo": None}}),
    "policy losses": (POLICY_LOSSES, {
        "losses": {
            "ppo": loss_meta(),
            "gspo": loss_meta({"clip_low": 3e-4, "clip_high": 4e-4}, check_gspo_settings),
        },
        "cov_losses": {
            "clip_cov": loss_meta({"ratio": 2e-4, "lb": 1.0, "ub": 5.0}, check_clip_cov_settings),
            "kl_cov": loss_meta({"ratio": 2e-4, "coef": 1.0}, check_kl_cov_settings),
        },
    }),
    "aggregations": (AGGREGATIONS, {"aggregate": {
        "token-mean": None, "seq-mean-token-mean": None, "seq-mean-token-sum": None,
        "seq-mean-token-sum-norm": None}}),
    "KL estimators": (KL_ESTIMATORS, {"kl": {"k1": None, "k2": None, "k3": None, "abs": None, "none": None}}),
    "shapers": (SHAPERS, {"shaping": {"none": None, "top_entropy": None}}),
}



def _declare_builtins() -> None:
    for registry, modules in BUILTIN.values():
        for module, entries in modules.items():
            for name, meta in entries.items():
                registry.declare(name, f"{_HERE}.{module}", meta=meta)


_declare_builtins()


def policy_loss_settings(name: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of the loss ``name``: its declared defaults updated by ``given``
    (``grpo.policy_loss_kwargs``); :class:`~mmrl_common.errors.ConfigError` for an unknown loss, a key the loss
    does not declare or a value its check refuses. Imports no loss module."""
    meta = POLICY_LOSSES.meta(name)
    defaults = meta.get("settings", {})
    if not isinstance(given, Mapping):
        raise ConfigError(f"grpo.policy_loss_kwargs must be a mapping, got {given!r}")
    for key in given:
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(f"grpo.policy_loss_kwargs.{key}: policy loss {name!r} has no setting {key!r}"
                              f"{did_you_mean(str(key), defaults)}; its settings: {valid}")
    out = {**defaults, **given}
    check = meta.get("check")
    if check is not None:
        try:
            check(out)
        except ValueError as exc:
            raise ConfigError(f"grpo.policy_loss_kwargs (policy loss {name!r}): {exc}") from None
    return out


__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "BUILTIN", "KL_ESTIMATORS", "POLICY_LOSSES", "SHAPERS", "check_clip_cov_settings",
    "check_cov_ratio", "check_gspo_settings", "check_kl_cov_settings", "loss_meta", "policy_loss_settings",
]
