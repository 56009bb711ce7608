"""Checkpoints: the model in Hugging Face format (safetensors) plus the trainer state for an exact resume.

A checkpoint folder ``checkpoint-<step>/`` holds ``model.safetensors``, ``config.json``, the processor
files, and ``trainer_state.pt`` (optimizer, scheduler, the RNG states of Python, NumPy, torch and CUDA, the
sampler position, the curriculum stage, plugin states, the step; plain data and tensors, loaded with
``weights_only=True``), ``reference.safetensors`` when the KL reference differs from the run's starting
model, and ``mmrl_eval.json``: the run's prompt, generation and media settings, which ``mmrl eval --model``
uses so that a model is evaluated the way it was trained (every model folder a run writes has it: the
checkpoints, ``final/``, ``sft-model/``). It is written to a temporary folder and renamed, so a run
killed while saving never leaves a half checkpoint behind; ``latest`` names the newest complete one. Before
the rename, ``digest.json`` records each file's size and the sha256 of each 64 MiB block (every file flushed to
the disk as it is read back); a resume checks the checkpoint it starts from against it and passes over a
damaged one (a flipped bit, a cut or missing file), naming it, for the previous intact one
(:func:`latest_checkpoint`). Every
model folder names its tensors as the model family's published checkpoints do, however the run loaded and
sharded the model (:func:`mmrl.model.weights.save_pretrained`), so vLLM and transformers load it as they load the
original.

With LoRA (``model.lora``, :mod:`mmrl.model.lora`) a checkpoint holds the adapters in PEFT format
(``adapter_config.json``, ``adapter_model.safetensors``) instead of the model, and
``reference_adapter.safetensors`` when the KL reference is not the base model; ``final/`` and
``sft-model/`` hold the merged model (a plain Hugging Face folder) with the adapters in ``adapter/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.config.eval_settings import EVAL_SETTINGS_FILE, eval_settings, read_eval_settings  # noqa: F401
from mmrl.model.weights import from_published_layout, published_names, save_pretrained
from mmrl_common.file_digest import DIGEST_BLOCK, block_hashes, hash_threads, newest_file, no_room


def rng_state() -> dict[str, Any]:
    """Every RNG as plain data and tensors (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


REFERENCE_FILE = "reference.safetensors"
REFERENCE_ADAPTER_FILE = "reference_adapter.safetensors"


# ------------------------------------------------------------------------------------ content digests
DIGEST_FILE = "digest.json"


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != DIGEST_FILE)


def write_digest(folder: Path) -> dict[str, Any]:
    """``digest.json`` in ``folder``: each file's size and the sha256 of each of its 64 MiB blocks, every file
    flushed to the disk (fsync) as it is read back. Called on the complete temporary folder, before it is
    renamed (:func:`publish_checkpoint`): it covers every rank's files (optimizer shards, random states)."""
    from concurrent.futures import ThreadPoolExecutor

    files: dict[str, Any] = {}
    with ThreadPoolExecutor(hash_threads()) as pool:
        for path in _files(folder):
            size = path.stat().st_size
            files[path.relative_to(folder).as_posix()] = {"size": size, "sha256": block_hashes(path, size, pool)}
            _fsync(path)
    digest = {"format": 1, "algorithm": "sha256", "block_bytes": DIGEST_BLOCK, "files": files}
    tmp = folder / f".{DIGEST_FILE}.tmp"
    with tmp.open("w") as f:
        f.write(json.dumps(digest, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / DIGEST_FILE)
    _fsync(folder)
    return digest


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_digest(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder against its ``digest.json`` (``"model.safetensors does not match
    its digest (size 1234 != 5678)"``), None when every listed file is whole. A folder without a digest (written
    before mmrl wrote them) raises FileNotFoundError."""
    from concurrent.futures import ThreadPoolExecutor

    path = folder / DIGEST_FILE
    try:
        digest = json.loads(path.read_text())
        files = digest["files"]
        if digest.get("algorithm") != "sha256" or digest.get("block_bytes") != DIGEST_BLOCK:
            return f"{DIGEST_FILE} uses {digest.get('algorithm')} in blocks of {digest.get('block_bytes')} bytes, " \
                   f"which this mmrl does not read"
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{DIGEST_FILE} cannot be read ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
    with ThreadPoolExecutor(hash_threads()) as pool:
        for name, want in files.items():
            file = folder / name
            if not file.is_file():
                return f"{name} is missing (its digest lists it)"
            size = file.stat().st_size
            if size != want["size"]:
                return f"{name} does not match its digest (size {size} != {want['size']})"
            got = block_hashes(file, size, pool)
            bad = [i for i, (a, b) in enumerate(zip(got, want["sha256"])) if a != b]
            if bad or len(got) != len(want["sha256"]):
                i = bad[0] if bad else min(len(got), len(want["sha256"]))
                return (f"{name} does not match its digest (sha256 of bytes {i * DIGEST_BLOCK}-"
                        f"{min((i + 1) * DIGEST_BLOCK, size)} differs)")
    return None


def save_model(folder: Path, model: torch.nn.Module, processor: Any, settings: dict[str, Any] | None, *,
               weights: dict[str, torch.Tensor] | None = None,
               adapter_weights: dict[str, torch.Tensor] | None = None, publish: bool = True) -> Path:
    """A Hugging Face model folder (safetensors and processor files) plus ``mmrl_eval.json``. A model with
    LoRA adapters is written merged, with its adapters (PEFT format) in ``adapter/``. ``weights`` (and with
    LoRA ``adapter_weights``): the tensors to write where the live model does not hold them (ZeRO-3: gathered
    to rank 0 by :func:`mmrl.model.weights.stream_weights`; LoRA: merged already); None: the model's own.

    ``publish`` (``final/``, ``sft-model/``): written into ``.tmp-<name>`` beside it, its ``digest.json``
    (:func:`write_digest`) written after every other file, then renamed over ``folder`` (an earlier one replaced
    only then), so a process killed while saving leaves the earlier folder or none, never half of one; ``mmrl
    eval`` checks the digest (:func:`verify_model_folder`). A write that fails for lack of room (the file-size
    limit, a full disk) is one :class:`MmrlError` naming the file, the temporary folder removed. ``publish=False``:
    the files straight into ``folder`` (a checkpoint's temporary folder, which has its own digest)."""
    if not publish:
        _write_model(folder, model, processor, settings, weights=weights, adapter_weights=adapter_weights)
        return folder
    folder = Path(folder)
    tmp = folder.parent / f".tmp-{folder.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with room_to_write(tmp, f"{folder.name}/ was not written (its temporary folder {tmp.name} removed; "
                            f"{'the earlier ' + folder.name + '/ is kept' if folder.exists() else 'nothing else changed'})",
                       remove=True):
        _write_model(tmp, model, processor, settings, weights=weights, adapter_weights=adapter_weights)
        with writing(tmp / DIGEST_FILE):
            write_digest(tmp)
    old = folder.parent / f".old-{folder.name}"
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    tmp.rename(folder)
    _fsync(folder.parent)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _write_model(folder: Path, model: torch.nn.Module, processor: Any, settings: dict[str, Any] | None, *,
                 weights: dict[str, torch.Tensor] | None,
                 adapter_weights: dict[str, torch.Tensor] | None) -> None:
    from mmrl.model import lora

    if lora.has_lora(model):
        with writing(folder / "model.safetensors"):
            lora.merged_export(model, processor, folder, state=weights)
        with writing(folder / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS):
            lora.save_adapters(model, folder / lora.ADAPTER_DIR, state=adapter_weights)
    else:
        with writing(folder / "model.safetensors"):  # (or its shards, model-0000N-of-0000M.safetensors)
            save_pretrained(folder, model, weights)
        processor.save_pretrained(folder)
    if settings is not None:
        with writing(folder / EVAL_SETTINGS_FILE):
            (folder / EVAL_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")


@contextlib.contextmanager
def writing(file: Path) -> Iterator[None]:
    """A failure inside names ``file`` as the one being written (for :func:`room_to_write`: a library that
    writes through a temporary file, as safetensors does, leaves none to find)."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "written_file", None) is None:
            with contextlib.suppress(AttributeError, TypeError):
                exc.written_file = file
        raise


@contextlib.contextmanager
def room_to_write(folder: Path, what: str, *, remove: bool = False) -> Iterator[None]:
    """A write into ``folder`` that fails for lack of room (the file-size limit ``ulimit -f``, a full disk, a
    quota: :func:`mmrl_common.file_digest.no_room`, whatever type the library writing raised it as) becomes one
    :class:`MmrlError`: the file that could not be written (the one :func:`writing` named, else the newest in
    ``folder``), why, the fix and ``what``
    it means for the run. ``remove``: the (temporary, incomplete) folder is removed, freeing its room."""
    from mmrl_common.errors import MmrlError

    try:
        yield
    except MmrlError:
        raise
    except Exception as exc:
        file = getattr(exc, "written_file", None) or newest_file(folder)
        why = no_room(exc, file or folder)
        if why is None:
            raise
        if remove:
            shutil.rmtree(folder, ignore_errors=True)
        raise MmrlError(f"{file or folder}: cannot be written: {why}; {what}") from None


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, processor: Any,
                    state: dict[str, Any], keep: int = 2,
                    reference: torch.nn.Module | dict[str, torch.Tensor] | None = None,
                    settings: dict[str, Any] | None = None) -> Path:
    """``reference``: the KL reference, given only when it differs from the run's starting model (a
    curriculum reset it): a model, stored beside the weights as ``reference.safetensors``, or with LoRA the
    reference's adapter weights (:meth:`mmrl.model.lora.AdapterReference.stored`), stored as
    ``reference_adapter.safetensors``. ``settings``: the run's evaluation settings (:func:`eval_settings`),
    stored as ``mmrl_eval.json``. A model with LoRA adapters is stored as its adapters (PEFT format) and
    the processor."""
    tmp = start_checkpoint(run_dir, step)
    write_checkpoint(tmp, step, model, processor, state, reference=reference, settings=settings)
    return publish_checkpoint(run_dir, step, keep=keep)


def _not_saved(step: int) -> str:
    return (f"checkpoint-{step} was not saved (its temporary folder removed) and the run stopped; once there is room, "
            "continue it with --resume (from its latest checkpoint)")


def start_checkpoint(run_dir: Path, step: int) -> Path:
    """The empty temporary folder a checkpoint is written into (renamed when complete)."""
    tmp = run_dir / f".tmp-checkpoint-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def write_checkpoint(tmp: Path, step: int, model: torch.nn.Module, processor: Any, state: dict[str, Any], *,
                     reference: torch.nn.Module | dict[str, torch.Tensor] | None = None,
                     settings: dict[str, Any] | None = None,
                     weights: dict[str, torch.Tensor] | None = None) -> None:
    """The model (or its adapters), the reference when stored, and the trainer state, into ``tmp``.
    ``weights``: the model's tensors (with LoRA: the adapters') where the live model does not hold them
    (ZeRO-3, gathered to rank 0); None: the model's own."""
    from safetensors.torch import save_file
    from safetensors.torch import save_model as save_tensors

    from mmrl.model import lora

    with room_to_write(tmp, _not_saved(step), remove=True):
        if lora.has_lora(model):
            with writing(tmp / lora.ADAPTER_WEIGHTS):
                lora.save_adapters(model, tmp, state=weights)
            processor.save_pretrained(tmp)
            if settings is not None:
                (tmp / EVAL_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        else:
            save_model(tmp, model, processor, settings, weights=weights, publish=False)
        if isinstance(reference, dict):
            with writing(tmp / REFERENCE_ADAPTER_FILE):
                save_file({k: v.detach().cpu().contiguous() for k, v in reference.items()},
                          str(tmp / REFERENCE_ADAPTER_FILE))
        elif reference is not None:
            with writing(tmp / REFERENCE_FILE):
                save_tensors(reference, str(tmp / REFERENCE_FILE))
        with writing(tmp / "trainer_state.pt"):
            torch.save({**state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")


def publish_checkpoint(run_dir: Path, step: int, *, keep: int = 2) -> Path:
    """Write the complete temporary folder's digest (:func:`write_digest`), rename the folder to
    ``checkpoint-<step>``, point ``latest`` at it and drop all but the newest ``keep`` checkpoints, and any of a
    later step (left by a run that resumed from an earlier one: a damaged checkpoint it passed over)."""
    final = run_dir / f"checkpoint-{step}"
    tmp = run_dir / f".tmp-checkpoint-{step}"
    with room_to_write(tmp, _not_saved(step), remove=True), writing(tmp / DIGEST_FILE):
        write_digest(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    latest = run_dir / ".latest.tmp"
    latest.write_text(final.name + "\n")
    os.replace(latest, run_dir / "latest")
    _fsync(run_dir)
    for later in [p for p in _checkpoint_folders(run_dir) if _step(p) > step]:
        shutil.rmtree(later, ignore_errors=True)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _step(folder: Path) -> int:
    return int(folder.name.split("-")[1])


def _checkpoint_folders(run_dir: Path) -> list[Path]:
    """Every ``checkpoint-<step>`` folder, whole or not, oldest first."""
    found = [p for p in run_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    return sorted(found, key=_step)


def list_checkpoints(run_dir: Path) -> list[Path]:
    return [p for p in _checkpoint_folders(run_dir) if (p / "trainer_state.pt").is_file()]


_CHECKED: dict[Path, tuple[tuple[Any, ...], str | None]] = {}  # folder -> (its files' sizes and times, problem)
_SAID: set[tuple[str, str]] = set()  # (the folder, a line said about it): each said once per process
UNVERIFIED = "no digest: not verified"


def _say(folder: Path, line: str) -> None:
    from mmrl.engine.distributed import world

    if (str(folder), line) not in _SAID and world().is_main:
        print(line, flush=True)
    _SAID.add((str(folder), line))


def checkpoint_problem(folder: Path) -> str | None:
    """None when ``folder``'s files match its digest; :data:`UNVERIFIED` when it has none (written before mmrl
    wrote digests) but holds its trainer state; else what is wrong. Checked once per process while no file
    changes (its files' sizes and modification times)."""
    files = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())
    key = tuple(files)
    cached = _CHECKED.get(folder)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        problem = check_digest(folder)
    except FileNotFoundError:
        problem = UNVERIFIED if (folder / "trainer_state.pt").is_file() else \
            "trainer_state.pt is missing (and the folder has no digest)"
    _CHECKED[folder] = (key, problem)
    return problem


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resume starts from: the newest whose files match its digest (sizes and sha256, see
    :func:`write_digest`; hashed once per process). A damaged one is named with what is wrong and passed over
    for the previous one, saying so; one written without a digest is used as it is (``no digest: not
    verified``). None when the run has no checkpoint; :class:`MmrlError` when none is intact."""
    from mmrl_common.errors import MmrlError

    folders = _checkpoint_folders(run_dir)
    damaged: list[str] = []
    for folder in reversed(folders):
        problem = checkpoint_problem(folder)
        if problem is None or problem == UNVERIFIED:
            if problem == UNVERIFIED:
                _say(folder, f"{folder.name}: {UNVERIFIED}")
            if damaged:
                _say(folder, f"{folder.name} is intact: resuming from it, the newest intact checkpoint")
            return folder
        damaged.append(f"{folder.name}: {problem}")
        _say(folder, f"{damaged[-1]}; this checkpoint is damaged and is passed over")
    if damaged:
        raise MmrlError(f"{run_dir}: no intact checkpoint to resume from ({'; '.join(damaged)}); start a new run "
                        "(--out elsewhere, --model a model folder), or move the checkpoint-* folders out of this "
                        "one to redo its RL steps from the start")
    return None


def verify_model_folder(folder: str | Path) -> None:
    """A model folder mmrl wrote (``final/``, ``sft-model/``, a checkpoint: it carries ``digest.json``) checked
    against its digest before it is loaded; a cut, missing or changed file raises :class:`MmrlError` naming the
    folder, the file and what to do. A folder without a digest (a Hugging Face model, one written before mmrl
    wrote digests) is not checked. Hashed once per process while its files stay the same."""
    from mmrl_common.errors import MmrlError

    folder = Path(folder)
    if not (folder / DIGEST_FILE).is_file():
        return
    problem = checkpoint_problem(folder)
    if problem is not None and problem != UNVERIFIED:
        raise MmrlError(f"{folder}: {problem}: this model folder is damaged (a write cut short, a copy that did "
                        "not finish, a flipped bit) and is not loaded; copy or export it again (a run's latest "
                        "checkpoint-*/ holds the model too), or give another --model")


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state on the CPU (the optimizer moves its tensors to the parameters' device); plain data
    and tensors only, no pickled objects. An empty, truncated or foreign file raises :class:`MmrlError`
    naming it."""
    import pickle

    from mmrl_common.errors import MmrlError

    path = checkpoint / "trainer_state.pt"
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower() and path.is_file() and path.stat().st_size > 0:
            found = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln or "Unsupported" in ln), "")
            raise MmrlError(f"{path} holds pickled Python objects ({found[:160] or 'not tensors and plain data'}), "
                            "which mmrl refuses to load: loading them could run code. mmrl writes only tensors and "
                            "plain data there, so this file was not written by mmrl's checkpointing (replaced or "
                            f"planted); resume from an earlier checkpoint-* (move {checkpoint.name} out of the run "
                            "folder) or from a checkpoint you trust") from exc
        raise _damaged(path, checkpoint, exc) from exc
    except (RuntimeError, EOFError, ValueError) as exc:
        raise _damaged(path, checkpoint, exc) from exc


def _damaged(path: Path, checkpoint: Path, exc: BaseException) -> Exception:
    """The error of a trainer state that cannot be read: empty, cut or garbled."""
    from mmrl_common.errors import MmrlError

    size = path.stat().st_size if path.is_file() else None
    what = "is empty (0 bytes)" if size == 0 else f"cannot be read ({str(exc).splitlines()[0][:200]})"
    return MmrlError(f"{path} {what}: this checkpoint is damaged (a write cut short, a full disk?); resume "
                     f"from an earlier checkpoint-* (move {checkpoint.name} out of the run folder)")


def load_reference(model: torch.nn.Module, checkpoint: Path) -> bool:
    """Load a stored reference model into ``model``; False when the checkpoint holds none."""
    from safetensors.torch import load_model

    path = checkpoint / REFERENCE_FILE
    if not path.is_file():
        return False
    try:
        load_model(model, str(path), device=str(next(model.parameters()).device))
    except RuntimeError as exc:
        if "size mismatch" not in str(exc):
            raise
        raise another_model(checkpoint, model, f"{REFERENCE_FILE}: {str(exc).splitlines()[-1].strip()}") from None
    return True


def load_reference_adapters(checkpoint: Path) -> dict[str, torch.Tensor] | None:
    """The stored adapter weights of a LoRA run's KL reference (empty: the base model); None when the
    checkpoint holds none."""
    from safetensors.torch import load_file

    path = checkpoint / REFERENCE_ADAPTER_FILE
    return load_file(str(path)) if path.is_file() else None


def load_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint's weights into an existing model, exactly (no dtype round trip). A model with LoRA
    adapters gets the adapters of the folder (a checkpoint's own, or ``adapter/`` of a merged export)."""
    from safetensors.torch import load_file

    from mmrl.model import lora

    if lora.has_lora(model):
        try:
            lora.load_adapters(model, checkpoint)
        except RuntimeError as exc:  # torch's size mismatch of the adapters: another model
            if "size mismatch" not in str(exc):
                raise
            raise another_model(checkpoint, model, str(exc).splitlines()[-1].strip()) from None
        return
    if lora.adapter_folder(checkpoint) is not None and not (checkpoint / "config.json").is_file():
        raise RuntimeError(f"{checkpoint}: holds LoRA adapters only; this run has model.lora off")
    skip = {REFERENCE_FILE, REFERENCE_ADAPTER_FILE, lora.ADAPTER_WEIGHTS}
    files = sorted(f for f in checkpoint.glob("*.safetensors") if f.name not in skip)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    own = set(model.state_dict())
    if not set(state) <= own:  # under the published names (or the names ZeRO-3 runs wrote before): map them back
        names = sorted(own)
        back = {saved: name for legacy in (True, False)  # the published names win where both give one
                for name, saved in published_names(model, names, legacy=legacy).items()}
        state = {back.get(k, k): v for k, v in state.items()}
    state = from_published_layout(model, state)
    own_state = model.state_dict()
    wrong = [k for k, v in state.items() if k in own_state and tuple(v.shape) != tuple(own_state[k].shape)]
    if wrong:
        k = wrong[0]
        raise another_model(checkpoint, model, f"{k} is {list(state[k].shape)} there and "
                                               f"{list(own_state[k].shape)} in the model ({len(wrong)} of {len(state)} "
                                               "tensors differ)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k or "embed_tokens" in k}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"{checkpoint}: weights do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]})")


def another_model(checkpoint: Path, model: torch.nn.Module, detail: str) -> Exception:
    """The error of a checkpoint whose weights belong to another model than the one loaded (a resume with
    another ``--model``, or another model put in the run's model folder): one line, both models in words."""
    from mmrl.model.folder import describe_config, describe_model
    from mmrl_common.errors import MmrlError

    config = getattr(model, "config", None)
    loaded = describe_config(config.to_dict()) if hasattr(config, "to_dict") else type(model).__name__
    if (checkpoint / "config.json").is_file():
        theirs = describe_model(checkpoint)
    else:  # LoRA: adapters only; the base model they were saved over
        from mmrl.model import adapter_base

        try:
            theirs = describe_model(adapter_base(checkpoint))
        except (MmrlError, OSError, ValueError):
            theirs = "unknown (a LoRA checkpoint whose base model is not found)"
    return MmrlError(f"{checkpoint} holds the weights of another model than the one loaded: {detail}; the "
                     f"checkpoint's model: {theirs}, the model loaded: {loaded}. Resume with the model the run started "
                     f"with (model.path in the run's inputs.json), or start a new run (another --out) from this model")
