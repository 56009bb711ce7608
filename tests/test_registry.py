"""The one registry class: unknown names, duplicates, aliases, metadata, unregistering."""

from __future__ import annotations

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
