"""mmrl speed measurements (``make bench`` runs ``python -m perf``). They report timings; they assert nothing.

(The public evaluation benchmarks, MVBench, Video-MME and the others, live in ``data_pipelines/benchmarks/``
and ``mmrl/benchmarks_eval/``; this package only times mmrl itself.)

* ``step``: forward + backward of ``Policy.forward_logprobs`` over a video batch (2 prompts x G=8 rollouts,
  16 frames at 112x112 per video) with vision features shared across the group vs. one vision-tower run
  per sequence (what peer frameworks do);
* ``rollout``: generating G=8 completions per prompt with ``num_return_sequences`` and shared features vs.
  the prompt repeated G times with one tower run per sequence;
* ``build``: seconds to build the small toy world (``make_toy(size="small")``) and a tiny random-weight model
  of each Qwen-VL family (``make_tiny``), the fixtures every test and demo starts from;
* ``semantic``: seconds per 1000 answers of the medical rewards' semantic scorer (all-MiniLM-L6-v2 cosine and
  BERTScore), with an empty embedding cache and with every text cached (:mod:`perf.semantic`).

Repetitions of the two modes are interleaved after a warm-up, and medians are reported, so both numbers
come from the same run on the same machine state. Builds are timed after one untimed warm-up build (imports,
first-call caches), each into a fresh folder; medians are reported.
"""
