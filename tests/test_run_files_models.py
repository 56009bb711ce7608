"""The model folders a run writes and the outputs of ``mmrl eval`` (issue 61, items 3, 10 and 12): ``final/``
carries a digest that ``mmrl eval`` (and ``--benchmark``, and a run started from it) checks, so a cut or
bit-flipped one is named in one line, never scored; a save that runs out of room (``ulimit -f``, a full disk)
is one line naming the file it could not write; two ``mmrl eval`` into one ``--out`` do not both write there."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache, run_cli  # noqa: F401 (module_cache is a fixture)

from mmrl_common.errors import MmrlError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def finished(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A finished one-step run: its ``final/``."""
    from mmrl.config import load_run_config
    from mmrl.run import train

    run = tmp_path_factory.mktemp("made") / "run"
    train(load_run_config("video-qa", overrides=[*TINY_RUN, "train.steps=1"]), run_dir=run, show_progress=False)
    return run


def eval_args(model: Path, out: Path) -> list[str]:
    return ["eval", "--quiet", "--model", str(model), "--out", str(out), "--limit", "2", *TINY_RUN]


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01  # one bit of a weight
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_final_is_whole_and_evaluates(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What mmrl writes it reads back: ``final/`` evaluates; no temporary folder is left beside it."""
    rc, _, err = run_cli(capsys, *eval_args(finished / "final", tmp_path / "ev"))
    assert rc == 0, err
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["n"] == 2
    assert len((tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()) == 2
    assert sorted(p.name for p in finished.iterdir() if p.name.startswith(".tmp") or p.name.startswith(".old")) == []


@pytest.mark.slow
@pytest.mark.parametrize("damage", [cut, flip])
def test_a_cut_or_bit_flipped_final_is_named_by_eval_not_scored(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage) -> None:
    final = tmp_path / "final"
    shutil.copytree(finished / "final", final)
    damage(final / "model.safetensors")
    rc, _, err = run_cli(capsys, *eval_args(final, tmp_path / "ev"))
    line = one_error_line(err)
    assert rc == 2 and str(final) in line and "model.safetensors" in line and "damaged" in line
    assert not (tmp_path / "ev").exists()  # nothing scored, nothing left


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut", "missing_shard"])
def test_a_cut_folder_without_a_digest_is_one_line_naming_the_file_not_the_loaders_traceback(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str) -> None:
    """A folder from elsewhere (no digest.json, as a Hugging Face download) is not hashed, but a weights file cut
    short, or a shard its index lists that is not there, is named from the files' headers before loading."""
    folder = tmp_path / "downloaded"
    shutil.copytree(finished / "final", folder)
    (folder / "digest.json").unlink()
    if damage == "cut":
        cut(folder / "model.safetensors")
        named = "model.safetensors"
    else:  # two shards listed, the second never arrived
        header = json.loads((folder / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
            (folder / "model.safetensors").read_bytes()[:8], "little")])
        keys = sorted(k for k in header if k != "__metadata__")
        (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
            k: "model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors"
            for i, k in enumerate(keys)}}))
        named = "model-00002-of-00002.safetensors"
    rc, _, err = run_cli(capsys, *eval_args(folder, tmp_path / "ev"))
    line = one_error_line(err)
    assert rc == 2 and str(folder) in line and named in line and "again" in line, line
    assert not (tmp_path / "ev").exists()


@pytest.mark.slow
def test_a_damaged_final_is_refused_by_every_command_that_loads_a_model_by_path(
        finished: Path, tmp_path: Path) -> None:
    """``mmrl eval --benchmark``, ``mmrl train --model`` and the methods' commands resolve the model folder
    through :func:`mmrl.run.helpers.resolve_model`; a Hugging Face folder without a digest is taken as it is."""
    import dataclasses

    from mmrl.config import load_run_config
    from mmrl.run.helpers import resolve_model

    final = tmp_path / "final"
    shutil.copytree(finished / "final", final)
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"model.path={final}"])
    assert resolve_model(cfg) == final
    (final / "tokenizer_config.json").unlink()
    with pytest.raises(MmrlError, match=r"tokenizer_config.json is missing"):
        resolve_model(cfg)
    (final / "digest.json").unlink()  # a model folder from elsewhere: no digest, not checked
    assert resolve_model(dataclasses.replace(cfg)) == final


@pytest.mark.slow
def test_two_evals_into_one_out_do_not_both_write_there(finished: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    from mmrl.run import lock as run_lock

    out = tmp_path / "ev"
    held = run_lock.acquire(out, command="mmrl eval --out " + str(out))  # the first evaluation, still running
    try:
        rc, _, err = run_cli(capsys, *eval_args(finished / "final", out))
    finally:
        held.release()
    line = one_error_line(err)
    assert rc == 2 and f"{out} is in use by pid {os.getpid()}" in line
    assert not (out / "metrics.json").exists()


SAVE_UNDER_LIMIT = textwrap.dedent("""
    import resource, sys
    from mmrl.cli import main
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "file"), [
    (2 << 20, "model.safetensors"),  # the checkpoint's weights (4 MB) pass the limit
    (6 << 20, "trainer_state.pt"),  # the weights fit; the optimizer's state (8 MB) does not
])
def test_a_file_size_limit_hit_while_saving_is_one_line_naming_the_file(
        finished: Path, tmp_path: Path, limit: int, file: str) -> None:
    """A real ``ulimit -f`` (``RLIMIT_FSIZE`` in the child): the line names the file and the limit; the partial
    folder is gone, the run's record readable, so the run resumes once the limit is raised."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SAVE_UNDER_LIMIT, str(limit), "train", "--quiet", "--out", str(run),
                           *TINY_RUN, "train.steps=1", "train.save_every=1"],
                          check=False, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2
    assert f"/{file}: cannot be written: the file-size limit was reached (ulimit -f" in line
    assert "checkpoint-1 was not saved" in line and "--resume" in line
    assert not [p.name for p in run.iterdir() if p.name.startswith(".tmp")]
    json.loads((run / "run_state.json").read_text())


EXPORT_UNDER_LIMIT = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from mmrl.engine.checkpoint import save_model
    from mmrl.model import load_policy
    from mmrl_common.errors import MmrlError
    policy = load_policy(sys.argv[1], device="cpu")
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
    try:
        save_model(Path(sys.argv[2]), policy.model, policy.processor, None)
    except MmrlError as exc:
        print(exc)  # the last line of the output (DeepSpeed's accelerator note may come before)
""")


@pytest.mark.slow
def test_a_file_size_limit_hit_while_exporting_final_names_the_file_and_keeps_the_earlier_final(
        finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = {p.name: p.read_bytes() for p in (run / "final").iterdir()}
    proc = subprocess.run([sys.executable, "-c", EXPORT_UNDER_LIMIT, str(run / "final"), str(run / "final")],
                          check=False, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == (f"{run / '.tmp-final' / 'model.safetensors'}: cannot be written: the file-size limit was "
                           "reached (ulimit -f; raise it, e.g. `ulimit -f unlimited`); final/ was not written (its "
                           "temporary folder .tmp-final removed; the earlier final/ is kept)")
    assert {p.name: p.read_bytes() for p in (run / "final").iterdir()} == before
    assert not (run / ".tmp-final").exists()


def test_a_full_disk_names_the_file_being_written(tmp_path: Path) -> None:
    """ENOSPC (or EDQUOT), raised as an OSError or in a library's own words, names the file written last."""
    from mmrl.engine.checkpoint import room_to_write

    folder = tmp_path / ".tmp-checkpoint-3"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for exc in (OSError(errno.ENOSPC, "No space left on device"),
                RuntimeError("I/O error: No space left on device (os error 28)")):
        (folder / "model.safetensors").write_bytes(b"x")
        with pytest.raises(MmrlError) as got, room_to_write(folder, "checkpoint-3 was not saved"):
            raise exc
        assert str(got.value) == (f"{folder / 'model.safetensors'}: cannot be written: the disk is full (free some "
                                  "space); checkpoint-3 was not saved")
    with pytest.raises(ValueError), room_to_write(folder, "checkpoint-3 was not saved"):  # not a lack of room
        raise ValueError("a bug")


@pytest.mark.slow
def test_a_cut_settings_file_in_final_is_one_line_on_eval(finished: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """``mmrl_eval.json`` (the settings the model was trained with) is read before the model: cut, it is named."""
    final = tmp_path / "final"
    shutil.copytree(finished / "final", final)
    cut(final / "mmrl_eval.json")
    rc, _, err = run_cli(capsys, *eval_args(final, tmp_path / "ev"))
    line = one_error_line(err)
    assert rc == 2 and str(final / "mmrl_eval.json") in line and "--recipe-settings" in line
