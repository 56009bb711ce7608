"""The GRPO config and the model families without torch, and the declared names that make it possible.

* ``mmrl.grpo.config`` (``GRPOConfig`` and its checks of names and loss settings) and ``mmrl.model.families``
  import no torch, numpy or transformers, nor do the package fronts ``mmrl.grpo`` and ``mmrl.model``; checked in a
  fresh interpreter, with a bad name, a plug-in's name and a declared loss's settings;
* the built-in names declared in ``mmrl.grpo.names`` and the objects the torch modules register are the same
  entries (no name declared without its object, no built-in object registered without its declaration), and the
  declared policy-loss settings are the loss functions' own defaults, checked by the declared checks;
* the lazy fronts give every name of their ``__all__``, the same objects as their modules.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "numpy", "transformers")


def run_python(code: str, *, cwd: Path = ROOT, path: Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (the repository importable, and ``path`` too); it prints one JSON
    object on its last line, returned."""
    prelude = f"import sys, json\nsys.path[:0] = [{str(ROOT)!r}{f', {str(path)!r}' if path else ''}]\n"
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ no torch
TORCH_FREE = """
import mmrl.grpo.config
import mmrl.model.families
from mmrl.grpo.config import GRPOConfig, check_number, range_words
from mmrl.grpo.names import POLICY_LOSSES, loss_meta
from mmrl.model.families import DEFAULT_TARGETS, FAMILIES, has_linear_attention
from mmrl.model import FAMILIES as FRONT_FAMILIES, PolicyOptions
from mmrl_common.errors import ConfigError
import mmrl.grpo
import mmrl.model

out = {}
def error(**kw):
    try:
        GRPOConfig(**kw)
    except ConfigError as exc:
        return str(exc)
    return None

out["bad"] = error(advantage_estimator="grp")
out["bad_loss"] = error(policy_loss="gspoo")
out["bad_setting"] = error(policy_loss="gspo", policy_loss_kwargs={"clip_lo": 1})
out["refused_setting"] = error(policy_loss="kl_cov", policy_loss_kwargs={"coef": -1})
out["bad_kl"] = error(kl_reward_estimator="K1")
out["clip_cov"] = GRPOConfig(policy_loss="clip_cov", policy_loss_kwargs={"lb": 0.5}).loss_settings

# a torch-free plug-in: registers one name outright and declares another (its module loaded on first use)
from mmrl.grpo.names import ADVANTAGES, SHAPERS
ADVANTAGES.add("t_plugin_estimator", lambda rewards, groups, eps: rewards)
POLICY_LOSSES.declare("t_plugin_loss", "t_plugin_losses", meta=loss_meta({"alpha": 1.0}))
out["plugin"] = error(advantage_estimator="t_plugin_estimator", policy_loss="t_plugin_loss",
                      policy_loss_kwargs={"alpha": 2.0})
out["plugin_setting"] = error(policy_loss="t_plugin_loss", policy_loss_kwargs={"beta": 2.0})
out["bad_after_plugin"] = error(advantage_estimator="grp")
out["grpo_front"] = mmrl.grpo.GRPOConfig is GRPOConfig and mmrl.grpo.Registry is type(ADVANTAGES)
out["model_front"] = FRONT_FAMILIES is FAMILIES and mmrl.model.PolicyOptions is PolicyOptions
out["heavy"] = sorted(m for m in HEAVY if m in sys.modules)
out["unloaded"] = sorted(m for m in ("mmrl.grpo.losses", "mmrl.grpo.shaping", "mmrl.model.types",
                                     "mmrl.model.lora", "t_plugin_losses") if m in sys.modules)
print(json.dumps(out))
"""


def test_the_grpo_config_and_the_model_families_import_no_torch() -> None:
    out = run_python(f"HEAVY = {HEAVY!r}\n" + TORCH_FREE)
    assert out["heavy"] == [] and out["unloaded"] == [], out
    valid = "batch_std, dr_grpo, grpo, rloo"
    assert out["bad"] == ("unknown advantage estimator 'grp' (config key 'advantage_estimator'); did you mean "
                          f"'grpo'? valid: {valid}")
    assert out["bad_loss"] == ("unknown policy loss 'gspoo' (config key 'policy_loss'); did you mean 'gspo'? "
                               "valid: clip_cov, gspo, kl_cov, ppo")
    assert out["bad_setting"] == ("grpo.policy_loss_kwargs.clip_lo: policy loss 'gspo' has no setting 'clip_lo'"
                                  "did you mean 'clip_low'? ; its settings: clip_high, clip_low")
    assert out["refused_setting"] == "grpo.policy_loss_kwargs (policy loss 'kl_cov'): coef=-1 must be >= 0"
    assert out["bad_kl"] == ("unknown KL estimator 'K1' (config key 'kl_estimator'); did you mean 'k1'? "
                             "valid: abs, k1, k2, k3, none")
    assert out["clip_cov"] == {"ratio": 2e-4, "lb": 0.5, "ub": 5.0}
    assert out["plugin"] is None  # the plug-in's names are valid
    assert out["plugin_setting"].startswith("grpo.policy_loss_kwargs.beta: policy loss 't_plugin_loss' has no "
                                            "setting 'beta'")
    assert out["bad_after_plugin"].endswith("valid: batch_std, dr_grpo, grpo, rloo, t_plugin_estimator")
    assert out["grpo_front"] and out["model_front"]


def test_a_plugin_registered_in_its_own_module_is_a_valid_name(tmp_path: Path) -> None:
    """A method's or a user's module registering with the ``register_...`` decorators (it imports the torch
    module that defines them): once imported (the config's ``imports:``), its names are valid config values."""
    (tmp_path / "t_user_plugin.py").write_text(textwrap.dedent("""
        from mmrl.grpo import register_advantage, register_policy_loss, register_shaper

        @register_advantage("t_user_estimator")
        def estimator(rewards, groups, eps):
            return rewards

        def check(s):
            if s["alpha"] < 0:
                raise ValueError("alpha must be >= 0")

        @register_policy_loss("t_user_loss", settings={"alpha": 1.0}, check=check)
        def loss(logp, old_logp, advantages, mask, cfg):
            raise NotImplementedError

        @register_shaper("t_user_shaper")
        class Shaper:
            requires = ()
        """))
    out = run_python("""
        import importlib
        from mmrl.grpo.config import GRPOConfig
        from mmrl_common.errors import ConfigError
        out = {}
        try:
            GRPOConfig(advantage_estimator="t_user_estimator")
        except ConfigError as exc:
            out["before"] = str(exc)
        importlib.import_module("t_user_plugin")  # what the config's imports: list does
        cfg = GRPOConfig(advantage_estimator="t_user_estimator", policy_loss="t_user_loss",
                         policy_loss_kwargs={"alpha": 3.0}, shaper="t_user_shaper")
        out["settings"] = cfg.loss_settings
        out["shaper"] = type(cfg.build_shaper()).__module__
        try:
            GRPOConfig(policy_loss="t_user_loss", policy_loss_kwargs={"alpha": -1.0})
        except ConfigError as exc:
            out["refused"] = str(exc)
        from mmrl.grpo import get_advantage, get_policy_loss
        out["objects"] = [get_advantage("t_user_estimator").__module__, get_policy_loss("clip_cov").__module__]
        print(json.dumps(out))
        """, path=tmp_path)
    assert out["before"].startswith("unknown advantage estimator 't_user_estimator'")
    assert out["settings"] == {"alpha": 3.0} and out["shaper"] == "t_user_plugin"
    assert out["refused"] == "grpo.policy_loss_kwargs (policy loss 't_user_loss'): alpha must be >= 0"
    assert out["objects"] == ["t_user_plugin", "mmrl.grpo.cov_losses"]


# --------------------------------------------------------------------------- declared vs registered
def drift(registry, prefix: str = "mmrl.grpo.") -> list[str]:
    """What differs between ``registry``'s declared entries and the objects registered by the modules under
    ``prefix`` (import the declaring modules first): a declared name whose module did not register it (or whose
    object comes from another module), a registered object of a module under ``prefix`` whose name is not
    declared."""
    declared = registry.declared()
    bad = []
    for name, module in declared.items():
        try:
            obj = registry.get(name)
        except ValueError as exc:
            bad.append(f"declared, not registered: {name} ({exc})")
            continue
        if getattr(obj, "__module__", None) != module:
            bad.append(f"declared by {module}, registered by {getattr(obj, '__module__', None)}: {name}")
    for name in registry:
        obj = registry.get(name) if registry.loaded(name) else None
        if str(getattr(obj, "__module__", "")).startswith(prefix) and name not in declared:
            bad.append(f"registered by {obj.__module__}, not declared: {name}")
    return bad


def import_all_grpo_modules() -> None:
    import mmrl.grpo

    for info in pkgutil.iter_modules(mmrl.grpo.__path__):
        importlib.import_module(f"mmrl.grpo.{info.name}")


def test_the_declared_names_are_the_registered_ones() -> None:
    from mmrl.grpo.names import BUILTIN

    import_all_grpo_modules()  # every module of the package, so an undeclared registration shows
    for family, (registry, modules) in BUILTIN.items():
        assert drift(registry) == [], family
        assert registry.declared() == {name: f"mmrl.grpo.{module}" for module, entries in modules.items()
                                       for name in entries}, family
        assert all(registry.loaded(name) for name in registry.declared()), family


def test_the_drift_check_sees_a_planted_drift() -> None:
    from mmrl_common.registry import Registry

    reg = Registry("widget")
    reg.declare("ghost", "json")  # json registers nothing
    reg.declare("moved", "json")

    def stray(x):
        return x

    stray.__module__ = "planted.mod"
    reg.add("stray", stray)  # registered by a planted module, not declared
    reg.add("moved", stray)  # declared by json, which does not register it: registered from elsewhere
    assert drift(reg, prefix="planted.") == [
        ("declared, not registered: ghost (widget 'ghost' is declared to be registered by module 'json', which "
         "did not register it)"),
        "declared by json, registered by planted.mod: moved",
        "registered by planted.mod, not declared: stray"]
    reg2 = Registry("widget")
    reg2.declare("moved", "planted.mod")
    reg2.add("moved", stray)  # filled by its declaring module
    assert drift(reg2, prefix="planted.") == []
    reg2.add("other", stray)
    assert drift(reg2, prefix="planted.") == ["registered by planted.mod, not declared: other"]


# the loss functions whose keyword defaults the declared settings are
LOSS_FUNCTIONS = {"gspo": ("mmrl.grpo.losses", "gspo_loss"), "clip_cov": ("mmrl.grpo.cov_losses", "clip_cov_loss"),
                  "kl_cov": ("mmrl.grpo.cov_losses", "kl_cov_loss")}


def test_the_declared_loss_settings_are_the_loss_functions_defaults() -> None:
    from mmrl.grpo.names import BUILTIN, POLICY_LOSSES

    declared = {name: meta for entries in BUILTIN["policy losses"][1].values() for name, meta in entries.items()}
    assert set(declared) == set(POLICY_LOSSES.declared())
    for name, meta in declared.items():
        POLICY_LOSSES.get(name)  # registered: the metadata is the registry's after the module's registration
        assert dict(POLICY_LOSSES.meta(name)) == meta, name
        settings, check = meta["settings"], meta["check"]
        if name == "ppo":  # its knobs are GRPOConfig's own (clip_low, clip_high, dual_clip_c)
            assert settings == {} and check is None
            continue
        module, function = LOSS_FUNCTIONS[name]
        params = inspect.signature(getattr(importlib.import_module(module), function)).parameters
        assert settings == {k: params[k].default for k in settings}, name
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in settings), name
        check(dict(settings))  # the defaults pass their check
        for key in settings:  # and a value out of range does not
            with pytest.raises(ValueError, match=key):
                check({**settings, key: -1.0 if key != "lb" else 99.0})


# ---------------------------------------------------------------------------------------- the fronts
FRONTS = """
import importlib
out = {}
for front in ("mmrl.grpo", "mmrl.model"):
    mod = importlib.import_module(front)
    names = list(mod.__all__)
    missing = [n for n in names if n not in dir(mod)]
    got = {n: getattr(mod, n) for n in names}
    homes = {n: getattr(v, "__module__", None) for n, v in got.items()}
    same = all(getattr(importlib.import_module(h), n) is v for n, v in got.items()
               for h in [homes[n]] if h and h.startswith(front) and hasattr(importlib.import_module(h), n))
    out[front] = {"names": sorted(names), "missing": missing, "same": same,
                  "modules": sorted(n for n, v in got.items() if type(v).__name__ == "module")}
ns = {}
exec("from mmrl.grpo import *", ns)
exec("from mmrl.model import *", ns)
out["star"] = sorted(n for n in ns if not n.startswith("__"))
print(json.dumps(out))
"""

GRPO_NAMES = [
    "Denominators", "GRPOConfig", "GlobalCounts", "GroupAccumulator", "GroupStats", "PolicyLossOutput",
    "Registry", "ShapingInput", "ShapingOutput", "TokenShaper", "accumulate_groups", "aggregate",
    "broadcast_to_tokens", "build_shaper", "compute_advantages", "compute_policy_loss",
    "count_tokens_and_seqs", "dynamic_sampling_mask", "get_advantage", "get_aggregation", "get_kl",
    "get_policy_loss", "get_shaper", "global_counts", "group_inverse", "gspo_loss", "informative_groups",
    "kl_in_reward", "kl_penalty", "overlong_keep_mask", "ppo_clip_loss", "register_advantage",
    "register_aggregation", "register_kl", "register_policy_loss", "register_shaper", "sequence_log_ratio",
    "soft_overlong_penalty",
]
MODEL_NAMES = [
    "FAMILIES", "IMAGE", "TEXT", "VIDEO", "EncodedMedia", "Generation", "MediaInput", "MediaStore", "Policy",
    "PolicyOptions", "RankBinding", "TokenSeq", "adapter_base", "check_model_dir", "checkpointing_switch",
    "load_policy", "resolve_device", "warn_cpu_fallback",
]


def test_the_lazy_fronts_give_every_name_of_their_all() -> None:
    out = run_python(FRONTS)
    for front, names in (("mmrl.grpo", GRPO_NAMES), ("mmrl.model", MODEL_NAMES)):
        assert out[front] == {"names": sorted(names), "missing": [], "same": True, "modules": []}, front
    assert out["star"] == sorted(GRPO_NAMES + MODEL_NAMES)


def test_the_grpo_front_gives_the_aggregate_function_after_its_module_is_imported() -> None:
    """``aggregate`` names a module of mmrl.grpo and the function the package exports: importing the module
    first (as mmrl.grpo.policy_loss does) must not leave the module where the function was."""
    out = run_python("""
        import mmrl.grpo.policy_loss
        from mmrl.grpo import aggregate
        import mmrl.grpo
        fn = sys.modules["mmrl.grpo.aggregate"].aggregate
        print(json.dumps({"from": aggregate is fn, "attr": mmrl.grpo.aggregate is fn,
                          "other": mmrl.grpo.global_counts is sys.modules["mmrl.grpo.aggregate"].global_counts}))
        """)
    assert out == {"from": True, "attr": True, "other": True}


def test_submodules_import_through_the_fronts() -> None:
    out = run_python("""
        from mmrl.model import families, options
        from mmrl.grpo import names, config
        import mmrl.model
        print(json.dumps({"mods": [m.__name__ for m in (families, options, names, config)],
                          "unknown": not hasattr(mmrl.model, "no_such_name"),
                          "heavy": sorted(m for m in ("torch", "numpy") if m in sys.modules)}))
        """)
    assert out == {"mods": ["mmrl.model.families", "mmrl.model.options", "mmrl.grpo.names", "mmrl.grpo.config"],
                   "unknown": True, "heavy": []}


def test_a_lazy_front_loads_a_module_once_and_keeps_a_name_bound_before() -> None:
    """mmrl_common.lazy_front: a name is loaded with its module's others on first use; a name bound on the package
    first (a monkeypatch) is not overwritten when its module loads later; an unknown name is an AttributeError."""
    from mmrl_common.lazy_front import lazy_front

    loads: list[str] = []

    def load(home: str) -> dict:
        loads.append(home)
        return {"a": 1, "b": 2} if home == "m" else {"c": 3}

    namespace = {"__name__": "pkg", "__all__": ["a", "b", "c"]}
    getattr_, dir_ = lazy_front(namespace, {"m": ("a", "b"), "n": ("c",)}, load)
    namespace["b"] = "patched"
    assert getattr_("a") == 1 and namespace["b"] == "patched" and loads == ["m"]
    assert getattr_("c") == 3 and loads == ["m", "n"]
    assert {"a", "b", "c"} <= set(dir_())
    with pytest.raises(AttributeError, match="has no attribute 'zz'"):
        getattr_("zz")
