"""The released code's reasoning-trigger words: ``count_mode: triggers`` counts a trigger word followed by a
window of high entropy (:func:`rewards.entropy.hwe_windows`).

:data:`ARES_TRIGGERS` is shawn0728/ARES ``data/crucial_token_final_version.json`` (174 words, in its order;
Apache-2.0), the set ``verl/workers/rollout/vllm_rollout_spmd.py`` loads for every rollout batch; it is the
``ares`` plug-in's default ``triggers``. The code matches a token's text with leading ``Ġ``/``▁`` removed,
stripped and lower-cased (``normalize_token``), as :func:`rewards.entropy.normalize_word` does. Both compare one
token at a time, so a word the tokenizer splits counts only where its first piece is itself in the list.
"""

from __future__ import annotations

ARES_TRIGGERS: tuple[str, ...] = (
    "clarify", "realize", "initially", "reconsider", "explore", "describe", "unless", "whereas", "explain",
    "rather", "possibly", "according", "infer", "evaluates", "indicating", "besides", "recap", "inferred",
    "justify", "actually", "reflect", "thereby", "especially", "presumably", "observe", "derive", "meanwhile",
    "validate", "balancing", "begin", "if", "albeit", "important", "leads", "rational", "let", "clue", "since",
    "consider", "though", "reasoned", "definitely", "implication", "unclear", "therefore", "reason", "resolve",
    "solve", "uncertainty", "critical", "instead", "assume", "explanation", "further", "elaborate", "next",
    "no", "technically", "thinking", "consequence", "moreover", "recalling", "equivalence", "structure",
    "insight", "neither", "acknowledging", "alternatively", "indeed", "hence", "perhaps", "uncertain",
    "somehow", "ascertain", "simultaneously", "analogy", "conject", "challenging", "hints", "extend", "proof",
    "speculation", "apparently", "crucial", "specifically", "explains", "contradict", "reflecting", "logically",
    "clearly", "excluding", "surprising", "suggest", "now", "alternative", "otherwise", "difference", "hint",
    "recall", "explained", "anyway", "assumptions", "think", "visualization", "emphasizing", "converge",
    "assumes", "depends", "implies", "but", "should", "however", "interpret", "decide", "indicates", "although",
    "choose", "analyzing", "backtrack", "unsure", "honestly", "yet", "suggesting", "conflicts", "strategy",
    "rethink", "reasoning", "thought", "caused", "cause", "remember", "considering", "reconcile", "unlikely",
    "reflection", "suggests", "until", "hypothesis", "because", "hypothetical", "reject", "revisit",
    "consequently", "either", "analysis", "when", "eliminate", "thus", "why", "conclude", "recognizing",
    "implied", "interpreting", "try", "denote", "sometimes", "imply", "puzzle", "conversely", "maybe",
    "suppose", "expectation", "realistically", "likely", "logic", "solving", "assuming", "whether",
    "discrepancy", "hmm", "wait", "guess", "seems", "imagine",
)
