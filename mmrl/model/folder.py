"""A model folder read without torch: the cheap checks before anything loads (:func:`check_model_dir`), the
base model of a LoRA checkpoint (:func:`adapter_base`) and the model in words from its ``config.json``
(``qwen2_5_vl (hidden 64, 2 layers, vocab 151936)``), as an error or a run's record says it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl_common.errors import MmrlError


def check_model_dir(path: str | Path) -> Path:
    """Cheap checks of a model folder (before any data is built or loaded); errors name the folder."""
    path = Path(path)
    if not path.is_dir():
        raise MmrlError(f"model folder not found: {path}")
    if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        adapter_base(path)  # a LoRA checkpoint: its base model must be found
        check_weight_files(path)
        return path
    if not (path / "config.json").is_file():
        raise MmrlError(f"{path}: no config.json; expected a Hugging Face model folder (save_pretrained)")
    check_family(path)
    check_weight_files(path)
    has_processor = any((path / name).is_file() for name in (
        "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"))
    if not has_processor:
        raise MmrlError(
            f"{path}: no processor (preprocessor_config.json or processor_config.json); "
            "save the processor beside the model with processor.save_pretrained(folder)")
    return path


def weight_file_problem(file: Path) -> str | None:
    """Why ``file`` (a ``.safetensors`` file) cannot be loaded whole, from its header alone, or None: the format
    is an 8-byte little-endian header length, a JSON header giving each tensor's ``data_offsets`` into the bytes
    after it, and those bytes, which the tensors must cover exactly (the ``safetensors`` loader's own rule)."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or 8 + n > size:
                return f"{size} bytes: shorter than its header says"
            header = json.loads(f.read(n))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError:
        return "its header is not valid JSON"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2]
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"{size} bytes where its header describes {want}"
    return None


def check_weight_files(path: Path) -> None:
    """The folder's safetensors weights are whole (:func:`weight_file_problem`) and a sharded model's every shard
    is there, checked from the files' headers (a cut copy or download of a folder without mmrl's digest.json:
    one line, not the loader's traceback)."""
    index = path / "model.safetensors.index.json"
    files = sorted(path.glob("*.safetensors"))
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            raise MmrlError(f"{index}: unreadable or not a safetensors index (cut short?); copy or download the "
                            "model folder again") from None
        missing = sorted(str(s) for s in shards if not (path / str(s)).is_file())
        if missing:
            raise MmrlError(f"{path}: {len(missing)} weight file(s) its model.safetensors.index.json lists are "
                            f"missing: {', '.join(missing[:4])}; copy or download the model folder again")
    for file in files:
        if why := weight_file_problem(file):
            raise MmrlError(f"{file}: the weights file is cut short or damaged ({why}); copy or download the model "
                            "folder again (or save it again)")


def check_family(path: Path) -> None:
    """The folder's ``model_type`` against the families mmrl trains (:data:`~mmrl.model.families.FAMILIES`),
    before the processor is looked for: a text-only model (Qwen2, Qwen3, Llama ...) is said to be one. An
    unreadable config.json is left to the loader, which names it."""
    from mmrl.model.families import FAMILIES

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    if not isinstance(kind, str) or kind in FAMILIES:
        return
    families = ", ".join(FAMILIES)
    if "vision_config" not in cfg:
        raise MmrlError(f"{path}: model type {kind!r} is a text-only language model (no vision tower); mmrl trains "
                        f"Qwen vision-language models ({families}): give such a folder, e.g. Qwen2.5-VL-3B-Instruct")
    raise MmrlError(f"{path}: model type {kind!r} is not a family mmrl trains ({families}); give a Qwen-VL "
                    "folder, e.g. Qwen2.5-VL-3B-Instruct")


def adapter_base(folder: Path) -> Path:
    """The base model of a LoRA checkpoint (``adapter_config.json``'s ``base_model_name_or_path``): as saved
    when it is a folder; a relative one also against the run folder, whose ``config.yaml`` names the model the
    run started from. Errors say where it looked."""
    saved = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    tried = [Path(saved)] if saved else []
    if saved and not Path(saved).is_absolute():
        tried.append(folder.parent / saved)
    run_cfg = folder.parent / "config.yaml"
    if run_cfg.is_file():
        import yaml

        start = ((yaml.safe_load(run_cfg.read_text()) or {}).get("model") or {}).get("path")
        if start:
            tried.append(Path(start) if Path(start).is_absolute() else folder.parent / start)
    for cand in tried:
        if (cand / "config.json").is_file():
            return cand.resolve()
    raise MmrlError(f"{folder}: a LoRA checkpoint whose base model was not found (base_model_name_or_path "
                    f"{saved!r}; looked in {', '.join(str(t) for t in tried) or 'nothing'}); evaluate the run's "
                    "final/ folder (the merged model), or set base_model_name_or_path in its adapter_config.json")


def describe_model(folder: str | Path) -> str:
    """A model folder in words from its ``config.json``: ``qwen2_5_vl (hidden 64, 2 layers, vocab 151936)``."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return "no readable config.json"
    return describe_config(cfg)


def describe_config(cfg: dict[str, Any]) -> str:
    """A model's ``config.json`` (as a dict) in words (:func:`describe_model`)."""
    text = cfg.get("text_config") or cfg
    parts = [f"{k} {text[key]}" for k, key in (("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
                                                ("vocab", "vocab_size")) if key in text]
    return f"{cfg.get('model_type', '?')} ({', '.join(parts)})"
