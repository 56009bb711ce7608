"""ARES (arXiv 2510.08457): difficulty buckets, entropy/length shaping of the reward, dynamic per-bucket KL.

Turn it on with ``imports: [rewards.ares]`` and ``plugins: {ares: {...}}`` (``configs/ares.yaml``); it needs
``rollout.record_entropies: true`` (and ``rollout.record_logprobs: true`` for the dynamic KL). Each round of
rollouts (plug-in hook ``after_rewards``):

1. **Window entropy and HWE count** (:mod:`mmrl.grpo.entropy`): every response's token entropies, window
   entropies over ``window`` tokens (4), the threshold tau (per-response ``quantile`` 0.95 of the window
   entropies, batch ``threshold_aggregate`` mean or median, optional EMA ``threshold_ema``), and the HWE count
   ``N_HE`` per response (``count_mode``: ``windows`` = every window above tau, the paper; ``triggers`` = a
   word of ``triggers`` followed by a high window, the released code -- here the *sampled* token, the code
   reads vLLM's top-1 candidate).
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
     every hard answer a bonus that differs by at most ``0.3 * cap``. ``configs/ares.yaml`` takes each
     bucket's stronger lever: ``{easy: code, medium: code, hard: paper}`` (measured in
     ``configs/compare/ares.yaml``).

   Unlike the released code, the shaping is computed on every round's rewards before dynamic sampling and
   the advantages see it (the code's online filter skips it, a bug we do not copy).
4. **Dynamic KL** (``after_advantages``): ``seq_kl_weights`` times the bucket's beta_d (``dynamic_kl``), and
   ``token_kl_weights`` times ``hwe_kl_rho`` (< 1 relaxes the KL; 1 = off) on the tokens inside validated HWE
   windows -- both reach the KL term of the loss, which needs ``grpo.kl_coef > 0``. After the update the
   controller (the released code's) moves beta_d: per bucket an EMA (``kl_ema`` 0.97) of the mean per-sequence
   KL (the engine's estimator between the rollout policy and the reference), error e = KL_ema / target_d - 1,
   0 inside the dead zone ``kl_deadzone`` (0.02), e_ema = EMA (``kl_err_ema`` 0.9, our choice; the code's is
   not documented) of e, ``log beta_d += kl_step (0.05) * clip(e_ema, +-kl_err_clip 0.2)`` every
   ``kl_update_every`` steps (the code counts 100 micro-batch calls; a toy step is one optimizer step),
   beta in [1e-4, 1e2], starting at 1; targets ``kl_target`` 0.01 for every bucket. The target is on the
   scale of the model's KL to its reference: 0.01 is the code's, for lr 1e-6 on 7B models. ``configs/ares.yaml``
   turns the controller off on the toy, whose KL is 20-60x that (``configs/compare/ares-ablations.yaml``).

Logged per bucket (``ares/<piece>/<bucket>``): ``length``, ``entropy`` (mean token entropy: the
entropy-collapse monitor), ``hwe``, ``target``, ``shaping``, ``alpha``, ``share`` (of the prompts),
``kl_weight`` (beta_d), ``kl`` (its EMA), ``length_recent`` (mean per-step length over the last
``recent_window`` = 20 steps the bucket occurred in); and ``ares/tau``, ``ares/kl_weight_token_mean``. Everything that
must survive ``--resume`` (tau's EMA, alpha, the controller) is in the plug-in's state, saved with checkpoints.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmrl.grpo.entropy import (
    AGGREGATES,
    COUNT_MODES,
    DEFAULT_TRIGGERS,
    EntropyThreshold,
    batch_threshold,
    hwe_windows,
)
from mmrl.grpo.kl import get_kl
from mmrl.plugins import Callback, register_plugin
from mmrl.report import register_curve
from mmrl_common.errors import ConfigError

if TYPE_CHECKING:
    from mmrl.batch import RolloutBatch
    from mmrl.plugins import StepContext

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

for _piece, _title in (("length", "response length per difficulty bucket (tokens)"),
                       ("entropy", "mean token entropy per difficulty bucket (entropy collapse)"),
                       ("hwe", "high-window-entropy count per response, per bucket"),
                       ("shaping", "ARES shaping reward per bucket"),
                       ("kl_weight", "ARES KL weight beta per bucket")):
    register_curve(f"ares/{_piece}/*", _title, f"ares-{_piece}.png")


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
    """The per-bucket KL weight beta_d, moved toward a per-bucket KL target (module docstring, item 4)."""

    def __init__(self, target: dict[str, float], *, ema: float = 0.97, err_ema: float = 0.9,
                 deadzone: float = 0.02, step: float = 0.05, err_clip: float = 0.2, every: int = 1,
                 beta_init: float = 1.0, beta_min: float = 1e-4, beta_max: float = 1e2):
        self.target, self.ema, self.err_ema_decay = dict(target), ema, err_ema
        self.deadzone, self.step, self.err_clip, self.every = deadzone, step, err_clip, every
        self.beta_min, self.beta_max = beta_min, beta_max
        self.beta = {b: float(beta_init) for b in BUCKETS}
        self.kl_ema: dict[str, float | None] = {b: None for b in BUCKETS}
        self.err_ema: dict[str, float | None] = {b: None for b in BUCKETS}
        self.calls = 0

    def update(self, bucket_kl: dict[str, float]) -> None:
        """Fold one step's mean per-sequence KL of each bucket present in; every ``every`` calls move beta."""
        for b, v in bucket_kl.items():
            prev = self.kl_ema[b]
            self.kl_ema[b] = v if prev is None else self.ema * prev + (1.0 - self.ema) * v
        self.calls += 1
        if self.calls % self.every:
            return
        for b in BUCKETS:
            if self.kl_ema[b] is None:
                continue
            e = self.kl_ema[b] / self.target[b] - 1.0
            if abs(e) < self.deadzone:
                e = 0.0
            prev = self.err_ema[b]
            self.err_ema[b] = e if prev is None else self.err_ema_decay * prev + (1.0 - self.err_ema_decay) * e
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


# ---------------------------------------------------------------------------------------- the plug-in
DEFAULTS: dict[str, Any] = {
    "window": 4, "quantile": 0.95, "threshold_aggregate": "mean", "threshold_ema": None,
    "count_mode": "windows", "triggers": list(DEFAULT_TRIGGERS),
    "accuracy_component": "accuracy", "correct_at": 0.5,
    "shaping": "code", "shaping_weight": 1.0, "target_scale": 1.0,
    "alpha_init": 0.5, "alpha_step": 0.05, "alpha_max": 2.0, "code_constants": {},
    "paper_target": dict(PAPER_TARGET), "paper_cap": 1.0,
    "dynamic_kl": True, "kl_target": {b: 0.01 for b in BUCKETS}, "kl_ema": 0.97, "kl_err_ema": 0.9,
    "kl_deadzone": 0.02, "kl_step": 0.05, "kl_err_clip": 0.2, "kl_update_every": 1,
    "beta_init": 1.0, "beta_min": 1e-4, "beta_max": 1e2, "hwe_kl_rho": 0.5, "recent_window": 20,
}
"""Every setting of ``plugins.ares`` and its default (module docstring)."""


def _settings(given: dict[str, Any]) -> dict[str, Any]:
    s = {**DEFAULTS, **given}

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"plugins.ares.{key}={s[key]!r}: {why}")

    if not isinstance(s["window"], int) or s["window"] < 1:
        raise bad("window", "must be an integer >= 1 (4 in ARES)")
    if not 0.0 < float(s["quantile"]) <= 1.0:
        raise bad("quantile", "must be in (0, 1] (0.95 in ARES)")
    for key, valid in (("threshold_aggregate", AGGREGATES), ("count_mode", COUNT_MODES)):
        if s[key] not in valid:
            raise bad(key, f"must be one of {', '.join(valid)}")
    form = s["shaping"]
    if isinstance(form, dict):
        if set(form) != set(BUCKETS) or not all(v in SHAPING_MODES for v in form.values()):
            raise bad("shaping", f"a mapping must give every bucket ({', '.join(BUCKETS)}) one of "
                                 f"{', '.join(SHAPING_MODES)}")
        s["shaping_of"] = dict(form)
    elif form in SHAPING_MODES:
        s["shaping_of"] = {b: form for b in BUCKETS}
    else:
        raise bad("shaping", f"must be one of {', '.join(SHAPING_MODES)}, or a mapping bucket -> one of them")
    if s["threshold_ema"] is not None and not 0.0 <= float(s["threshold_ema"]) < 1.0:
        raise bad("threshold_ema", "must be in [0, 1) (0.99 in the released code) or null (per batch)")
    if not 0.0 < float(s["hwe_kl_rho"]) <= 1.0:
        raise bad("hwe_kl_rho", "must be in (0, 1]: the KL weight inside high-entropy windows (1: no relaxation)")
    for key in ("kl_ema", "kl_err_ema"):
        if not 0.0 <= float(s[key]) < 1.0:
            raise bad(key, "must be in [0, 1)")
    for key in ("kl_step", "kl_err_clip", "kl_deadzone", "alpha_step", "alpha_max", "paper_cap", "target_scale"):
        if float(s[key]) < 0:
            raise bad(key, "must be >= 0")
    if not 0 < float(s["beta_min"]) <= float(s["beta_init"]) <= float(s["beta_max"]):
        raise bad("beta_init", "needs 0 < beta_min <= beta_init <= beta_max")
    if not isinstance(s["recent_window"], int) or s["recent_window"] < 1:
        raise bad("recent_window", "must be an integer >= 1")
    if not isinstance(s["kl_update_every"], int) or s["kl_update_every"] < 1:
        raise bad("kl_update_every", "must be an integer >= 1")
    for key, keys_of in (("kl_target", None), ("paper_target", None), ("code_constants", CODE_CONSTANTS)):
        val = s[key]
        if not isinstance(val, dict) or set(val) - set(BUCKETS):
            raise bad(key, f"must map buckets ({', '.join(BUCKETS)}) to values")
    s["kl_target"] = {**DEFAULTS["kl_target"], **s["kl_target"]}
    s["paper_target"] = {**PAPER_TARGET, **s["paper_target"]}
    if any(float(v) <= 0 for v in s["kl_target"].values()):
        raise bad("kl_target", "every target must be > 0 (0.01 in the released code)")
    consts = {b: dict(CODE_CONSTANTS[b]) for b in BUCKETS}
    for b, over in s["code_constants"].items():
        if not isinstance(over, dict) or set(over) - set(consts[b]):
            raise bad("code_constants", f"{b}: set any of {', '.join(consts[b])}")
        consts[b].update({k: float(v) for k, v in over.items()})
    s["code_constants"] = consts
    if not isinstance(s["triggers"], list) or not all(isinstance(w, str) for w in s["triggers"]):
        raise bad("triggers", "must be a list of words")
    return s


@register_plugin("ares")
class AresPlugin(Callback):
    """ARES difficulty-aware entropy shaping and dynamic KL (module docstring)."""

    SETTINGS = tuple(DEFAULTS)

    def __init__(self, ctx: StepContext, **settings: Any):
        super().__init__(ctx, **settings)
        s = self.s = _settings(settings)
        cfg = ctx.cfg
        if not cfg.rollout.record_entropies:
            raise ConfigError("plugins.ares needs the rollouts' token entropies: set rollout.record_entropies: true")
        self.kl_on = bool(s["dynamic_kl"]) or float(s["hwe_kl_rho"]) < 1.0
        if self.kl_on and not cfg.grpo.uses_reference:
            raise ConfigError("plugins.ares: dynamic_kl / hwe_kl_rho < 1 weight the KL term, which is off: set "
                              "grpo.kl_coef > 0 (0.01 in ARES), or dynamic_kl: false and hwe_kl_rho: 1")
        if s["dynamic_kl"] and not cfg.rollout.record_logprobs:
            raise ConfigError("plugins.ares.dynamic_kl measures each bucket's KL from the rollout log-probs: set "
                              "rollout.record_logprobs: true")
        self.threshold = EntropyThreshold(s["threshold_ema"])
        self.controller = BucketKLController(
            s["kl_target"], ema=float(s["kl_ema"]), err_ema=float(s["kl_err_ema"]), deadzone=float(s["kl_deadzone"]),
            step=float(s["kl_step"]), err_clip=float(s["kl_err_clip"]), every=int(s["kl_update_every"]),
            beta_init=float(s["beta_init"]), beta_min=float(s["beta_min"]), beta_max=float(s["beta_max"]))
        self.alpha = {b: float(s["alpha_init"]) for b in BUCKETS}
        self.recent: dict[str, deque[float]] = {b: deque(maxlen=int(s["recent_window"])) for b in BUCKETS}
        self._words_cache: dict[int, str] = {}
        self._reset_step()

    def _reset_step(self) -> None:
        self.acc: dict[str, list[float]] = {}  # metric name -> values over the step's rounds
        self.tau_batch: list[float] = []

    def _add(self, key: str, values: Sequence[float]) -> None:
        self.acc.setdefault(key, []).extend(float(v) for v in values)

    # ------------------------------------------------------------------------------------ per round
    def _words(self, ids: Sequence[int]) -> list[str]:
        tok = self.ctx.service.policy.tokenizer
        out = []
        for i in ids:
            if i not in self._words_cache:
                self._words_cache[i] = tok.convert_ids_to_tokens(int(i))
            out.append(self._words_cache[i])
        return out

    def measure(self, batch: RolloutBatch) -> tuple[float | None, list[int], list[list[int]], list[torch.Tensor]]:
        """``(tau, HWE count per row, covered columns per row, token entropies per row)``."""
        s = self.s
        if batch.entropies is None:
            raise ConfigError("plugins.ares: the rollout batch has no entropies (rollout.record_entropies: true)")
        cols = [batch.loss_mask[i].nonzero().flatten() for i in range(len(batch))]
        ents = [batch.entropies[i, c] for i, c in enumerate(cols)]
        tau_b = batch_threshold(ents, s["window"], float(s["quantile"]), s["threshold_aggregate"])
        if tau_b is not None:
            self.tau_batch.append(tau_b)
        tau = self.threshold.value(tau_b)
        counts, covered = [], []
        for i, (c, h) in enumerate(zip(cols, ents)):
            if tau is None:
                counts.append(0)
                covered.append([])
                continue
            words = None
            if s["count_mode"] == "triggers":
                words = self._words([batch.seqs[i].ids[j] for j in c.tolist()])
            n, pos = hwe_windows(h, tau, s["window"], s["count_mode"], words=words, triggers=s["triggers"])
            counts.append(n)
            covered.append([int(c[p]) for p in pos])
        return tau, counts, covered, ents

    def after_rewards(self, batch: RolloutBatch) -> None:
        s = self.s
        tau, counts, covered, ents = self.measure(batch)
        acc = batch.component(s["accuracy_component"]).float()
        group_acc = batch.group_mean(acc)
        bucket_of_group = [bucket_of(float(a)) for a in group_acc]
        buckets = [bucket_of_group[int(g)] for g in batch.group_index]
        correct = [bool(a >= float(s["correct_at"])) for a in acc]
        shaping = [0.0] * len(batch)
        targets: dict[str, float] = {}
        for b in BUCKETS:
            rows = [i for i, x in enumerate(buckets) if x == b]
            if not rows:
                continue
            n_b = [float(counts[i]) for i in rows]
            mean_b = sum(n_b) / len(n_b)
            form = s["shaping_of"][b]
            if form == "code":
                target = float(round(float(s["target_scale"]) * mean_b))
                for i in rows:
                    shaping[i] = code_shaping(b, correct[i], counts[i], target, self.alpha[b], s["code_constants"])
                gap = (mean_b - target) if b != "hard" else (target - mean_b)
                self.alpha[b] = min(float(s["alpha_max"]), max(0.0, self.alpha[b] + float(s["alpha_step"]) * gap))
            elif form == "paper":
                target = paper_target(n_b, b, s["paper_target"])
                lam = paper_lambda(n_b, target, b)
                for i in rows:
                    shaping[i] = paper_shaping(b, correct[i], counts[i], target, lam, float(s["paper_cap"]))
            else:
                target = mean_b
            targets[b] = target
            lengths = batch.response_length[rows].float()
            self._add(f"ares/length/{b}", lengths.tolist())
            self._add(f"ares/entropy/{b}", [float(ents[i].mean()) if ents[i].numel() else 0.0 for i in rows])
            self._add(f"ares/hwe/{b}", n_b)
            self._add(f"ares/target/{b}", [target])
            self._add(f"ares/accuracy/{b}", [float(acc[i]) for i in rows])
            if form != "none":
                self._add(f"ares/shaping/{b}", [shaping[i] for i in rows])
        n_groups = max(1, len(bucket_of_group))
        for b in BUCKETS:
            self._add(f"ares/share/{b}", [bucket_of_group.count(b) / n_groups])
        if tau is not None:
            self._add("ares/tau", [tau])
        batch.extra["ares_bucket"] = buckets
        batch.extra["ares_hwe"] = torch.tensor(counts, dtype=torch.float32)
        batch.extra["ares_hwe_cols"] = covered
        if any(f != "none" for f in s["shaping_of"].values()):
            value = torch.tensor(shaping, dtype=torch.float32) * float(s["shaping_weight"])
            batch.reward_components[COMPONENT] = value
            batch.rewards = batch.rewards + value

    # ------------------------------------------------------------------------------------ the trained batch
    def after_advantages(self, batch: RolloutBatch) -> None:
        if not self.kl_on:
            return
        s = self.s
        buckets = batch.extra["ares_bucket"]
        if s["dynamic_kl"]:
            beta = torch.tensor([self.controller.beta[b] for b in buckets], dtype=batch.seq_kl_weights.dtype)
            batch.seq_kl_weights = batch.seq_kl_weights * beta
        rho = float(s["hwe_kl_rho"])
        if rho < 1.0:
            w = batch.token_kl_weights.clone()
            for i, cols in enumerate(batch.extra["ares_hwe_cols"]):
                if cols:
                    w[i, torch.tensor(cols, dtype=torch.long)] *= rho
            batch.token_kl_weights = w
        m = batch.loss_mask
        self._add("ares/kl_weight_token_mean", [float((batch.kl_weights() * m).sum() / m.sum().clamp(min=1))])

    def after_update(self, batch: RolloutBatch, stats: dict[str, Any]) -> None:
        if not self.s["dynamic_kl"] or batch.ref_logprobs is None:
            return
        logp = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
        if logp is None:
            raise ConfigError("plugins.ares.dynamic_kl: no rollout log-probs (rollout.record_logprobs: true)")
        est = get_kl(self.ctx.cfg.grpo.kl_estimator)(logp, batch.ref_logprobs)
        m = batch.loss_mask
        seq_kl = (est * m).sum(-1) / m.sum(-1).clamp(min=1)
        buckets = batch.extra["ares_bucket"]
        per_bucket = {}
        for b in BUCKETS:
            rows = [i for i, x in enumerate(buckets) if x == b]
            if rows:
                per_bucket[b] = float(seq_kl[rows].mean())
        self.controller.update(per_bucket)

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        if self.tau_batch:
            self.threshold.update(sum(self.tau_batch) / len(self.tau_batch))
        for key, vals in self.acc.items():
            if vals:
                stats[key] = sum(vals) / len(vals)
        for b in BUCKETS:
            if f"ares/length/{b}" in stats:
                self.recent[b].append(stats[f"ares/length/{b}"])
            if self.recent[b]:
                stats[f"ares/length_recent/{b}"] = sum(self.recent[b]) / len(self.recent[b])
            stats[f"ares/kl_weight/{b}"] = self.controller.beta[b] if self.s["dynamic_kl"] else 1.0
            if self.controller.kl_ema[b] is not None:
                stats[f"ares/kl/{b}"] = self.controller.kl_ema[b]
            if self.s["shaping_of"][b] == "code":
                stats[f"ares/alpha/{b}"] = self.alpha[b]
        self._reset_step()

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold.state_dict(), "controller": self.controller.state_dict(),
                "alpha": dict(self.alpha), "recent": {b: list(v) for b, v in self.recent.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.threshold.load_state_dict(state.get("threshold", {}))
        self.controller.load_state_dict(state.get("controller", {}))
        self.alpha.update(state.get("alpha", {}))
        for b, vals in state.get("recent", {}).items():
            self.recent[b].clear()
            self.recent[b].extend(float(v) for v in vals)
