"""What a run refuses before it loads a model: an untested vLLM or DeepSpeed, and expandable segments with
vLLM's sleep mode; and the defaults the vLLM backend brings (log-probs recorded, the gap watched).

The untested versions are real installed package metadata (a ``dist-info`` folder put first on the path), as
pip would leave them; nothing of the check is replaced.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmrl.config import RunConfig, load_run_config
from mmrl.config.preflight import ALLOW_UNTESTED, TESTED, installed_version
from mmrl.engine.health import RunHealth
from mmrl_common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _installed(root: Path, dist: str, version: str) -> Path:
    """A distribution ``dist`` of ``version`` as pip records it (its ``dist-info`` metadata) under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return root


def test_the_extras_pin_the_tested_ranges() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    extras = text[text.index("[project.optional-dependencies]"):text.index("[project.scripts]")]
    for package, spec in TESTED.items():
        assert re.search(rf'(?m)^{package} = \["{re.escape(package + spec)}"\]', extras), package  # its extra
        pins = set(re.findall(rf'"({package}[^"]*)"', extras))  # and wherever else it is named (dev)
        assert pins == {package + spec}, (package, pins, spec)
    assert installed_version("deepspeed")[1] == "0.19.8"  # the suite's own versions are in range
    assert installed_version("vllm") is None or installed_version("vllm")[1].startswith("0.32")


@pytest.mark.parametrize(("dist", "version", "override"), [
    ("vllm", "0.99.0", "rollout.backend=vllm"),
    ("vllm", "0.31.2", "rollout.backend=vllm"),
    ("deepspeed", "0.21.0", "train.deepspeed=zero2"),
])
def test_an_untested_version_is_refused_when_the_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              dist: str, version: str, override: str) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    monkeypatch.syspath_prepend(str(_installed(tmp_path, dist, version)))
    with pytest.raises(ConfigError) as err:
        load_run_config("video-qa", overrides=[override])
    msg = str(err.value)
    assert f"{override} uses {dist} {version}" in msg and TESTED[dist] in msg
    assert f"pip install 'mmrl[{dist}]'" in msg and f"{ALLOW_UNTESTED}=1" in msg
    # the setting names the way out: a warning, and the run goes on
    monkeypatch.setenv(ALLOW_UNTESTED, "1")
    with pytest.warns(UserWarning, match=f"{dist} {version}"):
        load_run_config("video-qa", overrides=[override])
    # another backend never asks for vLLM
    monkeypatch.delenv(ALLOW_UNTESTED)
    if dist == "vllm":
        load_run_config("video-qa", overrides=["rollout.backend=hf"])


@pytest.mark.slow
def test_a_run_with_an_untested_vllm_stops_before_any_model_exists(tmp_path: Path) -> None:
    """``mmrl train`` itself: the refusal is its error line and exit status; the model cache stays empty (the
    tiny model a run builds first is never made)."""
    fake = _installed(tmp_path / "site", "vllm", "0.40.1")
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
           "MMRL_CACHE": str(cache)}
    env.pop(ALLOW_UNTESTED, None)
    proc = subprocess.run([sys.executable, "-m", "mmrl", "train", "--out", str(tmp_path / "run"),
                           "rollout.backend=vllm", "train.steps=1"],
                          check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode != 0
    assert "rollout.backend=vllm uses vllm 0.40.1" in proc.stderr + proc.stdout
    assert not any(p.is_file() for p in cache.rglob("*")) if cache.exists() else True
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_expandable_segments_are_refused_with_sleep_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    sleep = ["rollout.backend=vllm", "rollout.vllm.enable_sleep_mode=true"]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
        monkeypatch.setenv(var, "max_split_size_mb:512,expandable_segments:True")
        with pytest.raises(ConfigError) as err:
            load_run_config("video-qa", overrides=sleep)
        msg = str(err.value)
        assert var in msg and "expandable segments" in msg
        assert f"Unset {var}" in msg and "rollout.vllm.enable_sleep_mode=false" in msg
        load_run_config("video-qa", overrides=sleep[:1])  # no sleep mode: nothing to refuse
        load_run_config("video-qa", overrides=["rollout.vllm.enable_sleep_mode=true"])  # HF rollouts
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    load_run_config("video-qa", overrides=sleep)


def test_vllm_rollouts_record_their_logprobs_by_default() -> None:
    def record(*overrides: str) -> bool:
        return load_run_config("video-qa", overrides=list(overrides)).rollout.record_logprobs

    assert record("rollout.backend=vllm") is True
    assert record("rollout.backend=vllm", "rollout.temperature=0.7") is False  # vLLM's are exact at 1 only
    assert record("rollout.backend=vllm", "rollout.record_logprobs=false") is False
    assert record("rollout.backend=hf") is False
    assert record("rollout.backend=hf", "rollout.record_logprobs=true") is True


def _gap_warnings(gaps: list[float], window: int = 8, state: dict | None = None,
                  first_step: int = 1) -> tuple[list[tuple[int, str]], RunHealth]:
    cfg = RunConfig()
    cfg.train.steps = first_step + len(gaps) - 1
    health = RunHealth(SimpleNamespace(cfg=cfg), window=window)
    if state:
        health.load_state_dict(state)
    fired = []
    for step, gap in enumerate(gaps, start=first_step):
        stats = {"rollout_logprob_gap": gap}
        health.on_step_end(step, stats)
        fired += [(step, v) for k, v in stats.items() if k == "warning/logprob_gap"]
    return fired, health


def test_a_growing_logprob_gap_warns_once() -> None:
    # round-off that stays round-off: no warning, whatever its ratio
    assert _gap_warnings([1e-7, 1e-7, 2e-7, 5e-7, 9e-7, 1e-6, 2e-6, 4e-6, 8e-6])[0] == []
    # a steady bf16-sized gap: no warning
    assert _gap_warnings([0.03] * 12)[0] == []
    # a gap that grows past the floor to over twice its start: one warning, naming both levels
    fired, health = _gap_warnings([0.012, 0.012, 0.013, 0.012, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07])
    assert [s for s, _ in fired] == [8]
    text = fired[0][1]
    assert "0.0450 over steps 7-8" in text and "grew from 0.0120 over the run's first 2 steps" in text
    assert "grpo.tis_cap" in text
    # a resumed run keeps the baseline and does not repeat the warning
    again, _ = _gap_warnings([0.08, 0.09, 0.1], state=health.state_dict(), first_step=11)
    assert again == []
    # a gap high from the start is an alarm too
    fired, _ = _gap_warnings([0.3] * 8)
    assert len(fired) == 1 and "started at 0.3000" in fired[0][1]
    # the warning is part of the run's health checks: no gap logged (HF rollouts), no warning
    assert _gap_warnings([])[0] == []
