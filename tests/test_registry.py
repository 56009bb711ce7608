"""The one registry class: unknown names, duplicates, aliases, metadata, unregistering, declared entries."""

from __future__ import annotations

import sys

import pytest

from mmrl_common.errors import ConfigError, DataError
from mmrl_common.registry import Registry, nearest


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def make(**kw) -> Registry:
    reg = Registry("widget", "model.widget", **kw)
    reg.add("double", double)
    reg.add("triple", triple)
    return reg


def test_unknown_name_names_kind_key_nearest_and_valid_names():
    reg = make()
    with pytest.raises(ConfigError) as err:
        reg.get("dubble")
    assert str(err.value) == ("unknown widget 'dubble' (config key 'model.widget'); did you mean 'double'? "
                              "valid: double, triple")
    # nothing close: no guess, still the valid names
    with pytest.raises(ConfigError, match=r"^unknown widget 'zzz' \(config key 'model.widget'\); valid: double"):
        reg.get("zzz")
    # a different case is suggested even when the spelling is otherwise far from every name
    with pytest.raises(ConfigError, match="did you mean 'triple'"):
        reg.get("TRIPLE")
    # the caller may say where the name came from; the error class is the registry's choice
    with pytest.raises(ConfigError, match=r"unknown widget 'x' \(rewards\[2\]\)"):
        raise reg.unknown("x", where="rewards[2]")
    with pytest.raises(DataError, match="unknown widget 'x'"):
        make(error=DataError).get("x")
    assert reg.find("x") is None and reg.find(None) is None
    assert reg.get("double")(4) == 8


def test_duplicates_are_errors_unless_overwrite():
    reg = make()
    with pytest.raises(ValueError, match=r"widget 'double' is already registered \(test_registry.double\)"):
        reg.add("double", triple)
    assert reg.get("double") is double
    reg.add("double", double)  # the very same object again: harmless
    reg.add("double", triple, overwrite=True)
    assert reg.get("double") is triple
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")

    strict = make(duplicates="error", register_error=ConfigError)
    with pytest.raises(ConfigError, match="already registered"):
        strict.add("double", double)

    loose = make(duplicates="replace")
    loose.add("double", triple)
    assert loose.get("double") is triple


def test_same_qualname_replaces_silently_when_asked():
    def first():
        return 1

    def again():
        return 2

    again.__qualname__ = first.__qualname__  # what re-running a notebook cell produces
    reg = make(duplicates="same-qualname")
    reg.add("f", first)
    reg.add("f", again)
    assert reg.get("f")() == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.add("f", double)
    with pytest.raises(ValueError, match="already registered"):
        make().add("double", lambda x: x)


def test_aliases_and_normalized_spellings_resolve_to_the_name():
    reg = Registry("benchmark", normalize=lambda s: s.strip().lower().replace("_", "-"))
    reg.add("video-mme", "reader", aliases=("videomme", "vmme"))
    for spelling in ("video-mme", "Video_MME", " VIDEOMME ", "vmme"):
        assert reg.canonical(spelling) == "video-mme" and reg.get(spelling) == "reader"
        assert spelling in reg
    assert reg.names() == ["video-mme"]  # aliases are not names
    with pytest.raises(ConfigError, match="did you mean 'video-mme'"):
        reg.get("vmmee")  # close to an alias: the suggestion is the name it stands for
    reg.add("mvbench", "other")
    with pytest.raises(ValueError, match="alias 'vmme' already names 'video-mme'"):
        reg.alias("vmme", "mvbench")
    reg.alias("mvb", "mvbench")
    assert reg.get("MVB") == "other"
    # without normalize, look-ups are exact
    exact = make()
    exact.alias("twice", "double")
    assert exact.get("twice") is double and "Twice" not in exact


def test_unregister_removes_name_aliases_and_metadata():
    reg = make()
    reg.add("half", lambda x: x / 2, aliases=("halve",), meta={"locate_errors": False})
    assert reg.meta("halve") == {"locate_errors": False} and dict(reg.meta("double")) == {}
    with pytest.raises(TypeError):
        reg.meta("half")["locate_errors"] = True  # read-only
    assert reg.unregister("halve")(8) == 4  # by alias; returns the object
    assert "half" not in reg and "halve" not in reg and reg.names() == ["double", "triple"]
    with pytest.raises(ConfigError, match="unknown widget 'half'.*valid: double, triple"):
        reg.unregister("half")
    reg.add("half", triple)  # the name is free again, without the old metadata
    assert dict(reg.meta("half")) == {}


def test_registration_order_is_kept_and_names_are_sorted():
    reg = Registry("step")
    for name in ("zeta", "alpha", "mid"):
        reg.register(name)(name.upper())
    assert list(reg) == ["zeta", "alpha", "mid"] and reg.items()[0] == ("zeta", "ZETA")
    assert reg.values() == ["ZETA", "ALPHA", "MID"]
    assert reg.names() == ["alpha", "mid", "zeta"] and len(reg) == 3
    with pytest.raises(ValueError, match="duplicates must be one of"):
        Registry("step", duplicates="sometimes")


def test_nearest_falls_back_to_case_insensitive_matching():
    assert nearest("acuracy", ["accuracy", "format"]) == ["accuracy"]
    assert nearest("FORMAT", ["accuracy", "format"]) == ["format"]
    assert nearest("qqq", ["accuracy", "format"]) == []


# ------------------------------------------------------------------------------------ declared entries
PLUGIN = '''
from test_registry_home import REG

@REG.register("lazy", meta={"b": 2})
def lazy(x):
    return -x

imported = True
'''


@pytest.fixture
def declared(tmp_path, monkeypatch):
    """A registry (in module ``test_registry_home``) declaring ``lazy``, registered by module ``lazy_widgets``
    (written to ``tmp_path``, not imported yet)."""
    (tmp_path / "test_registry_home.py").write_text(
        "from mmrl_common.registry import Registry\n"
        "REG = Registry('widget', 'model.widget')\n"
        "REG.add('double', lambda x: 2 * x)\n"
        "REG.declare('lazy', 'lazy_widgets', aliases=('lzy',), meta={'a': 1, 'b': 1})\n")
    (tmp_path / "lazy_widgets.py").write_text(PLUGIN)
    (tmp_path / "ghost_widgets.py").write_text("imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("test_registry_home", "lazy_widgets", "ghost_widgets"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import test_registry_home

    yield test_registry_home.REG
    for name in ("test_registry_home", "lazy_widgets", "ghost_widgets"):
        sys.modules.pop(name, None)


def test_a_declared_name_is_valid_and_checked_without_importing_its_module(declared):
    reg = declared
    assert "lazy" in reg and "lzy" in reg and reg.canonical("lzy") == "lazy"
    assert reg.names() == ["double", "lazy"] and list(reg) == ["double", "lazy"] and len(reg) == 2
    assert reg.check("lzy") == "lazy" and dict(reg.meta("lazy")) == {"a": 1, "b": 1}
    assert not reg.loaded("lazy") and reg.loaded("double")
    assert reg.declared() == {"lazy": "lazy_widgets"}
    with pytest.raises(ConfigError) as err:
        reg.check("lazzy")
    assert str(err.value) == ("unknown widget 'lazzy' (config key 'model.widget'); did you mean 'lazy'? "
                              "valid: double, lazy")
    assert "lazy_widgets" not in sys.modules  # none of the above imported it


def test_the_first_look_up_imports_the_declaring_module(declared):
    reg = declared
    assert reg.get("lzy")(3) == -3 and "lazy_widgets" in sys.modules
    assert reg.loaded("lazy") and reg.get("lazy") is sys.modules["lazy_widgets"].lazy
    assert dict(reg.meta("lazy")) == {"a": 1, "b": 2}  # the registration's metadata over the declared
    assert reg.declared() == {"lazy": "lazy_widgets"}  # still the declaring module's object


@pytest.mark.parametrize("how", ["find", "items", "values", "unregister"])
def test_every_look_up_of_objects_imports_it(declared, how):
    reg = declared
    got = getattr(reg, how)(*(("lazy",) if how in ("find", "unregister") else ()))
    lazy = sys.modules["lazy_widgets"].lazy
    assert {"find": lazy, "items": [("double", reg.find("double")), ("lazy", lazy)],
            "values": [reg.find("double"), lazy], "unregister": lazy}[how] == got
    assert ("lazy" in reg) is (how != "unregister")


def test_a_registration_from_elsewhere_meets_the_declared_object(declared):
    reg = declared

    def mine(x):
        return x

    with pytest.raises(ValueError, match=r"widget 'lazy' is already registered \(lazy_widgets.lazy\)"):
        reg.add("lazy", mine)  # the declaring module was imported first and registered its own
    assert reg.get("lazy") is sys.modules["lazy_widgets"].lazy
    reg.add("lazy", mine, overwrite=True)  # replacing it takes overwrite=True, as for any registered name
    assert reg.get("lazy") is mine and reg.declared() == {}


def test_a_declared_module_that_does_not_register_its_name_is_an_error(declared):
    reg = declared
    reg.declare("ghost", "ghost_widgets")
    reg.declare("ghost", "ghost_widgets")  # the same declaration again: harmless
    with pytest.raises(ValueError, match="already registered"):
        reg.declare("ghost", "lazy_widgets")
    with pytest.raises(ValueError, match="already registered"):
        reg.declare("double", "lazy_widgets")
    assert "ghost" in reg and "ghost_widgets" not in sys.modules
    with pytest.raises(ValueError, match="widget 'ghost' is declared to be registered by module "
                                         "'ghost_widgets', which did not register it"):
        reg.get("ghost")
    assert "ghost_widgets" in sys.modules and not reg.loaded("ghost")
    with pytest.raises(ValueError, match="non-empty string"):
        reg.declare("", "ghost_widgets")
    with pytest.raises(ValueError, match="must be a module name"):
        reg.declare("other", "")
