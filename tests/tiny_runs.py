"""Shared by the trainer tests: the overrides of a seconds-long ``mmrl train`` on the tiny model and the toy
colour videos, a module-wide model/toy cache, and a helper that runs training and returns the RL rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY_RUN = [
    "model.tiny_family=qwen2_5_vl", "model.init=random",
    "data.toy_size={train: 4, val: 2, test: 2}", "data.toy_tasks=[color]",
    "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
    "rollout.group_size=4", "rollout.max_new_tokens=4",
    "train.prompts_per_step=2", "train.micro_batch_size=3", "train.steps=2", "train.save_every=0",
    "train.log_every=0", "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
    "train.cpu_threads=1",  # not the load-dependent `auto`: two runs compared in a test take the same count
]


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory):
    """``MMRL_CACHE`` in a folder of this test module's own (tiny models and toy worlds are built once)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def own_model(out: Path) -> Path:
    """A copy of the cached tiny Qwen2.5-VL in ``out`` without the settings file mmrl writes beside it: a user's
    own model folder."""
    import shutil

    from mmrl.toy.tiny_models import ensure_tiny

    shutil.copytree(ensure_tiny("qwen2_5_vl"), out)
    (out / "mmrl_eval.json").unlink(missing_ok=True)
    return out


def as_7b(folder: Path) -> Path:
    """The folder's config.json with Qwen2.5-VL-7B's text sizes (the real-model preset reads sizes, not weights)."""
    cfg = json.loads((folder / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    text.update(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944, vocab_size=152064)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """``mmrl ARGV`` in this process: its exit status, stdout and stderr."""
    from mmrl.cli import main

    capsys.readouterr()
    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def rl_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


def run_rl(tmp_path: Path, *overrides: str, task: str = "video-qa") -> list[dict]:
    """Train in ``tmp_path/run`` with :data:`TINY_RUN` plus ``overrides``; the metrics rows of the RL stage."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    cfg = load_run_config(task, overrides=[*TINY_RUN, *overrides])
    train(cfg, run_dir=tmp_path / "run", show_progress=False)
    return rl_rows(tmp_path / "run")


class StopRun(Exception):
    """Raised by the ``test-stop-at`` plug-in."""


STOP_AT: list[int] = []
"""Steps after which the ``test-stop-at`` plug-in ends training (a run stopped there keeps the checkpoints
written before): add ``"plugins={test-stop-at: {}}"`` to a run's overrides and set ``STOP_AT[:] = [step]``."""


def _register_stop_plugin() -> None:
    from mmrl.engine.plugins import Callback, register_plugin

    @register_plugin("test-stop-at")
    class StopAt(Callback):
        def on_step_end(self, step: int, stats: dict) -> None:
            if step in STOP_AT:
                raise StopRun(step)


_register_stop_plugin()


def stop_after(run: Path, step: int, *overrides: str, task: str = "video-qa") -> list[dict]:
    """Train in ``run`` with :data:`TINY_RUN` plus ``overrides`` and a checkpoint every step, ending the session
    after ``step``'s work but before its metrics row and checkpoint (the ``test-stop-at`` plug-in): a run that
    ``--resume`` redoes from checkpoint-``step - 1``. Returns the RL rows it wrote."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    STOP_AT[:] = [step]
    try:
        with pytest.raises(StopRun):
            train(load_run_config(task, overrides=[*TINY_RUN, *overrides, "train.save_every=1",
                                                   "plugins={test-stop-at: {}}"]),
                  run_dir=run, show_progress=False)
    finally:
        STOP_AT[:] = []
    return rl_rows(run)
