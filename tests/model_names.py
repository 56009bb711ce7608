"""Shared by the tests of model folders' tensor names: the names a folder's safetensors hold, and the names
transformers' own ``save_pretrained`` writes for a model of the same family (the published checkpoints'
names: ``model.layers.*`` and ``visual.*`` for Qwen2-VL and Qwen2.5-VL)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from safetensors import safe_open

SKIP = {"reference.safetensors", "reference_adapter.safetensors", "adapter_model.safetensors"}


def saved_names(folder: Path) -> set[str]:
    """The tensor names of the model weights in ``folder`` (every ``*.safetensors`` but a KL reference's)."""
    names: set[str] = set()
    for f in sorted(Path(folder).glob("*.safetensors")):
        if f.name not in SKIP:
            with safe_open(str(f), "pt") as handle:
                names.update(handle.keys())
    assert names, f"{folder}: no model weights"
    return names


@functools.cache
def _reference_names(config_json: str) -> frozenset[str]:
    from transformers import AutoConfig, AutoModelForImageTextToText

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(config_json)
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp))
        model.save_pretrained(Path(tmp) / "plain")
        return frozenset(saved_names(Path(tmp) / "plain"))


def reference_names(folder: Path) -> set[str]:
    """What transformers writes for a plain model built from ``folder``'s config."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return set(_reference_names(json.dumps(config, sort_keys=True)))


def assert_published_names(*folders: Path) -> None:
    """Each folder's weights are named as transformers names the family's own checkpoints."""
    for folder in folders:
        got, want = saved_names(folder), reference_names(folder)
        assert got == want, (f"{folder}: tensor names differ from the published checkpoint's: "
                             f"{sorted(got - want)[:3]} written, {sorted(want - got)[:3]} expected")
