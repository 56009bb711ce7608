"""Plug-ins that declare SETTINGS refuse unknown setting names, suggesting the nearest one."""

from __future__ import annotations

import pytest

from mmrl.engine.plugins import PLUGINS, Callback, build_plugins, register_plugin
from mmrl_common.errors import ConfigError


def test_unknown_setting_is_refused_with_the_nearest_name() -> None:
    @register_plugin("t_settings_probe")
    class Probe(Callback):
        SETTINGS = ("window", "threshold")

    try:
        assert Probe.plugin_name == "t_settings_probe"
        ok = build_plugins({"t_settings_probe": {"window": 3}}, ctx=None)
        assert ok["t_settings_probe"].settings == {"window": 3}
        with pytest.raises(ConfigError, match=r"plugins\.t_settings_probe\.windw: unknown setting; .*'window'"):
            build_plugins({"t_settings_probe": {"windw": 3}}, ctx=None)
    finally:
        PLUGINS.unregister("t_settings_probe")


def test_a_plugin_without_declared_settings_takes_any() -> None:
    assert Callback(None, anything=1).settings == {"anything": 1}
