"""mmrl benchmarks (``make bench`` runs ``python -m benchmarks``). They report timings; they assert nothing.

* ``step``: forward + backward of ``Policy.forward_logprobs`` over a video batch (2 prompts x G=8 rollouts,
  16 frames at 112x112 per video) with vision features shared across the group vs. one vision-tower run
  per sequence (what peer frameworks do);
* ``rollout``: generating G=8 completions per prompt with ``num_return_sequences`` and shared features vs.
  the prompt repeated G times with one tower run per sequence.

Repetitions of the two modes are interleaved after a warm-up, and medians are reported, so both numbers
come from the same run on the same machine state.
"""
