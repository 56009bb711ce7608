"""`make demo` says at its end whether its gain is in the range the README states (issue 49): the range is the
one measured by configs/compare/demo.yaml, the README prints the same numbers, and a run whose settings are not
the demo's gets no verdict on that range."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache, run_cli  # noqa: F401 (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl.toy import demo_range

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_states_the_range_the_run_is_judged_by() -> None:
    m = demo_range.MEASURED
    assert demo_range.range_text() in " ".join((REPO / "README.md").read_text().split())
    assert m["min"] <= m["median"] <= m["max"]


@pytest.mark.parametrize("overrides", [[], ["train.seed=3"], ["train.cpu_threads=2", "train.save_every=0"]])
def test_the_demo_gets_a_verdict_on_its_gain(overrides: list[str]) -> None:
    m = demo_range.MEASURED
    cfg = load_run_config("video-qa", overrides=overrides)
    assert "within the range" in demo_range.verdict(cfg, 0.4, 0.4 + m["median"])
    assert "BELOW the range" in demo_range.verdict(cfg, 0.4, 0.4 + m["min"] - 0.01)
    assert "above the range" in demo_range.verdict(cfg, 0.4, 0.4 + m["max"] + 0.01)


def test_a_run_that_is_not_the_demo_gets_no_verdict_on_the_range() -> None:
    changed = demo_range.verdict(load_run_config("video-qa", overrides=["train.steps=10", "grpo.kl_coef=0.01"]),
                                 0.4, 0.1)
    assert "this run changed grpo.kl_coef, train.steps" in changed and "BELOW" not in changed
    assert demo_range.verdict(load_run_config("image-qa"), 0.4, 0.1) is None
    assert demo_range.verdict(load_run_config("video-qa", overrides=["data.train=x.jsonl"]), 0.4, 0.1) is None


@pytest.mark.slow
@pytest.mark.usefixtures("module_cache")
def test_mmrl_train_prints_the_verdict_at_its_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run_cli(capsys, "train", "--task", "video-qa", "--quiet", "--out", str(tmp_path / "run"),
                         *TINY_RUN, "eval.before_rl=true", "eval.after_rl=true")
    assert rc == 0
    assert "accuracy before RL" in out
    assert "the README's range for `make demo`" in out and "this run changed" in out
