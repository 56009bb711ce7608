"""Cost of the medical rewards' semantic scorer (:mod:`rewards.semantic`) per 1000 answers.

1000 distinct short answers ("small bright lesion in the left lower lobe", ...) are scored against 50
references (a training batch repeats a few references many times). *cold*: an empty cache, every text is
encoded; *cached*: the same pairs again, every embedding comes from the cache (what repeated answers cost).
Both the MiniLM cosine scorer (the reward's default) and BERTScore on the same model are timed, on the CPU
with torch's current thread count. Median of ``reps`` repetitions, each with a fresh scorer for *cold*.
"""

from __future__ import annotations

import itertools
import statistics
import time

N = 1000


def answers_and_references() -> tuple[list[str], list[str]]:
    sizes = ("small", "large", "tiny", "faint", "round", "irregular", "bright", "dark")
    findings = ("lesion", "mass", "nodule", "cyst", "opacity")
    places = ("left upper lobe", "right upper lobe", "left lower lobe", "right lower lobe", "liver", "spleen",
              "left kidney", "right kidney", "brain stem", "pancreas", "bladder", "upper left", "lower right",
              "aorta", "heart", "femur", "pelvis", "stomach", "colon", "thyroid", "trachea", "spine", "skull",
              "prostate", "uterus")
    combos = [f"{s} {f} in the {p}" for s, f, p in itertools.product(sizes, findings, places)]
    return combos[:N], [combos[(i * 37) % len(combos)] for i in range(50)]


def bench_semantic(reps: int = 3) -> list[tuple[str, float, float]]:
    """``(scorer, cold seconds, cached seconds)`` per 1000 answers."""
    from rewards.semantic import BertScoreScorer, EmbeddingScorer, default_model_dir

    path = default_model_dir()
    preds, refs = answers_and_references()
    pairs_r = [refs[i % len(refs)] for i in range(N)]
    rows = []
    for name, cls in (("MiniLM cosine (semantic reward default)", EmbeddingScorer),
                      ("BERTScore F1, MiniLM tokens", BertScoreScorer)):
        cls(path).similarity(preds[:8], pairs_r[:8])  # warm-up: weights, threads, first-call caches
        cold, warm = [], []
        for _ in range(reps):
            scorer = cls(path)
            t0 = time.perf_counter()
            scorer.similarity(preds, pairs_r)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            scorer.similarity(preds, pairs_r)
            warm.append(time.perf_counter() - t0)
        rows.append((name, statistics.median(cold), statistics.median(warm)))
    return rows


def print_semantic(rows: list[tuple[str, float, float]], reps: int) -> None:
    import torch

    head = f"{'semantic scorer, per 1000 answers':<52} {'cold (s)':>11} {'cached (s)':>12}"
    print(f"semantic reward: {N} distinct answers vs 50 references, batch 64, CPU, {torch.get_num_threads()} "
          f"threads; median of {reps}\n")
    print(head)
    print("-" * len(head))
    for name, cold, warm in rows:
        print(f"{name:<52} {cold:>11.3f} {warm:>12.4f}")
    print()
