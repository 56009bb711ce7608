"""How different the completions of one prompt are from each other (trajectory diversity, MMR1's TDS).

Every measure takes a group of completions as token-id lists (any hashable tokens; unpadded: the tokens the
policy produced) and returns a number in [0, 1], higher = more diverse:

* ``self_bleu``: ``1 - self-BLEU-1..3``. Each completion's sentence BLEU against the other completions of
  the group (n-grams 1..3 weighted equally; clipped counts against the most generous reference; brevity
  penalty against the reference closest in length, the shorter on a tie; an n-gram order with no match
  counts 0.1 matches, "smoothing method 1"; no unigram match at all gives 0), averaged over the group;
* ``distinct``: distinct-n, the unique n-grams of the group over all its n-grams (n = 3 by default; a group
  without any n-gram scores 0). Identical completions score 1/N, not 0: the measure counts n-grams;
* ``edit``: the mean over pairs of the Levenshtein distance (rapidfuzz) divided by the longer length (two
  empty completions are at distance 0).

A group of one completion has no diversity to measure: 0 for every measure. :func:`self_bleu` (the
similarity itself, without ``1 -``) is what MMR1's released code weights positively; see
:mod:`mmrl.methods.vas`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from rapidfuzz.distance import Levenshtein

from mmrl_common.errors import ConfigError

Tokens = Sequence[Hashable]

SMOOTHING_EPSILON = 0.1  # the numerator given to an n-gram order without any match ("method 1")


def ngrams(tokens: Tokens, n: int) -> Counter:
    """Counts of the ``n``-grams of ``tokens`` (as tuples)."""
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def sentence_bleu(hypothesis: Tokens, references: Sequence[Tokens], max_n: int = 3) -> float:
    """BLEU of one hypothesis against several references, n-gram orders 1..``max_n`` weighted equally.

    p_n = clipped matches / hypothesis n-grams, where an n-gram's matches are clipped at its largest count
    in any one reference; an order with no match gets ``0.1 / count`` (its count floored at 1). No unigram
    match at all (or an empty hypothesis) gives 0. BP = 1 when the hypothesis is longer than the reference
    closest in length (the shorter on a tie), else exp(1 - r / c). BLEU = BP * exp(mean_n log p_n).
    """
    if not references:
        raise ValueError("sentence_bleu needs at least one reference")
    c = len(hypothesis)
    logs = []
    for n in range(1, max_n + 1):
        hyp = ngrams(hypothesis, n)
        most: Counter = Counter()
        for ref in references:
            most |= ngrams(ref, n)  # element-wise max of the counts
        matches = sum(min(k, most[g]) for g, k in hyp.items())
        total = max(1, sum(hyp.values()))
        if matches == 0:
            if n == 1:
                return 0.0
            logs.append(math.log(SMOOTHING_EPSILON / total))
        else:
            logs.append(math.log(matches / total))
    r = min((len(ref) for ref in references), key=lambda length: (abs(length - c), length))
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(sum(logs) / max_n)


def self_bleu(group: Sequence[Tokens], max_n: int = 3) -> float:
    """Mean over the group of each completion's BLEU against the others (a similarity: 1 = all identical
    for completions of at least ``max_n`` tokens); 0 for a group of fewer than two."""
    if len(group) < 2:
        return 0.0
    return sum(sentence_bleu(g, [o for j, o in enumerate(group) if j != i], max_n)
               for i, g in enumerate(group)) / len(group)


def inverse_self_bleu(group: Sequence[Tokens], max_n: int = 3) -> float:
    """``1 - self_bleu`` (0 for a group of fewer than two)."""
    return 1.0 - self_bleu(group, max_n) if len(group) >= 2 else 0.0


def distinct_n(group: Sequence[Tokens], n: int = 3) -> float:
    """Unique ``n``-grams over all ``n``-grams of the group (0 without any n-gram or with fewer than two)."""
    if len(group) < 2:
        return 0.0
    counts: Counter = Counter()
    for g in group:
        counts.update(ngrams(g, n))
    total = sum(counts.values())
    return len(counts) / total if total else 0.0


def levenshtein(a: Tokens, b: Tokens) -> int:
    """Edit distance (insertions, deletions, substitutions of one token each): rapidfuzz's Levenshtein on the
    token sequences. rapidfuzz compares tokens by Python hash: token ids (integers below 2**61 - 1) by value,
    other tokens (words) by their 64-bit hash."""
    return Levenshtein.distance(a, b)


def normalized_edit_distance(a: Tokens, b: Tokens) -> float:
    longest = max(len(a), len(b))
    return levenshtein(a, b) / longest if longest else 0.0


def mean_pairwise(group: Sequence[Tokens], distance: Callable[[Tokens, Tokens], float]) -> float:
    """Mean of ``distance`` over the unordered pairs of the group (0 with fewer than two)."""
    pairs = [(i, j) for i in range(len(group)) for j in range(i + 1, len(group))]
    return sum(distance(group[i], group[j]) for i, j in pairs) / len(pairs) if pairs else 0.0


def edit_diversity(group: Sequence[Tokens]) -> float:
    return mean_pairwise(group, normalized_edit_distance)


DIVERSITY: dict[str, Callable[[Sequence[Tokens]], float]] = {
    "self_bleu": inverse_self_bleu,
    "distinct": distinct_n,
    "edit": edit_diversity,
}


def diversity_measure(name: str, *, setting: str = "diversity") -> Callable[[Sequence[Tokens]], float]:
    """The measure called ``name``; a :class:`ConfigError` naming ``setting`` and the choices otherwise."""
    if name not in DIVERSITY:
        raise ConfigError(f"{setting}={name!r}: unknown diversity measure; choose one of {', '.join(DIVERSITY)}")
    return DIVERSITY[name]
