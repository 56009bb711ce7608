"""How a policy computes, fixed when it is built: :class:`PolicyOptions` (from the run config, once) and
:class:`RankBinding` (how the passes behave across data-parallel ranks, bound once by the trainer).

Both are frozen: a change is a new object (:meth:`mmrl.model.Policy.configure`,
:meth:`mmrl.model.Policy.bind_ranks`), never an attribute written from outside, so a KL reference made from
the policy (:meth:`mmrl.model.Policy.reference`) sees the same settings without copying them by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class PolicyOptions:
    """The log-prob passes, the vision-feature cache and generation of one policy (and its reference)."""

    # Rows of the LM head computed at a time by forward_logprobs (None or 0: all rows at once, the unchunked
    # full log-softmax). At Qwen's 152k vocabulary one fp32 row is 0.6 MB, so 1024 rows are about 0.6 GB per
    # full-vocabulary tensor, whatever the micro-batch size (train.logprob_chunk_tokens).
    logprob_chunk_tokens: int | None = 1024
    # The prompt once per group in log-prob passes (mmrl.model.shared_prefix); False: every sequence whole, in
    # one padded batch (train.shared_prefix).
    shared_prefix: bool = True
    # Padding-free log-prob passes (mmrl.model.packing; train.padding_free): the plain pass and the
    # shared-prefix path's first pass pack their sequences without padding.
    padding_free: bool = True
    # Packed rows: None: one row under flash attention, under sdpa/eager the rows that cost least
    # (packing.layout); True: one row always (the GPU's layout, for tests and measurements).
    pack_one_row: bool | None = None
    # The shared prefix in one packed pass (sdpa/eager, padding-free): None: where the cost model says it is
    # cheaper than two passes; True/False force it (tests).
    shared_prefix_one_pass: bool | None = None
    # The second pass's own work (summing every weight's gradients from both passes, a second call of every
    # module) in multiply-adds per weight of a decoder layer, for that choice.
    second_pass_cost: float = 30.0
    # One vision-tower run per unique media key in a pass, shared by the sequences that show it
    # (model.share_vision_features); False: once per occurrence, as the peer frameworks do (benchmarks).
    share_vision_features: bool = True
    # Vision features reused across passes while the tower is unchanged (model.cache_vision_features).
    cache_vision_features: bool = True
    # Several samples of a prompt: the prompt computed once, its samples decoded from copies of its KV cache
    # (mmrl.model.generation; rollout.prefill_once).
    prefill_once: bool = True

    @classmethod
    def from_config(cls, cfg: Any) -> PolicyOptions:
        """The options a run configuration (:class:`mmrl.config.RunConfig`) sets."""
        return cls(logprob_chunk_tokens=cfg.train.logprob_chunk_tokens, shared_prefix=cfg.train.shared_prefix,
                   padding_free=cfg.train.padding_free, share_vision_features=cfg.model.share_vision_features,
                   cache_vision_features=cfg.model.cache_vision_features, prefill_once=cfg.rollout.prefill_once)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _same(n: int) -> int:
    return n


@dataclass(frozen=True)
class RankBinding:
    """How a policy's passes behave across data-parallel ranks (the trainer binds it once, after the updater
    exists; one process: the default, nothing to do).

    * ``invariant``: DeepSpeed over several ranks. ``"calls"`` (ZeRO-3 gathers each module's weights at each
      of its calls) or ``"gradients"`` (ZeRO-2 reduces gradients as they appear): every rank makes the same
      module calls in every pass whatever its data (a dummy vision input where a rank has no media, as many
      LM-head calls as the rank that needs the most, both shared-prefix passes). None: off.
    * ``max_int``: the largest of an integer over the ranks (a collective), for that LM-head call count.
    * ``gather_for_generation``: ZeRO-3's context in which the whole weights are local and forward passes make
      no collectives (:meth:`mmrl.model.Policy.generation_weights`); None: the weights are whole already.
    * ``gather_params``: ``gather_params(params)`` is a context in which those parameters are whole
      (:func:`mmrl.model.weights.stream_weights` reads the weights through it); None: read as they are.
    * ``sequence_group``: this rank's sequence-parallel group (:class:`mmrl.model.sequence_parallel.SequenceGroup`,
      ``train.sequence_parallel_size``): the log-prob passes spread each sequence's tokens over it; None: off.
    """

    invariant: str | None = None
    max_int: Callable[[int], int] = _same
    gather_for_generation: Callable[[], Any] | None = None
    gather_params: Callable[[list], Any] | None = None
    sequence_group: Any = None
