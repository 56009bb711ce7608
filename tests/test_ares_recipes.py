"""The two ARES recipes (issue 48): ``--task ares`` is the released code's method (shawn0728/ARES, what produced the
published checkpoints), ``--task ares-paper`` the same with the parts the paper describes and the code does not
run -- resolved as a user runs them, on the toy world and with ``--model DIR`` of a 7B-sized model.

:data:`PUBLISHED` is ares-paper's source table for tests/test_published_settings.py: the code's table
(tests/test_published_ares.py) with the paper's rows in place of the code's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_published_ares import PUBLISHED as CODE_TABLE
from tiny_runs import as_7b, module_cache, own_model  # noqa: F401 (module_cache: a fixture)

from mmrl import cli
from mmrl.config import value_at
from mmrl.config.io import to_dict

CODE = {  # the released code's method, against the paper's additions below
    "plugins.ares.count_mode": "triggers",         # vllm_rollout_spmd.py: a trigger word + a window >= tau
    "plugins.ares.threshold_aggregate": "median",  # ray_trainer.py: np.median(batch_thresholds) ...
    "plugins.ares.threshold_ema": 0.99,            # ... tau <- 0.99 tau + 0.01 median
    "plugins.ares.branching": False,               # rollout.n plain rollouts per prompt
    "plugins.ares.hwe_kl_rho": 1.0,                # dp_actor.py: the KL weighted per bucket only
}
PAPER = {
    "plugins.ares.count_mode": ("windows", "paper: every window above tau counts"),
    "plugins.ares.threshold_aggregate": ("mean", "paper: tau = the batch mean of the per-rollout quantiles"),
    "plugins.ares.threshold_ema": (None, "paper: tau of the batch itself"),
    "plugins.ares.branching": (True, "paper: rollouts branch at high-window-entropy points"),
}
PAPER_RHO = 0.5  # paper: rho < 1 inside HWE windows; the value is not published (our choice)

PUBLISHED = [row for row in CODE_TABLE if row[0] not in PAPER and row[0] != "plugins.ares.hwe_kl_rho"] + [
    (key, value, source) for key, (value, source) in PAPER.items()]


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, module_cache: None) -> Path:  # noqa: F811
    """A user's own model folder whose config.json has Qwen2.5-VL-7B's text sizes (the preset applies)."""
    return as_7b(own_model(tmp_path_factory.mktemp("big") / "model"))


def trained(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The config ``mmrl train ARGV`` hands to its run (the run itself is not started)."""
    import mmrl.run

    seen: list[Any] = []
    monkeypatch.setattr(mmrl.run, "train", lambda cfg, **_: seen.append(cfg) or {})
    assert cli.main(["train", *argv]) == 0
    (cfg,) = seen
    return cfg


def _get(cfg: Any, key: str) -> Any:
    return to_dict(value_at(cfg, key))


@pytest.mark.parametrize("with_model", [False, True], ids=["toy", "7b-model"])
def test_ares_is_the_released_code_and_ares_paper_adds_the_papers_parts(
        with_model: bool, big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = ["--model", str(big)] if with_model else []
    code = trained(["--task", "ares", *model, "--out", str(tmp_path / "a")], monkeypatch)
    paper = trained(["--task", "ares-paper", *model, "--out", str(tmp_path / "p")], monkeypatch)
    assert paper.task == "ares-paper"
    for key, value in CODE.items():
        assert _get(code, key) == value, f"--task ares: {key}"
    for key, (value, source) in PAPER.items():
        assert _get(paper, key) == value, f"--task ares-paper: {key} ({source})"
    assert _get(paper, "plugins.ares.hwe_kl_rho") == PAPER_RHO
    for key, value, source in CODE_TABLE:  # everything else of ares-paper is the released code's, preset or not
        if key not in PAPER and key != "plugins.ares.hwe_kl_rho":
            got = _get(paper, key)
            assert got == (pytest.approx(value) if isinstance(value, float) else value), (
                f"--task ares-paper {' '.join(model)}: {key} = {got!r}, the code's {value!r} ({source})")


def test_the_trigger_words_are_the_released_codes() -> None:
    """count_mode triggers counts the code's words (data/crucial_token_final_version.json, 174 of them)."""
    from mmrl.methods.ares.plugin import DEFAULTS
    from mmrl.methods.ares.triggers import ARES_TRIGGERS

    assert DEFAULTS["triggers"] == list(ARES_TRIGGERS)
    assert len(set(ARES_TRIGGERS)) == 174
    assert {"wait", "hmm", "reconsider", "conject", "alternatively"} <= set(ARES_TRIGGERS)
