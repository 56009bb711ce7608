"""What a run was started with, beyond its settings: the content of its data files and the identity of its model.

``mmrl train`` records, in ``RUN_DIR/inputs.json`` when a run starts, a fingerprint of each data file it was
given (``data.train``/``val``/``test``: a file, a folder of files such as a ``datasets`` folder or Hub-style
shards, or a glob of shards: each file's name, size and sha256) and the model's identity (its ``config.json``'s
sha256, the tensors' names and shapes from the safetensors headers, each weight file's size and a digest of
three 64 KiB windows of it), plus the folder the run was started in. ``mmrl train --resume`` compares them with
what the paths hold now (:func:`input_changes`): a data file edited in place or another model in the same folder
is refused unless ``--force-settings``, and a path that moved (the run folder taken to another machine, the data
given at their new place) is no change when the content is the same (:func:`same_content`).

Data files are hashed whole (every byte: sha256 in 64 MiB blocks, in threads, as the checkpoints' digests are;
about 1 GB/s a core, seconds for a multi-GB file, once when a run starts and once per resume); a size and a
modification time would miss an edit that keeps both, and a copy has another time. The media files the records
name are not hashed (a video data set is many GB; the data file lists which media a record uses). The model's
weights are not hashed whole either: the headers and three windows of each weight file tell a different
architecture and, in practice, a different fine-tune apart, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

INPUTS_FILE = "inputs.json"
DATA_KEYS = ("data.train", "data.val", "data.test")
MODEL_KEY = "model.path"
PATH_KEYS = ("model.path", "data.train", "data.val", "data.test", "data.media_root", "train.deepspeed")
"""The settings that name a file or folder: ``config.yaml`` records them absolute."""


# ------------------------------------------------------------------------------------------ absolute paths
def absolute(value: str | None, key: str = "", base: str | Path | None = None) -> str | None:
    """``value`` as an absolute path (against ``base``, else the working folder); ``~`` expanded; symlinks kept,
    nothing need exist (a glob stays a glob). ``train.deepspeed`` is a path only when it names a .json file."""
    if not value or not isinstance(value, str):
        return value
    if key == "train.deepspeed" and not value.endswith(".json"):
        return value  # a preset name (zero2, zero3, ...)
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        path = os.path.join(str(base) if base else os.getcwd(), path)
    return os.path.normpath(path)


def absolute_flat(settings: dict[str, Any], base: str | Path | None = None) -> dict[str, Any]:
    """A flat ``{dotted key: value}`` view of a config with its path settings absolute (compare two configs'
    paths as files, not as spellings: ``data/x.jsonl`` and ``/work/data/x.jsonl`` are one file)."""
    return {k: absolute(v, k, base) if k in PATH_KEYS else v for k, v in settings.items()}


def absolute_paths(cfg: Any, base: str | Path | None = None) -> Any:
    """``cfg`` with every path setting (:data:`PATH_KEYS`) absolute, so that a run's ``config.yaml`` finds its
    model and data from whatever folder ``--resume`` is started in."""
    sections: dict[str, dict[str, Any]] = {}
    for key in PATH_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        new = absolute(value, key, base)
        if new != value:
            sections.setdefault(section, {})[name] = new
    return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sections.items()})


# ------------------------------------------------------------------------------------------ data fingerprints
_CACHE: dict[tuple[str, int, int, int, int], str] = {}  # (path, size, mtime, ctime, inode) -> sha256


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (the checkpoints' block hashing: 64 MiB blocks in parallel threads, then the
    sha256 of the block hashes), remembered for the process while its size, times and inode stay the same (the
    change time moves with every write and no tool sets it back)."""
    from concurrent.futures import ThreadPoolExecutor

    from mmrl_common.file_digest import block_hashes, hash_threads

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _CACHE:
        with ThreadPoolExecutor(hash_threads()) as pool:
            blocks = block_hashes(path, st.st_size, pool)
        _CACHE[key] = blocks[0] if len(blocks) == 1 else hashlib.sha256("".join(blocks).encode()).hexdigest()
    return _CACHE[key]


def _skipped(rel: Path) -> bool:
    """Files of a data folder that are not data: hidden files, and the caches ``datasets`` writes beside its own."""
    return any(part.startswith(".") for part in rel.parts) or rel.name.startswith("cache-")


def data_files(value: str) -> tuple[str, Path | None, list[Path]]:
    """What a data setting names: ``("file" | "folder" | "glob" | "missing", root, files)``. A ``PATH:SPLIT``
    form (a split of a ``datasets`` or Hub-style folder, or of a glob of shards) is the whole folder's or glob's
    (an edit of any split counts)."""
    from data_pipelines.loaders import glob_files, split_spec

    path, _split = split_spec(value)  # the loaders' reading of PATH:SPLIT
    if path.is_file():
        return "file", path.parent, [path]
    if path.is_dir():
        return "folder", path, sorted(p for p in path.rglob("*") if p.is_file() and not _skipped(p.relative_to(path)))
    if glob.has_magic(str(path)):
        files = glob_files(path)
        return "glob", Path(os.path.commonpath([str(f.parent) for f in files])) if files else None, files
    return "missing", None, []


def fingerprint(value: str) -> dict[str, Any]:
    """The content of a data setting: its kind and each file's name (relative to the folder), size and sha256."""
    kind, root, files = data_files(value)
    out: list[dict[str, Any]] = []
    for f in files:
        name = f.name if kind == "file" else f.relative_to(root).as_posix()
        out.append({"name": name, "size": f.stat().st_size, "sha256": file_sha256(f)})
    return {"path": value, "kind": kind, "files": out}


def _content(fp: dict[str, Any] | None) -> Any:
    """What two fingerprints must share to be the same data (their paths aside; a single file's name aside)."""
    if not fp:
        return None
    files = fp.get("files") or []
    if fp.get("kind") == "file":
        return [(f["size"], f["sha256"]) for f in files]
    return [(f["name"], f["size"], f["sha256"]) for f in files]


def data_difference(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How ``now``'s content differs from ``before``'s, in words (None: the same)."""
    if _content(before) == _content(now):
        return None
    if now.get("kind") == "missing":
        return "is gone"
    old = {f["name"]: f for f in before.get("files") or []}
    new = {f["name"]: f for f in now.get("files") or []}
    if before.get("kind") == "file" and now.get("kind") == "file":
        (a,), (b,) = old.values(), new.values()
        size = f"size {a['size']} -> {b['size']} bytes" if a["size"] != b["size"] else f"same size ({a['size']} bytes)"
        return f"its content changed ({size}, sha256 {a['sha256'][:12]}... -> {b['sha256'][:12]}...)"
    said = [f"{n} removed" for n in old if n not in new] + [f"{n} added" for n in new if n not in old]
    said += [f"{n} changed" for n in old if n in new and (old[n]["size"], old[n]["sha256"]) != (new[n]["size"],
                                                                                               new[n]["sha256"])]
    return f"its files changed ({', '.join(said[:4])}{' ...' if len(said) > 4 else ''})"


# ------------------------------------------------------------------------------------------ model identity
WINDOW = 64 << 10


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)) if 0 < n < 1 << 28 else {}


def _windows_digest(path: Path) -> str:
    """The sha256 of the first, middle and last 64 KiB of a file, with its size."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for offset in sorted({0, max(0, size // 2 - WINDOW // 2), max(0, size - WINDOW)}):
            f.seek(offset)
            h.update(f.read(WINDOW))
    return h.hexdigest()


def model_identity(model_dir: str | Path) -> dict[str, Any]:
    """A model folder's identity: its architecture in words, ``config.json``'s sha256, the tensors' shapes (a
    digest and the parameter count) and a digest of each weight file's size and three windows of its bytes."""
    from mmrl.model.folder import describe_model

    folder = Path(model_dir)
    config = folder / "config.json"
    shapes: dict[str, list[int]] = {}
    windows = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        for name, meta in _safetensors_header(f).items():
            if name != "__metadata__" and isinstance(meta, dict):
                shapes[name] = list(meta.get("shape") or [])
        windows.update(f"{f.name}:{_windows_digest(f)}".encode())
    shape_text = json.dumps(sorted(shapes.items()))
    params = sum(_numel(s) for s in shapes.values())
    return {"path": str(folder), "architecture": describe_model(folder), "parameters": params,
            "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
            "shapes_sha256": hashlib.sha256(shape_text.encode()).hexdigest(), "weights_sha256": windows.hexdigest()}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def model_difference(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How the model now differs from the one the run started with, in words (None: the same)."""
    if before.get("shapes_sha256") != now.get("shapes_sha256"):
        return (f"another architecture: {now['architecture']}, {now['parameters']:,} parameters now; the run "
                f"started with {before.get('architecture')}, {before.get('parameters', 0):,} parameters")
    if before.get("config_sha256") != now.get("config_sha256"):
        return "its config.json changed"
    if before.get("weights_sha256") != now.get("weights_sha256"):
        return f"other weights ({now['architecture']}, the same shapes)"
    return None


# ------------------------------------------------------------------------------------------ the record
def user_data(cfg: Any) -> dict[str, str]:
    """The data settings the user gave (the toy world's files are made from the settings: they need none)."""
    return {key: getattr(cfg.data, key.split(".")[1]) for key in DATA_KEYS if getattr(cfg.data, key.split(".")[1])}


def record_inputs(run_dir: Path, cfg: Any, model_dir: str | Path) -> dict[str, Any]:
    """Write ``inputs.json``: the folder the run was started in (kept from the first session), each user data
    file's fingerprint and the model's identity now (atomically; rank 0 calls it, at every start and resume)."""
    record = {"started_in": (read_inputs(run_dir) or {}).get("started_in") or os.getcwd(), "data": {k: fingerprint(v) for k, v in user_data(cfg).items()},
              "model": model_identity(model_dir)}
    from mmrl_common.file_digest import write_atomic

    write_atomic(run_dir / INPUTS_FILE, json.dumps(record, indent=1) + "\n")
    return record


def read_inputs(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``inputs.json`` (None for a run started before mmrl recorded one). An unreadable, empty, cut or
    garbled one raises :class:`MmrlError` naming it: taking it for none would turn the resume's data check off."""
    from mmrl_common.errors import MmrlError
    from mmrl_common.json_file import read_json_mapping

    path = Path(run_dir) / INPUTS_FILE
    if not path.exists():
        return None
    data, why = read_json_mapping(path)
    if why is not None:
        raise MmrlError(f"{path} {why}: it records the data files and model the run started with, which --resume "
                        "checks; nothing was changed. Put back a good copy, or delete it to resume without that "
                        "check (the next session records the data and model it starts with)")
    return data


def same_content(run_dir: Path, key: str, path: str | None) -> bool:
    """Whether ``path`` holds the very data (``data.*``) or model (``model.path``) the run started with, whatever
    its path (a run folder moved to another machine, the data given at their new place)."""
    inputs = read_inputs(run_dir)
    if not inputs or not path:
        return False
    if key == MODEL_KEY:
        return bool(inputs.get("model")) and Path(path).is_dir() and \
            model_difference(inputs["model"], model_identity(path)) is None
    before = (inputs.get("data") or {}).get(key)
    return before is not None and data_difference(before, fingerprint(path)) is None


def input_changes(run_dir: Path, cfg: Any) -> list[str]:
    """What a resume with ``cfg`` would read differently from what the run started with, for each data setting
    and the model whose path is the one recorded (a changed path is a settings difference:
    :func:`mmrl.run.settings_differences`): ``data.train /x/train.jsonl: its content changed (...)``."""
    inputs = read_inputs(run_dir)
    if not inputs:
        return []
    out = []
    now = user_data(cfg)
    for key, before in (inputs.get("data") or {}).items():
        if now.get(key) != before.get("path"):
            continue
        why = data_difference(before, fingerprint(now[key]))
        if why:
            out.append(f"{key} {now[key]}: {why} since the run started")
    model = inputs.get("model")
    if model and cfg.model.path and str(cfg.model.path) == model.get("path") and Path(cfg.model.path).is_dir():
        why = model_difference(model, model_identity(cfg.model.path))
        if why:
            out.append(f"model.path {cfg.model.path}: {why}")
    return out


def architecture_change(run_dir: Path, cfg: Any) -> str | None:
    """Why the run's checkpoints cannot load into ``cfg``'s model: its tensors' shapes are not those of the model
    the run started with (``inputs.json``), in words; None when they are, or nothing was recorded."""
    model = (read_inputs(run_dir) or {}).get("model")
    if not model or not cfg.model.path or not Path(cfg.model.path).is_dir():
        return None
    now = model_identity(cfg.model.path)
    if now["shapes_sha256"] == model.get("shapes_sha256"):
        return None
    return (f"model.path {cfg.model.path} holds {now['architecture']}, {now['parameters']:,} parameters; the run's "
            f"checkpoints hold {model.get('architecture')}, {model.get('parameters', 0):,} parameters (the model it "
            f"started with: {model.get('path')})")


def import_from_start_folder(run_dir: Path) -> None:
    """A resume started in another folder imports what the run's first session imported from its working folder
    (a ``module.function`` reward, an ``imports:`` module): that folder (``inputs.json``'s ``started_in``) goes
    last on the import path."""
    import sys

    started = (read_inputs(run_dir) or {}).get("started_in")
    if started and Path(started).is_dir() and started not in sys.path:
        sys.path.append(started)
