"""Issue 61, item 6: the command a diverged run's stop message gives is one that runs. Before, it said
``mmrl train --out RUN --resume train.lr=...``: not a value, and a new learning rate on ``--resume`` is refused by
the settings guard without ``--force-settings``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN

from mmrl import cli


@pytest.mark.slow
def test_the_diverged_run_hint_is_a_command_the_resume_guard_accepts(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    code = cli.main(["train", "--quiet", "--out", str(out), *TINY_RUN, "train.steps=8", "train.save_every=1",
                     "grpo.entropy_coef=0.01", "train.lr=1e3"])
    err = capsys.readouterr().err
    assert code != 0 and "The run is diverging" in err, err[-2000:]
    hinted = re.search(r"`(mmrl train [^`]*)`", err)
    assert hinted, err[-2000:]
    argv = shlex.split(hinted.group(1))
    assert argv[:4] == ["mmrl", "train", "--out", str(out)] and "--resume" in argv and "--force-settings" in argv
    lr = next(a for a in argv if a.startswith("train.lr="))
    assert float(lr.split("=", 1)[1]) == pytest.approx(100.0)  # a tenth of the run's, a number
    code = cli.main([*argv[1:], "--quiet"])  # the command as given: resumed, not refused
    err = capsys.readouterr().err
    assert "settings differ" not in err and "Traceback" not in err, err[-2000:]
    state = json.loads((out / "run_state.json").read_text())
    changes = [c for entry in state["settings_changes"] for c in entry["changes"]]
    assert any(c.startswith("train.lr: 1000.0 -> 100.0") for c in changes), changes
