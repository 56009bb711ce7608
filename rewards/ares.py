"""ARES (arXiv 2510.08457): difficulty buckets, entropy/length shaping of the reward, dynamic per-bucket KL.

Turn it on with ``imports: [mmrl.methods.ares]`` and ``plugins: {ares: {...}}`` (``configs/ares.yaml``); it needs
``rollout.record_entropies: true`` (and ``rollout.record_logprobs: true`` for the dynamic KL). Each round of
rollouts (plug-in hook ``after_rewards``):

1. **Window entropy and HWE count** (:mod:`rewards.entropy`): every response's token entropies, window
   entropies over ``window`` tokens (4), the threshold tau (per-response ``quantile`` 0.95 of the window
   entropies, batch ``threshold_aggregate`` mean or median, optional EMA ``threshold_ema``), and the HWE count
   ``N_HE`` per response (``count_mode``: ``windows`` = every window above tau, the paper; ``triggers`` = a
   word of ``triggers`` -- by default the released code's 174 (:mod:`mmrl.methods.ares.triggers`) -- followed
   by a high window, the released code).
2. **Difficulty bucket** of every prompt from its group's mean ``accuracy_component``: easy >= 2/3, medium
   >= 1/3, else hard (the released code's cut-offs); a response is correct when its accuracy >= ``correct_at``.
3. **Shaping** (``shaping``), added to the total reward times ``shaping_weight`` and logged as the reward
   component ``ares_shaping``; ``Delta = N_HE - target_d``:

   * ``code`` -- the released code's Huber/sigmoid form (:func:`code_shaping`): target_d =
     round(``target_scale`` * bucket mean N_HE), margin m = max(1, f_d * max(target, 1)), cap = alpha_d * s_d;
     easy/medium correct answers pay a capped Huber penalty past the margin (easy: above only, medium: both
     sides), incorrect easy/medium ones get a sigmoid bonus scaled 0.6/0.8, hard answers get a sigmoid bonus
     growing with Delta (a correct hard answer far below the target pays a half penalty instead).
     alpha_d starts at 0.5 and moves by 0.05 * (mean - target) (hard: target - mean), clipped to [0, 2].
   * ``paper`` -- the closed form of the paper's summaries (:func:`paper_shaping`): only incorrect answers pay
     ``lambda_d * g_d(Delta)`` (g_easy = max(0, Delta), g_medium = |Delta|, g_hard = max(0, -Delta)), with
     ``lambda_d = max(0, sign_d * (E[N_HE|d] - target_d)) / (Var[N_HE|d] + eps)`` (sign +1 easy, -1 hard,
     |.| medium: the bucket as a whole sits on the side the shaping opposes) and the penalty capped at
     ``paper_cap``. The summaries set target_d to the bucket's batch mean, which makes lambda_d identically 0;
     we take the released code's (unused) alternative target min + c_d * (max - min) of the bucket's counts,
     c = ``paper_target`` (0.35 / 0.5 / 0.65).
   * ``none`` -- no shaping: the plug-in only measures (buckets, entropies, lengths), for the plain arm.
   * a mapping ``{easy: F, medium: F, hard: F}`` -- a form per bucket. A group is all in one bucket and its
     advantages are normalised within it, so each bucket's form acts on its own groups. The two forms push
     through different answers: the code's easy rule penalises the *correct* answers that over-explore (most
     of an easy group), the paper's only the incorrect ones (few there); the paper's hard rule penalises the
     *incorrect* answers that explore less than the target (most of a hard group), while the code's gives
     every hard answer a bonus that differs by at most ``0.3 * cap``. Both recipes
     (``configs/ares.yaml``, ``configs/ares-paper.yaml``) use ``code`` everywhere: the paper's own formula is
     not public (its full text was unavailable; the ``paper`` form is reconstructed from secondary
     summaries, and taken literally its lambda_d is 0), so the released code is the one published source
     of the shaping the authors ran. The toy comparison (``configs/compare/ares.yaml``) takes each bucket's
     stronger lever on the toy: ``{easy: code, medium: code, hard: paper}``.

   Unlike the released code, the shaping is computed on every round's rewards before dynamic sampling and
   the advantages see it (the code's online filter skips it, a bug we do not copy).
4. **Dynamic KL** (``after_advantages``): ``seq_kl_weights`` times the bucket's beta_d (``dynamic_kl``), and
   ``token_kl_weights`` times ``hwe_kl_rho`` (< 1 relaxes the KL, the paper's; 1 = off, the code's: its
   ``dp_actor.py`` "second-chance" relaxation reads a ``reasoning_soft_cost`` that its ``update_policy`` never
   passes, so it never acts) on the tokens inside validated HWE windows -- both reach the KL term of the loss,
   which needs ``grpo.kl_coef > 0``. After the update the controller (:class:`BucketKLController`, the released
   code's ``dp_actor.py`` cadence) moves beta_d: the plug-in feeds it one call per ``kl_call_rows`` rows (8: the
   code's one row per call on each of 8 GPUs) of each optimizer mini-batch, every PPO epoch -- not per memory
   micro-batch, so ``train.micro_batch_size`` leaves it as it is -- with each bucket's mean per-sequence KL (the
   engine's estimator between the rollout log-probs and the reference; the code measures the current policy inside
   its update, the same at the first micro-batch); per bucket an EMA (``kl_ema`` 0.97) of that KL, error e = KL_ema
   / target_d - 1, no update inside the dead zone ``kl_deadzone`` (0.02), and only every ``kl_update_every`` (100)
   calls: e_ema = EMA (``kl_err_ema`` 0.97, the code's same decay; from 0) of e, ``log beta_d += kl_step (0.05) *
   clip(e_ema, +-kl_err_clip 0.2)``, beta in [1e-4, 1e2], starting at 1; targets ``kl_target`` 0.01 for every
   bucket -- on the scale of the model's KL to its reference (the code's, for lr 1e-6 on 7B models).
5. **When to explore** (``branching``, the paper's HWE trigger, not in the code; :mod:`mmrl.methods.ares`):
   each group is ``branch_roots`` full rollouts, then branches re-sampled from the high-window-entropy
   points of those rollouts (:func:`rewards.entropy.branch_points`) up to the group size.
6. **Adaptive cold start** (``sft.target: adaptive_reasoning``): trace length by difficulty
   (:func:`adacs_target_length`).

**The two recipes.** ``configs/ares.yaml`` (``--task ares``) is the released code's method, which produced
the published checkpoints: trigger-word counts, tau the EMA 0.99 of the batch median, plain groups of rollouts,
no KL relaxation (``count_mode: triggers``, ``threshold_aggregate: median``, ``threshold_ema: 0.99``,
``branching: false``, ``hwe_kl_rho: 1``), the code's shaping and KL controller, its prompt (``math.jinja``)
and its reward (``aepo.py``'s accuracy: mathruler's ``grade_answer`` of the ``\\boxed{}`` answer, the accuracy
reward's ``grader: mathruler`` (:mod:`rewards.accuracy`, with where mmrl's grading differs); the format score logged,
weight 0).
``configs/ares-paper.yaml`` (``--task ares-paper``) adds what the paper describes and the code does not run:
window counts, tau of each batch (its mean), branching and the KL relaxed inside HWE windows -- the wording
is published, their exact form is not (the paper's full text was unavailable): ``hwe_kl_rho`` 0.5 and
``branch_roots`` 4 are our choice. Each recipe's ``published:`` record cites the source of every value.

**Where mmrl differs from the released code, and why:**

* trigger words are read from the *sampled* token; the code decodes vLLM's top-1 candidate at each position,
  which differs from the response's own token wherever sampling picked another one -- we count the words the
  response says;
* token entropy is exact over the vocabulary (the HF backend; a vLLM backend gives the code's top-k estimate
  with its tail term, :func:`rewards.entropy.topk_entropy`), and each rollout's percentile is taken over its
  full windows (the code's list drops the top-k tail term there and pads the last ``window`` positions
  with the running mean);
* the first step's tau is its own batch value (the code seeds tau with the mean over the validation
  rollouts it runs before training); from the second step on, the EMA as the code;
* the shaping is computed before dynamic sampling (above);
* the KL controller measures the rollout log-probs' KL (4. above); AdaCS has no released code (its
  adaptation: :mod:`mmrl.methods.ares.cold_start`).

Logged per bucket (``ares/<piece>/<bucket>``): ``length``, ``entropy`` (mean token entropy: the
entropy-collapse monitor), ``hwe``, ``target``, ``shaping``, ``alpha``, ``share`` (of the prompts),
``kl_weight`` (beta_d), ``kl`` (its EMA), ``length_recent`` (mean per-step length over the last
``recent_window`` = 20 steps the bucket occurred in); and ``ares/tau``, ``ares/kl_weight_token_mean``. Everything that
must survive ``--resume`` (tau's EMA, alpha, the controller) is in the plug-in's state, saved with checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

BUCKETS = ("easy", "medium", "hard")
SHAPING_MODES = ("code", "paper", "none")
COMPONENT = "ares_shaping"

# the released code's per-bucket constants: margin fraction f, Huber kappa, sigmoid temperature T, cap scale s,
# and the factor of the bonus to incorrect answers
CODE_CONSTANTS: dict[str, dict[str, float]] = {
    "easy": {"f": 0.15, "kappa": 2.0, "T": 2.0, "s": 1.0, "incorrect": 0.6},
    "medium": {"f": 0.25, "kappa": 3.0, "T": 2.5, "s": 1.0, "incorrect": 0.8},
    "hard": {"f": 0.35, "kappa": 4.0, "T": 3.0, "s": 1.2, "incorrect": 1.0},
}
PAPER_TARGET = {"easy": 0.35, "medium": 0.5, "hard": 0.65}


# ---------------------------------------------------------------------------------------- buckets
def bucket_of(accuracy: float) -> str:
    """Difficulty bucket of a prompt from its group accuracy: easy >= 2/3, medium >= 1/3, else hard."""
    if accuracy >= 2.0 / 3.0 - 1e-9:
        return "easy"
    if accuracy >= 1.0 / 3.0 - 1e-9:
        return "medium"
    return "hard"


# ---------------------------------------------------------------------------------------- shaping formulas
def huber(x: float, kappa: float) -> float:
    """``x^2 / (2 kappa)`` for ``x <= kappa``, else ``x - kappa / 2``."""
    return x * x / (2.0 * kappa) if x <= kappa else x - kappa / 2.0


def sigmoid(x: float, temperature: float) -> float:
    return 1.0 / (1.0 + math.exp(-x / temperature))


def code_shaping(bucket: str, correct: bool, n_hwe: float, target: float, alpha: float,
                 constants: dict[str, dict[str, float]] = CODE_CONSTANTS) -> float:
    """The released code's shaping value of one response (module docstring, item 3)."""
    c = constants[bucket]
    delta = n_hwe - target
    m = max(1.0, c["f"] * max(target, 1.0))
    kappa, temp = c["kappa"], c["T"]
    cap = alpha * c["s"]

    def penalty(x: float, scale: float = 1.0) -> float:
        return -min(cap, scale * cap * huber(x, kappa) / (m + kappa))

    if bucket in ("easy", "medium"):
        if correct:
            return penalty(max(delta - m, 0.0) if bucket == "easy" else max(abs(delta) - m, 0.0))
        return sigmoid(max(delta - m, 0.0), temp) * cap * c["incorrect"]
    if correct:
        return sigmoid(delta + m, temp) * cap if delta >= -m else penalty(-delta - m, 0.5)
    return sigmoid(max(delta - m, 0.0), temp) * cap * c["incorrect"]


def adacs_target_length(pass_rate: float, len_hard: float, len_easy: float) -> float:
    """AdaCS's target trace length of a question with pass rate ``p``: ``(1 - p) * L(0) + p * L(1)``, ``L(0)``
    the length for never-solved questions (long), ``L(1)`` for always-solved ones (short)."""
    p = min(1.0, max(0.0, float(pass_rate)))
    return (1.0 - p) * float(len_hard) + p * float(len_easy)


def paper_target(counts: Sequence[float], bucket: str, coef: dict[str, float] = PAPER_TARGET) -> float:
    """``min + c_d * (max - min)`` of a bucket's HWE counts."""
    lo, hi = min(counts), max(counts)
    return lo + coef[bucket] * (hi - lo)


def paper_lambda(counts: Sequence[float], target: float, bucket: str, eps: float = 1e-6) -> float:
    """``max(0, sign_d * (mean - target)) / (var + eps)`` (population variance; |.| for medium)."""
    t = torch.tensor(list(counts), dtype=torch.float64)
    gap = float(t.mean()) - target
    gap = abs(gap) if bucket == "medium" else max(0.0, gap if bucket == "easy" else -gap)
    return gap / (float(t.var(unbiased=False)) + eps)


def paper_shaping(bucket: str, correct: bool, n_hwe: float, target: float, lam: float, cap: float = 1.0) -> float:
    """``-1[incorrect] * min(cap, lambda_d * g_d(N_HE - target))``."""
    if correct:
        return 0.0
    delta = n_hwe - target
    g = {"easy": max(0.0, delta), "medium": abs(delta), "hard": max(0.0, -delta)}[bucket]
    return -min(cap, lam * g)


# ---------------------------------------------------------------------------------------- dynamic KL
class BucketKLController:
    """The per-bucket KL weight beta_d, moved toward a per-bucket KL target (module docstring, item 4), with
    the released code's cadence (``dp_actor.py``): every call (one micro-batch) folds each present bucket's
    mean per-sequence KL into its EMA (``ema``, 0.97; the first value starts it); a bucket whose error
    ``e = KL_ema / target - 1`` is inside the dead zone (``|e| < deadzone``) makes no update at all, and
    otherwise only every ``every``-th call (100) moves it: ``e_ema <- err_ema * e_ema + (1 - err_ema) * e``
    (``err_ema`` 0.97, e_ema starting at 0), ``log beta += step * clip(e_ema, +-err_clip)``."""

    def __init__(self, target: dict[str, float], *, ema: float = 0.97, err_ema: float = 0.97,
                 deadzone: float = 0.02, step: float = 0.05, err_clip: float = 0.2, every: int = 100,
                 beta_init: float = 1.0, beta_min: float = 1e-4, beta_max: float = 1e2):
        self.target, self.ema, self.err_ema_decay = dict(target), ema, err_ema
        self.deadzone, self.step, self.err_clip, self.every = deadzone, step, err_clip, every
        self.beta_min, self.beta_max = beta_min, beta_max
        self.beta = {b: float(beta_init) for b in BUCKETS}
        self.kl_ema: dict[str, float | None] = {b: None for b in BUCKETS}
        self.err_ema: dict[str, float] = {b: 0.0 for b in BUCKETS}
        self.calls = 0

    def update(self, bucket_kl: dict[str, float]) -> None:
        """One micro-batch: the mean per-sequence KL of each bucket present in it (class docstring)."""
        self.calls += 1
        for b, v in bucket_kl.items():
            prev = self.kl_ema[b]
            kl = self.kl_ema[b] = v if prev is None else self.ema * prev + (1.0 - self.ema) * v
            e = kl / max(1e-8, self.target[b]) - 1.0
            if abs(e) < self.deadzone or self.calls % self.every:
                continue
            self.err_ema[b] = self.err_ema_decay * self.err_ema[b] + (1.0 - self.err_ema_decay) * e
            move = self.step * max(-self.err_clip, min(self.err_clip, self.err_ema[b]))
            self.beta[b] = min(self.beta_max, max(self.beta_min, self.beta[b] * math.exp(move)))

    def state_dict(self) -> dict[str, Any]:
        return {"beta": dict(self.beta), "kl_ema": dict(self.kl_ema), "err_ema": dict(self.err_ema),
                "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.beta.update(state["beta"])
            self.kl_ema.update(state["kl_ema"])
            self.err_ema.update(state["err_ema"])
            self.calls = int(state["calls"])
