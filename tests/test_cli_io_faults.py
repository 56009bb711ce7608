"""I/O faults end in one line (issue 46): a full disk (ENOSPC), a file-size limit (EFBIG), a read-only
filesystem or no permission name the file, the cause and what to do, with a non-zero exit and no traceback;
an empty or truncated ``trainer_state.pt`` names the file."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.cli import main
from mmrl.engine.checkpoint import load_trainer_state
from mmrl_common.errors import MmrlError

REPO = Path(__file__).resolve().parents[1]


def _spec(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"arms:\n  grpo: {{task: video-qa}}\nseeds: [0]\nout: {out}\n")
    return spec, out


def test_a_full_disk_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, out = _spec(tmp_path)
    (out / "compare.md").symlink_to("/dev/full")  # every write there: ENOSPC
    assert main(["compare", str(spec), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {out / 'compare.md'}: No space left on device (ENOSPC); free space on that disk "
                   "(df -h), or give another --out, and run again\n")


def test_a_file_size_limit_is_one_line_naming_the_file(tmp_path: Path) -> None:
    spec, out = _spec(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mmrl", "compare", str(spec), "--report-only"], check=False, timeout=300,
                          cwd=REPO, capture_output=True, text=True,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200)))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {out / 'compare.md'}: File too large (EFBIG); ")
    assert "ulimit -f" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize("code, hint", [(errno.EROFS, "read-only: write elsewhere"),
                                        (errno.EACCES, "check the permissions"),
                                        (errno.ENOSPC, "free space")])
def test_read_only_and_permission_faults_name_the_path_and_a_hint(code: int, hint: str) -> None:
    from mmrl.cli import io_fault

    try:
        try:
            raise OSError(code, os.strerror(code), "/runs/r/checkpoint-4/trainer_state.pt")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner  # a library's own error on top keeps the cause
    except RuntimeError as exc:
        line = io_fault(exc)
    assert line.startswith(f"/runs/r/checkpoint-4/trainer_state.pt: {os.strerror(code)} ({errno.errorcode[code]}); ")
    assert hint in line
    assert io_fault(OSError(errno.ENOENT, "No such file or directory", "x")) is None  # not an I/O fault of these


def test_an_empty_or_truncated_trainer_state_names_the_file(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    state = ckpt / "trainer_state.pt"
    state.write_bytes(b"")
    with pytest.raises(MmrlError, match=rf"{state} is empty \(0 bytes\): this checkpoint is damaged"):
        load_trainer_state(ckpt)
    torch.save({"step": 2, "rng": torch.arange(1000)}, state)
    state.write_bytes(state.read_bytes()[:300])
    with pytest.raises(MmrlError, match=rf"{state} cannot be read \(.*\): this checkpoint is damaged"):
        load_trainer_state(ckpt)
