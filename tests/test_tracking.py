"""``train.report_to``: a few real training steps logged to TensorBoard and to an offline wandb run, read back
from the files those libraries wrote (TensorBoard's EventAccumulator; the offline run's ``.wandb`` records
parsed with wandb's own protobuf messages), the missing-package error, wandb's offline choice, and the
rendered prompt of a logged rollout."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from PIL import Image
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl_common.errors import ConfigError


def _train(tmp_path: Path, *overrides: str) -> Path:
    from mmrl.run import train

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, *overrides])
    train(cfg, run_dir=tmp_path / "run", show_progress=False)
    return tmp_path / "run"


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: wandb's leveldb-log framing (7-byte file header, 32 KiB blocks, each
    chunk ``crc32 | length | type``) around ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL chunk, or the LAST of several
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


@pytest.mark.slow
def test_tensorboard_event_files_hold_every_step(tmp_path: Path, module_cache: None) -> None:  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _train(tmp_path, "train.report_to=[tensorboard]")
    rows = rl_rows(run)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key in ("reward", "loss"):
        events = acc.Scalars(f"rl/{key}")
        assert [e.step for e in events] == [r["step"] for r in rows] == [1, 2]
        assert [e.value for e in events] == pytest.approx([r[key] for r in rows], rel=1e-6)
    text = acc.Tensors("rl/rollouts/text_summary")  # the sample rollouts, as TensorBoard's text plugin shows them
    assert [t.step for t in text] == [1, 2]
    table = text[0].tensor_proto.string_val[0].decode()
    logged = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert table.startswith("| id | prompt | completion |")
    assert str(logged[0]["id"]) in table and logged[0]["turns"][0].replace("\n", "<br>")[:20] in table


@pytest.mark.slow
def test_wandb_offline_run_holds_every_step(tmp_path: Path, module_cache: None,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = _train(tmp_path, "train.report_to=[wandb]")
    import wandb

    # run.finish() returns before wandb's service has closed the .wandb file (its last partial block is still in
    # memory; finish only informs the service); teardown waits for the service to exit, as the CLI's exit does.
    # Without it a loaded machine could read a file that lacked the last rows.
    wandb.teardown()
    rows = rl_rows(run)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history = []
    for rec in _wandb_records(files[0]):
        if rec.WhichOneof("record_type") == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    scalars = [h for h in history if "rl/reward" in h]
    assert [h["rl/step"] for h in scalars] == [1, 2]
    assert [h["rl/reward"] for h in scalars] == pytest.approx([r["reward"] for r in rows], rel=1e-6)
    assert [h["rl/loss"] for h in scalars] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    tables = [h for h in history if h.get("rl/rollouts/_type") == "table-file"]
    assert [h["rl/step"] for h in tables] == [1, 2]
    table = json.loads((files[0].parent / "files" / tables[0]["rl/rollouts/path"]).read_text())
    logged = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert table["columns"][:3] == ["id", "prompt", "completion"]
    assert [row[0] for row in table["data"]] == [str(r["id"]) for r in logged if r["step"] == 1]
    assert table["data"][0][2] == "\n".join(logged[0]["turns"])


def test_wandb_is_offline_without_an_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.engine.run_log import wandb_mode

    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / ".netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode()[0] == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the user's choice wins
    assert wandb_mode() == ("disabled", "WANDB_MODE")


def test_tracker_errors_name_the_key_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    with pytest.raises(ConfigError, match=r"train.report_to: unknown tracker 'tensorbord'; did you mean 'tensorboard'"):
        load_run_config("video-qa", overrides=["train.report_to=[tensorbord]"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"train.report_to: wandb needs the wandb package: pip install 'mmrl\[wandb\]'"):
        load_run_config("video-qa", overrides=["train.report_to=wandb"])
    assert load_run_config("video-qa").train.report_to == []  # default: no tracker


def test_prompt_text_shows_the_rendered_prompt_with_counted_placeholders(tmp_path: Path) -> None:
    from mmrl.model import MediaInput, load_policy
    from mmrl.toy.tiny_models import make_tiny

    policy = load_policy(make_tiny("qwen2_5_vl", tmp_path / "m", seed=0), device="cpu")
    content = [{"type": "image"}, {"type": "text", "text": "What colour is the ball?"}]
    seq = policy.encode(policy.render([{"role": "user", "content": content}]),
                        [MediaInput(key="a", kind="image", data=Image.new("RGB", (56, 84), "red"))])
    n_pad = seq.ids.count(policy.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    full = seq.extend(policy.tokenizer.encode("<answer>B</answer>"), trained=True)
    text = policy.prompt_text(full)
    assert n_pad > 1 and f"<|vision_start|><|image_pad|>×{n_pad}<|vision_end|>" in text
    assert "What colour is the ball?" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert "<answer>" not in text  # the completion is not part of the prompt
