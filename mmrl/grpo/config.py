"""``GRPOConfig``: every knob of the GRPO update (the loss is assembled in :mod:`mmrl.grpo.policy_loss`).

Defaults and why:

* ``advantage_estimator="grpo"`` -- group mean / unbiased group std, as DeepSeekMath, TRL and verl.
* ``policy_loss="ppo"``, ``clip_low=0.2``, ``clip_high=0.28`` -- DAPO clip-higher: the asymmetric upper bound
  lets low-probability tokens grow and counters entropy collapse at no cost in stability (DAPO, 80/20 and
  the Lite PPO study on aligned 8B models use 0.28). Set
  ``clip_high=0.2`` for vanilla symmetric PPO/GRPO.
* ``dual_clip_c=None`` -- off, as in TRL and vanilla GRPO; verl/ARES use 3.0, DAPO scripts 10.
* ``policy_loss_kwargs={}`` -- the chosen loss's own settings, with defaults declared with the loss's name
  (:mod:`mmrl.grpo.names`): ``gspo`` ``{clip_low: 3e-4, clip_high: 4e-4}`` (GSPO paper v2 §5.1: sequence
  ratios are near 1);
  ``clip_cov`` ``{ratio: 2e-4, lb: 1, ub: 5}`` and ``kl_cov`` ``{ratio: 2e-4, coef: 1}`` (the Clip-Cov / KL-Cov
  losses of :mod:`mmrl.grpo.cov_losses`, the authors' defaults, arXiv 2505.22617; KL-Cov's ratio as a
  fraction, verl's units).
* ``loss_agg="token-mean"`` -- DAPO / Lite PPO token-level loss; no length bias between long and short
  answers of a group. ``seq-mean-token-sum-norm`` uses ``loss_norm_const`` or else
  ``max_response_length`` as its constant.
* ``kl_estimator="k3"``, ``kl_coef=0.0`` -- mmrl's default has no KL term (DAPO, Dr. GRPO, GSPO, Lite PPO drop
  it and it saves the reference model); when turned on, k3 is the GRPO / verl recommendation (e.g. 0.001-0.04).
* ``ppo_epochs=1`` -- one pass per rollout batch (TRL, Lite PPO); then ratio = 1 and clipping is inert unless
  the batch is split into several optimizer mini-batches (``ppo_mini_batch_size``, as verl and EasyR1).
* ``kl_reward_estimator="k1"`` -- the KL folded into the reward (``kl_in_reward``) has its own estimator.
* ``dynamic_sampling=False``, ``max_draws=9`` -- DAPO recipe's 10 generation batches = the first + 9 extra.
* ``overlong_filter=False``, ``overlong_penalty=False`` -- off as in most DAPO runs; the penalty needs
  ``max_response_length`` (L_max) and ``overlong_cache`` (L_cache; DAPO 4096 of 20480).
* ``shaper="none"`` -- no per-token shaping.

The names are checked against the registries of :mod:`mmrl.grpo.names`, and the loss's settings against its
declared ones, without importing torch: this module and that one import neither torch nor numpy (a config is
read and shown without them); building the token shaper (:meth:`GRPOConfig.build_shaper`) imports its module.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmrl_common.errors import ConfigError

from .names import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, SHAPERS, policy_loss_settings

if TYPE_CHECKING:
    from .shaping import TokenShaper


def range_words(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """A range in words: ``in [0, 1)``, ``>= 1``, ``< 5``, or empty for none (a whole bound printed whole)."""
    def num(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:g}"

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{num(low)}, {num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {num(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {num(high)}"
    return ""


def check_number(key: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, hint: str = "") -> None:
    """Refuse a setting that is not a finite number within its range, with a :class:`ConfigError` naming the
    key, the value and the range (``low``/``high``: the bounds, None for none; ``*_open``: the bound itself
    excluded). NaN and infinities never pass: a comparison with NaN is False, so a plain ``< 0`` lets it by."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (low is None or (value > low if low_open else value >= low))
          and (high is None or (value < high if high_open else value <= high)))
    if ok:
        return
    where = range_words(low, high, low_open, high_open)
    raise ConfigError(f"{key}={value!r}: must be a finite number{' ' if where else ''}{where}"
                      + (f" ({hint})" if hint else ""))


@dataclass
class GRPOConfig:
    # advantages
    advantage_estimator: str = "grpo"
    """How each rollout's advantage comes from its group's rewards: grpo (minus the group mean, over the group
    std; DeepSeekMath, TRL, verl), dr_grpo (minus the mean, no std), rloo (minus the mean of the others),
    batch_std (over the batch's std), or a registered estimator."""
    adv_eps: float = 1e-6
    """Added to the standard deviation before dividing (a group of equal rewards gets advantage 0)."""
    # policy loss
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip_c: float | None = None
    policy_loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """The policy loss's own settings over its registered defaults (gspo: {clip_low, clip_high}; clip_cov:
    {ratio, lb, ub}; kl_cov: {ratio, coef}); the loss reads them merged as ``loss_settings``."""
    # aggregation
    loss_agg: str = "token-mean"
    """How the per-token losses of a batch are averaged into one number: token-mean (every token of the batch
    weighs the same; DAPO, Lite PPO: no length bias), seq-mean-token-mean (each sequence's mean, then the mean
    over sequences; GRPO paper), seq-mean-token-sum (each sequence's sum), seq-mean-token-sum-norm (each sum over a
    constant, Dr. GRPO: loss_norm_const, else max_response_length)."""
    loss_norm_const: float | None = None
    """The constant of seq-mean-token-sum-norm (null: grpo.max_response_length)."""
    # KL to the reference
    kl_estimator: str = "k3"
    """The per-token estimator of the KL to the reference model: k3 (GRPO, verl), k1, k2, abs, none."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference term in the loss. 0 turns it off and no reference model is kept (DAPO,
    Dr. GRPO, GSPO, Lite PPO drop it); GRPO and verl use 0.001-0.04. mmrl's own default is 0; a recipe may
    set it (the value above is the one this run uses)."""
    kl_in_reward: bool = False
    kl_reward_estimator: str = "k1"
    """The estimator of the KL folded into the reward (``kl_in_reward``): k1, as classic RLHF-PPO and verl."""
    kl_clamp: float | None = None
    # entropy bonus (subtracted from the loss)
    entropy_coef: float = 0.0
    # rollout / training mismatch (a rollout engine such as vLLM computes slightly different probabilities)
    tis_cap: float = 0.0
    """Truncated importance sampling: each token's loss is weighted by min(p_train / p_rollout, tis_cap)
    (the training policy's probability before the update over the rollout engine's); needs
    rollout.record_logprobs. 0: off."""
    # optimisation
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None
    """Sequences per optimizer step within one rollout batch (verl/EasyR1 ``ppo_mini_batch_size``); the batch
    is split into mini-batches and each epoch takes one optimizer step per mini-batch. None: the whole batch."""
    # DAPO filters
    dynamic_sampling: bool = False
    dynamic_sampling_tol: float = 1e-6
    dynamic_sampling_band: list[float] | None = None
    """[low, high]: dynamic sampling keeps a group when its mean reward is strictly inside (low, high), groups of
    equal rewards included (EasyR1's and verl's online filtering, filter_low / filter_high: ARES uses
    [0.01, 0.99]); null: it keeps the groups whose rewards are not all equal (DAPO)."""
    max_draws: int = 9
    overlong_filter: bool = False
    overlong_penalty: bool = False
    max_response_length: int | None = None
    overlong_cache: int | None = None
    overlong_penalty_factor: float = 1.0
    # token shaping
    shaper: str = "none"
    shaper_kwargs: dict[str, Any] = field(default_factory=dict)
    # free knobs for registered plug-ins
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the names (a registered or declared entry of each family: no torch module is imported)
        ADVANTAGES.check(self.advantage_estimator)
        policy_loss_settings(self.policy_loss, self.policy_loss_kwargs)  # the name, then its settings
        AGGREGATIONS.check(self.loss_agg)
        KL_ESTIMATORS.check(self.kl_estimator)
        KL_ESTIMATORS.check(self.kl_reward_estimator)
        SHAPERS.check(self.shaper)

        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"grpo.{key}={getattr(self, key)!r}: {why}")

        # every coefficient finite (a NaN passes any `< 0` test and turns a term off or the loss into NaN)
        check_number("grpo.clip_low", self.clip_low, low=0, high=1, high_open=True)
        for key in ("clip_high", "kl_coef", "adv_eps", "dynamic_sampling_tol", "overlong_penalty_factor",
                    "tis_cap"):
            check_number(f"grpo.{key}", getattr(self, key), low=0)
        check_number("grpo.entropy_coef", self.entropy_coef, hint="a bonus when > 0, a penalty when < 0")
        if self.dual_clip_c is not None:
            check_number("grpo.dual_clip_c", self.dual_clip_c, low=1, low_open=True, hint="e.g. 3.0, or null: off")
        if self.kl_clamp is not None:
            check_number("grpo.kl_clamp", self.kl_clamp, low=0, low_open=True, hint="or null: no clamp")
        for name, value in (self.policy_loss_kwargs or {}).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"grpo.policy_loss_kwargs.{name}={value!r}: must be a finite number")
        if self.dynamic_sampling_band is not None:
            band = self.dynamic_sampling_band
            if (not isinstance(band, (list, tuple)) or len(band) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in band)
                    or not band[0] < band[1]):
                raise bad("dynamic_sampling_band", "must be [low, high] with low < high (e.g. [0.01, 0.99]), or null")
        if self.ppo_epochs < 1:
            raise bad("ppo_epochs", "must be >= 1")
        if self.ppo_mini_batch_size is not None and self.ppo_mini_batch_size < 1:
            raise bad("ppo_mini_batch_size", "must be >= 1 or null (the whole batch)")
        if self.max_draws < 0:
            raise bad("max_draws", "must be >= 0")
        if self.max_response_length is not None and self.max_response_length < 1:
            raise bad("max_response_length", "must be >= 1")
        if self.overlong_filter and self.max_response_length is None:
            raise bad("max_response_length", "overlong_filter needs max_response_length")
        if self.overlong_penalty:
            if self.max_response_length is None or self.overlong_cache is None:
                raise bad("overlong_cache", "overlong_penalty needs max_response_length and overlong_cache")
            if not 0 < self.overlong_cache <= self.max_response_length:
                raise bad("overlong_cache", f"must be in (0, max_response_length={self.max_response_length}]")
        if self.loss_agg == "seq-mean-token-sum-norm" and self.norm_const is None:
            raise bad("loss_norm_const", "seq-mean-token-sum-norm needs loss_norm_const or max_response_length")
        if self.loss_norm_const is not None:
            check_number("grpo.loss_norm_const", self.loss_norm_const, low=0, low_open=True)
        if not isinstance(self.shaper_kwargs, dict) or not isinstance(self.extra, dict):
            raise ConfigError("grpo.shaper_kwargs and grpo.extra must be mappings")

    @property
    def loss_settings(self) -> dict[str, Any]:
        """The policy loss's settings: its registered defaults updated by ``policy_loss_kwargs``."""
        return policy_loss_settings(self.policy_loss, self.policy_loss_kwargs)

    @property
    def norm_const(self) -> float | None:
        """The constant C of ``seq-mean-token-sum-norm``: ``loss_norm_const`` or ``max_response_length``."""
        if self.loss_norm_const is not None:
            return float(self.loss_norm_const)
        return None if self.max_response_length is None else float(self.max_response_length)

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model's log-probs are needed (KL as loss or in the reward)."""
        return self.kl_coef > 0 and self.kl_estimator != "none"

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> GRPOConfig:
        """Build from a mapping (e.g. the ``grpo:`` YAML section); unknown keys are a ConfigError."""
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown grpo key(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def build_shaper(self) -> TokenShaper:
        from .shaping import build_shaper

        return build_shaper(self.shaper, **self.shaper_kwargs)


__all__ = ["GRPOConfig", "check_number"]
