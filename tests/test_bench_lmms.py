"""The lmms-eval bridge: the command it builds, and a clear error when the extra is not installed."""

import importlib.util
import sys

import pytest

from mmrl.benchmarks.lmms_bridge import build_command, run_lmms_eval
from mmrl.toy.tiny_models import ensure_tiny
from mmrl_common.errors import MmrlError


def test_command_for_a_checkpoint(tmp_path) -> None:
    tiny = ensure_tiny("qwen2_5_vl")
    cmd = build_command(tiny, "videomme", out=tmp_path, frames=32, max_pixels=3136, limit=5, subtitles=True)
    assert cmd[:3] == [sys.executable, "-m", "lmms_eval"]
    assert cmd[cmd.index("--model") + 1] == "qwen2_5_vl"
    assert cmd[cmd.index("--model_args") + 1] == f"pretrained={tiny.resolve()},max_num_frames=32,max_pixels=3136"
    assert cmd[cmd.index("--tasks") + 1] == "videomme_w_subtitle" and cmd[-2:] == ["--limit", "5"]
    with pytest.raises(MmrlError, match="no task for 'pathvqa'"):
        build_command(tiny, "pathvqa", out=tmp_path)
    with pytest.raises(MmrlError, match="no config.json"):
        build_command(tmp_path, "mvbench", out=tmp_path)


def test_missing_extra_says_how_to_install(tmp_path, monkeypatch) -> None:
    import mmrl.benchmarks.lmms_bridge as bridge

    assert bridge.lmms_available() == (importlib.util.find_spec("lmms_eval") is not None)
    monkeypatch.setattr(bridge, "lmms_available", lambda: False)  # as on a machine without the extra
    with pytest.raises(MmrlError, match=r"pip install 'mmrl\[eval\]'"):
        run_lmms_eval(ensure_tiny("qwen2_5_vl"), "mvbench", out=tmp_path)
