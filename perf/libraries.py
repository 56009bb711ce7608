"""Hand-written code against the library that replaced it or does the same (issue 50), timed in one run.

* **edit distance**: one pair of 512-word texts (the hypothesis a noisy copy of the reference) through
  Video-R1's word edit distance: the Python O(n*m) dynamic programme mmrl had (:func:`dp_levenshtein`, kept
  here as the reference) vs rapidfuzz (:func:`rewards.video_r1_metrics.word_edit_distance`); interleaved
  repetitions, median seconds of each and the median of the per-pair ratios; both give the same distance.
* **variance filter, scoring part, 1,000-prompt pool**, 8 completions per prompt as the sampler gets them
  from the rollouts (no model here: the rollouts' tokens and answers are drawn at random, so only the
  scoring is timed):

  - VAS (``data.sampler: vas``, ``diversity: edit``): the trajectory diversity of each prompt's 8
    completions of 128-512 tokens, the 28 pairwise normalised edit distances
    (:meth:`mmrl.methods.vas.VarianceAwareSampler.score_group`);
  - Temporal-R1's ``variance_filter`` on ``ocr`` records: the ``accuracy`` reward (1 - WER) of 8
    transcriptions of 64-512 words per prompt and their variance (:func:`mmrl.methods.temporal_r1.reward_variance`).

  "before" swaps the old DP in for rapidfuzz on the same code path (:func:`old_edit_distance`). It costs
  seconds per prompt, so it is measured on the first ``before_prompts`` prompts of the pool and scaled to
  the pool (the prompts are drawn alike, so each costs the same in expectation; ``--lib-before-prompts 1000``
  measures it all); "after" is measured on the whole pool. The scores of the measured prompts agree.
* **BERTScore** on a batch of 256 (answer, reference) pairs with all-MiniLM-L6-v2 (the semantic reward's
  local model, layer 6): mmrl's :class:`rewards.semantic.BertScoreScorer` with an empty embedding cache and
  with every text cached, vs torchmetrics' ``bert_score`` given the same loaded model and tokenizer (it has no
  cache: every call encodes every text); median seconds, and the largest |F1| difference between the two, against
  torchmetrics one pair per call and against its batch call (torchmetrics 1.9.0 pairs the wrong texts in a batch
  that is not in length order; rewards/semantic.py).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from perf.pairs import median_pair_ratio

POOL = 1000
GROUP = 8


def dp_levenshtein(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The Python Levenshtein DP mmrl used before rapidfuzz (O(len(a) * len(b)))."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


@contextlib.contextmanager
def old_edit_distance() -> Iterator[None]:
    """The old DP in place of rapidfuzz wherever mmrl computes an edit distance (the 'before' code path)."""
    from data_pipelines import diversity
    from mmrl.methods import vas
    from rewards import video_r1_metrics as video_r1

    saved = diversity.levenshtein, vas.levenshtein, video_r1.word_edit_distance
    diversity.levenshtein = vas.levenshtein = video_r1.word_edit_distance = dp_levenshtein
    try:
        yield
    finally:
        diversity.levenshtein, vas.levenshtein, video_r1.word_edit_distance = saved


def _words(rng: random.Random, n: int) -> list[str]:
    vocab = [f"w{i}" for i in range(400)] + ["the", "a", "of", "STOP", "42", "left", "right"]
    return [rng.choice(vocab) for _ in range(n)]


def _noisy(rng: random.Random, seq: list[Any], rate: float, choices: Sequence[Any]) -> list[Any]:
    """``seq`` with about ``rate`` of its items deleted, substituted or followed by an insertion (new items
    drawn from ``choices``)."""
    out = []
    for x in seq:
        r = rng.random()
        if r < rate / 3:
            continue  # deletion
        out.append(rng.choice(choices) if r < 2 * rate / 3 else x)  # substitution or keep
        if rng.random() < rate / 3:
            out.append(rng.choice(choices))  # insertion
    return out


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def _repeat(fn: Callable[..., Any], times: int, *args: Any) -> Any:
    for _ in range(times):
        out = fn(*args)
    return out


def bench_edit_pair(reps: int = 5, words: int = 512) -> dict[str, Any]:
    """Old DP vs rapidfuzz on one ``words`` x ~``words`` word pair, interleaved after a warm-up."""
    from rewards.video_r1_metrics import word_edit_distance

    rng = random.Random(0)
    ref = _words(rng, words)
    hyp = _noisy(rng, ref, 0.2, ref)[:words]
    hyp += _words(rng, words - len(hyp))
    before, after = [], []
    d_old, d_new = dp_levenshtein(ref, hyp), word_edit_distance(ref, hyp)
    for _ in range(reps):
        t, d_old = _timed(dp_levenshtein, ref, hyp)
        before.append(t)
        inner = 1000  # rapidfuzz takes microseconds: time a loop of calls and divide
        t, _ = _timed(_repeat, word_edit_distance, inner, ref, hyp)
        after.append(t / inner)
    return {"words": (len(ref), len(hyp)), "before": statistics.median(before), "after": statistics.median(after),
            "ratio": median_pair_ratio(before, after), "same": d_old == d_new, "distance": d_new}


def pool(seed: int = 0) -> tuple[list[list[list[int]]], list[str], list[list[str]]]:
    """A pool of ``POOL`` prompts: each prompt's 8 completions as token ids (128-512 tokens, variations of one
    another, as a policy's samples of one prompt are) and an OCR reference with 8 transcriptions (64-512 words)."""
    rng = random.Random(seed)
    tokens, refs, answers = [], [], []
    for _ in range(POOL):
        base = [rng.randrange(32000) for _ in range(rng.randint(128, 512))]
        group = [_noisy(rng, base, rng.uniform(0.05, 0.6), range(32000))[:512]
                 for _ in range(GROUP)]
        tokens.append(group)
        ref = _words(rng, rng.randint(64, 512))
        refs.append(" ".join(ref))
        answers.append([" ".join(_noisy(rng, ref, rng.uniform(0.0, 0.5), ref))
                        for _ in range(GROUP)])
    return tokens, refs, answers


def bench_variance_filter(before_prompts: int = 10) -> list[dict[str, Any]]:
    """Scoring seconds for the ``POOL``-prompt pool: rapidfuzz on all of it, the old DP on ``before_prompts``
    prompts scaled to the pool. One row per sampler."""
    from mmrl.methods.temporal_r1 import reward_variance
    from mmrl.methods.vas import VarianceAwareSampler
    from rewards import get_reward

    tokens, refs, answers = pool()
    sampler = VarianceAwareSampler(list(range(POOL)), diversity="edit")
    passed = [1, 0, 1, 1, 0, 0, 1, 0]
    accuracy = get_reward("accuracy")

    def vas(indices: Sequence[int]) -> list[float]:
        return [sampler.score_group(passed, tokens[i])[1] for i in indices]

    def variance_filter(indices: Sequence[int]) -> list[float]:
        out = []
        for i in indices:
            scores = accuracy([f"<answer>{a}</answer>" for a in answers[i]], id=[f"p{i}"] * GROUP,
                              problem_type=["ocr"] * GROUP, options=[None] * GROUP, answer=[refs[i]] * GROUP,
                              meta=[{}] * GROUP)
            out.append(reward_variance(scores))
        return out

    k = max(1, min(int(before_prompts), POOL))
    rows = []
    for name, what, fn in (
            ("VAS edit diversity (TDS)", "8 completions of 128-512 tokens: 28 pairs", vas),
            ("variance_filter, ocr accuracy", "8 transcriptions of 64-512 words vs the reference", variance_filter)):
        fn(range(2))  # warm-up
        t_after, got_after = _timed(fn, range(POOL))
        with old_edit_distance():
            t_before, got_before = _timed(fn, range(k))
        same = max(abs(a - b) for a, b in zip(got_before, got_after[:k])) < 1e-9
        rows.append({"name": name, "what": what, "before_measured": t_before, "before_prompts": k,
                     "before": t_before * POOL / k, "after": t_after, "same": same})
    return rows


# (answer, reference) pairs of the kind the semantic reward scores: short findings against references
def bertscore_pairs(n: int = 256) -> tuple[list[str], list[str]]:
    from perf.semantic import answers_and_references

    preds, refs = answers_and_references()
    rng = random.Random(0)
    return rng.sample(preds, n), [refs[(i * 7) % len(refs)] for i in range(n)]


def bench_bertscore(reps: int = 3, n: int = 256) -> dict[str, Any]:
    """mmrl's BERTScore (empty cache, then cached) vs torchmetrics' on the same model, ``n`` pairs, batch 64."""
    import torch
    from torchmetrics.functional.text.bert import bert_score

    from rewards.semantic import BertScoreScorer, default_model_dir

    preds, refs = bertscore_pairs(n)
    ours = BertScoreScorer(default_model_dir())

    def tm(p: list[str] = preds, r: list[str] = refs) -> list[float]:
        out = bert_score(p, r, model=ours._model, user_tokenizer=ours._tok, num_layers=ours.layer,
                         max_length=128, truncation=True, batch_size=64, device="cpu")
        return [float(x) for x in out["f1"].reshape(-1)]

    def cold() -> list[float]:
        ours._cache.clear()
        return [f for _, _, f in ours.scores(preds, refs)]

    cold(), tm()  # warm-up
    times: dict[str, list[float]] = {"ours": [], "ours_cached": [], "torchmetrics": []}
    for _ in range(reps):
        t, f_ours = _timed(cold)
        times["ours"].append(t)
        t, _ = _timed(lambda: ours.scores(preds, refs))
        times["ours_cached"].append(t)
        t, f_tm = _timed(tm)
        times["torchmetrics"].append(t)
    one_by_one = [tm([p], [r])[0] for p, r in zip(preds[:16], refs[:16])]  # untimed: the numbers agree?
    return {"pairs": n, "threads": torch.get_num_threads(), **{k: statistics.median(v) for k, v in times.items()},
            "tm_over_ours": median_pair_ratio(times["torchmetrics"], times["ours"]),
            "max_f1_diff_batch": max(abs(a - b) for a, b in zip(f_ours, f_tm)),
            "max_f1_diff_pairs": max(abs(a - b) for a, b in zip(f_ours, one_by_one)),
            "pairs_differ": sum(abs(a - b) > 1e-5 for a, b in zip(f_ours, one_by_one))}


def run_libraries(reps: int = 5, before_prompts: int = 10) -> dict[str, Any]:
    return {"edit": bench_edit_pair(reps), "pool": bench_variance_filter(before_prompts),
            "bertscore": bench_bertscore(min(reps, 3))}


def print_libraries(r: dict[str, Any]) -> None:
    e = r["edit"]
    print(f"edit distance, one {e['words'][0]} x {e['words'][1]}-word pair (Video-R1 WER), median of interleaved "
          "repetitions")
    print(f"  old Python DP {e['before'] * 1e3:10.2f} ms   rapidfuzz {e['after'] * 1e6:8.1f} us   "
          f"speed-up {e['ratio']:,.0f}x   same distance: {e['same']} ({e['distance']})\n")
    print(f"variance filters, scoring part only (no rollouts), {POOL}-prompt pool x {GROUP} completions")
    head = f"{'scoring':<32} {'completions per prompt':<52} {'before (s)':>12} {'after (s)':>10} {'speed-up':>10}"
    print(head)
    print("-" * len(head))
    for row in r["pool"]:
        print(f"{row['name']:<32} {row['what']:<52} {row['before']:>12.1f} {row['after']:>10.2f} "
              f"{row['before'] / row['after']:>9,.0f}x")
    k = r["pool"][0]["before_prompts"]
    measured = ", ".join(f"{x['before_measured']:.1f} s" for x in r["pool"])
    same = all(x["same"] for x in r["pool"])
    print(f"  before: the old DP, measured on {k} prompts ({measured}) and scaled to {POOL}; after: rapidfuzz on "
          f"all {POOL}; same scores on the measured prompts: {same}\n")
    b = r["bertscore"]
    threads = f"{b['threads']} thread{'s' if b['threads'] != 1 else ''}"
    print(f"BERTScore, {b['pairs']} pairs, all-MiniLM-L6-v2 layer 6, batch 64, CPU, {threads}, median")
    print(f"  mmrl, empty cache {b['ours']:.3f} s   mmrl, cached {b['ours_cached']:.4f} s   torchmetrics "
          f"{b['torchmetrics']:.3f} s   torchmetrics / mmrl (empty cache) {b['tm_over_ours']:.2f}x")
    print(f"  largest |F1 difference| against torchmetrics one pair per call: {b['max_f1_diff_pairs']:.1e} "
          f"({b['pairs_differ']} of 16 pairs above 1e-5: a token whose best cosine is negative, which torchmetrics "
          "floors at 0 by\n  matching its zeroed special tokens); against its batch call "
          f"{b['max_f1_diff_batch']:.2f}: it scores the wrong pairs when the batch is not in length order\n"
          "  (torchmetrics 1.9.0 undoes its length sort with the permutation, not its inverse; #2728)\n")
