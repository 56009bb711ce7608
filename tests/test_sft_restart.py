"""A cold start killed midway is redone from its first step (it keeps no checkpoints) and says so; its earlier
log rows are replaced, not doubled."""

import json
from pathlib import Path

import pytest
from test_train import TINY


def test_a_killed_cold_start_says_it_runs_again_from_step_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    from mmrl.config import load_run_config
    from mmrl.engine.run_log import RunLog
    from mmrl.engine.sft import run_sft
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_run_config(overrides=[*TINY, "sft.target=gold", "sft.steps=2", "sft.batch_size=2"])
    samples, _ = load_split(cfg, "train")
    policy = load_policy(resolve_model(cfg))
    (tmp_path / "run").mkdir()
    (tmp_path / "fresh").mkdir()
    log = RunLog(tmp_path / "run")
    for step in (1, 2, 3):  # the killed session's rows
        log.metrics("sft", step, {"loss": 9.0})
    assert log.last_step("sft") == 3
    capsys.readouterr()
    run_sft(cfg, policy, samples, log=log, show_progress=False)
    said = capsys.readouterr().out
    assert "stopped at SFT step 3 of 2" in said and "runs again from step 0" in said
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [1, 2] and all(r["loss"] != 9.0 for r in rows)
    capsys.readouterr()
    run_sft(cfg, policy, samples, log=RunLog(tmp_path / "fresh"), show_progress=False)
    assert "runs again" not in capsys.readouterr().out  # a first cold start says nothing
