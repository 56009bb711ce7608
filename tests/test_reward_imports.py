"""A user's reward code (issue 47 item 12): a reward file imports a module beside it, the README's ``module.fn``
reward form works from the module's own folder as ``python -m`` would (the ``mmrl`` console script does not put
the working folder on the import path), and a module that cannot be found is one line naming it, the folder
searched and the fix. Real files in tmp_path, run through the CLI entry from another working folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl import cli

MMRL = str(Path(sys.executable).with_name("mmrl"))


@pytest.fixture()
def no_cwd_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import path as the ``mmrl`` console script has it: no entry for the working folder (``python -m
    pytest`` adds one)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", os.getcwd())])


def _project(root: Path, tag: str) -> Path:
    """``root/proj_<tag>``: a reward file that imports a helper module beside it, and a plain module with a
    reward function (module names carry ``tag``: each test imports its own)."""
    proj = root / f"proj_{tag}"
    proj.mkdir()
    (proj / f"helpers_{tag}.py").write_text("def bonus(text):\n    return 0.5 if 'answer' in text else 0.0\n")
    (proj / f"my_rewards_{tag}.py").write_text(
        f"from helpers_{tag} import bonus\nfrom rewards import register_reward\n\n\n"
        f"@register_reward('beside_{tag}')\n"
        "def beside(completions, **kwargs):\n    return [bonus(c) for c in completions]\n")
    (proj / f"plain_{tag}.py").write_text(
        "def length_fn(completions, **kwargs):\n    return [len(str(c)) / 100 for c in completions]\n")
    return proj


def test_a_reward_file_imports_a_module_beside_it_from_another_folder(tmp_path: Path, no_cwd_on_path: None,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    from rewards import get_reward

    proj = _project(tmp_path, "a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["config", "show", f"imports=[{proj / 'my_rewards_a.py'}]", "rewards=[{name: beside_a}]"]) == 0
    assert "rewards[0].name: beside_a" in capsys.readouterr().out
    assert get_reward("beside_a")(["<answer>x</answer>", "no"]) == [0.5, 0.0]
    assert str(proj) not in sys.path  # importable while the file loaded, not for the rest of the run


def test_module_fn_reward_works_from_the_modules_own_folder(tmp_path: Path, no_cwd_on_path: None,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    proj = _project(tmp_path, "b")
    monkeypatch.chdir(proj)
    assert cli.main(["config", "show", "rewards=[{name: plain_b.length_fn}]"]) == 0
    assert "rewards[0].name: plain_b.length_fn" in capsys.readouterr().out
    assert cli.main(["config", "show", "imports=[plain_b]"]) == 0  # an imports: module name alike


def test_a_module_that_cannot_be_found_names_it_the_folder_and_the_fix(tmp_path: Path, no_cwd_on_path: None,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    proj = _project(tmp_path, "c")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["config", "show", "rewards=[{name: plain_c.length_fn}]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: rewards[0]: reward 'plain_c.length_fn': cannot import 'plain_c'")
    assert str(elsewhere) in err and "run mmrl from the folder that holds plain_c.py" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    (proj / "helpers_c.py").unlink()  # the file's own import fails: named, with the folder it was looked for in
    assert cli.main(["config", "show", f"imports=[{proj / 'my_rewards_c.py'}]"]) == 2
    err = capsys.readouterr().err
    assert f"my_rewards_c.py failed to import: it imports 'helpers_c', which is neither beside it in {proj}" in err
    assert err.count("\n") == 1
    monkeypatch.chdir(proj)  # found from its folder; a function it lacks is named, with the nearest
    assert cli.main(["config", "show", "rewards=[{name: plain_c.length_fun}]"]) == 2
    err = capsys.readouterr().err
    assert "module plain_c" in err and "has no 'length_fun'; did you mean 'length_fn'?" in err


def test_the_console_script_finds_a_module_fn_reward_in_its_working_folder(tmp_path: Path) -> None:
    """The user's own path: the installed ``mmrl`` script, started in the folder of the reward module."""
    proj = _project(tmp_path, "d")
    done = subprocess.run([MMRL, "config", "show", "rewards=[{name: plain_d.length_fn}]"], cwd=proj, check=False,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "rewards[0].name: plain_d.length_fn" in done.stdout
