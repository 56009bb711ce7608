from dataclasses import dataclass, field

import pytest

from mmrl.config.io import apply_overrides, from_dict, parse_override
from mmrl_common.errors import ConfigError


@dataclass
class Inner:
    lr: float = 1e-5
    steps: int = 10
    mode: str = "a"
    stop: list[str] = field(default_factory=list)


@dataclass
class Outer:
    train: Inner = field(default_factory=Inner)
    name: str | None = None
    flag: bool = False


def test_nested_values_and_defaults():
    cfg = from_dict(Outer, {"train": {"lr": "3e-4", "steps": 7.0}, "flag": True})
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.train.mode == "a" and cfg.flag is True and cfg.name is None


def test_unknown_key_names_the_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.stesp'.*'train\.steps'"):
        from_dict(Outer, {"train": {"stesp": 3}})


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"train\.steps: expected an integer, got 'many'"):
        from_dict(Outer, {"train": {"steps": "many"}})
    with pytest.raises(ConfigError, match=r"flag: expected true or false"):
        from_dict(Outer, {"flag": "yes please"})


def test_overrides_parse_yaml_values_and_check_paths():
    assert parse_override("train.stop=['</answer>', x]") == (["train", "stop"], ["</answer>", "x"])
    data = apply_overrides(Outer, {"train": {"lr": 1.0}}, ["train.steps=3", "name=run1"])
    cfg = from_dict(Outer, data)
    assert cfg.train.steps == 3 and cfg.train.lr == 1.0 and cfg.name == "run1"
    with pytest.raises(ConfigError, match=r"'trian'.*'train'"):
        apply_overrides(Outer, {}, ["trian.steps=3"])
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides(Outer, {}, ["train.steps"])


def test_a_recipe_naming_another_task_is_merged_over_it() -> None:
    from mmrl.config import CONFIG_DIR, load_run_config, task_recipe

    by_task = load_run_config("acre")
    by_file = load_run_config(config_file=CONFIG_DIR / "acre.yaml")
    assert by_task.task == "acre" and by_file.task == "video-qa"
    by_task.task = by_file.task
    assert by_task == by_file  # the overlay over video-qa, whichever way it is named
    assert task_recipe("acre")["train"] == task_recipe("video-qa")["train"]  # inherited, not restated


def test_a_recipe_loop_is_a_clear_error(tmp_path, monkeypatch) -> None:
    import pytest

    from mmrl.config import schema as config_mod
    from mmrl_common.errors import ConfigError

    (tmp_path / "a.yaml").write_text("task: b\n")
    (tmp_path / "b.yaml").write_text("task: a\n")
    monkeypatch.setattr(config_mod, "CONFIG_DIR", tmp_path)
    with pytest.raises(ConfigError, match="leads back to itself"):
        config_mod.task_recipe("a")


@pytest.mark.parametrize(("override", "key"), [("rollout.group_size=1", "rollout.group_size"),
                                               ("rollout.temperature=0", "rollout.temperature")])
def test_settings_that_cannot_learn_are_refused(override: str, key: str) -> None:
    from mmrl.config import load_run_config

    with pytest.raises(ConfigError, match=key):
        load_run_config("video-qa", overrides=[override])
