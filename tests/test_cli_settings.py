"""Settings a user sees from the command line.

* ``mmrl config show`` prints every key of the resolved configuration with its value and its meaning;
* every option of ``train``, ``sft``, ``eval``, ``config show`` and ``data`` has help text;
* ``train.cpu_threads``: a number is used as given; ``auto`` takes ``OMP_NUM_THREADS`` when set, keeps the
  count a resumed run started with, and otherwise never asks for more threads than the free cores.
"""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from mmrl import cli
from mmrl.config import load_run_config
from mmrl.config.io import describe
from mmrl.run import set_cpu_threads


def test_config_show_prints_every_key_with_value_and_meaning(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["config", "show", "--task", "image-qa", "train.steps=7", "rewards=[{name: accuracy}]"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = [line.split(":", 1)[0] for line in lines if not line.startswith(" ")]
    cfg = load_run_config("image-qa", overrides=["train.steps=7", "rewards=[{name: accuracy}]"])
    assert keys == [k for k, _, _ in describe(cfg)]
    assert "train.steps: 7" in lines and "rewards[0].name: accuracy" in lines
    for i, line in enumerate(lines):  # each key is followed by its meaning
        if not line.startswith(" "):
            assert i + 1 < len(lines) and lines[i + 1].startswith("    ") and lines[i + 1].strip(), line
    meaning = lines[lines.index("data.on_bad_sample: raise") + 1]
    assert "FILE:LINE" in meaning


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


@pytest.mark.parametrize("command", ["train", "sft", "eval", "config", "data"])
def test_every_option_has_help_text(command: str) -> None:
    parser = cli.build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    missing = [f"{prog} {a.option_strings or a.dest}" for prog, a in _actions(sub) if not a.help]
    assert not missing


def test_cpu_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(1, show=False) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_cpu_threads("auto", show=False) == 2 and torch.get_num_threads() == 2
        assert set_cpu_threads("auto", show=False, earlier=1) == 1  # a resume keeps the run's count
        monkeypatch.delenv("OMP_NUM_THREADS")
        n = set_cpu_threads("auto", show=False)
        cores = len(os.sched_getaffinity(0))
        assert 1 <= n <= max(1, round(cores - os.getloadavg()[0]) + 1) and n <= cores
    finally:
        torch.set_num_threads(before)
