"""mmrl speed measurements (``make bench`` runs ``python -m perf``). They report timings; they assert nothing.

(The public evaluation benchmarks, MVBench, Video-MME and the others, live in ``data_pipelines/benchmarks/``
and ``mmrl/benchmarks/``; this package only times mmrl itself.)

* ``update``: the GRPO update at Qwen2.5-VL-3B's depth (36 decoder layers, 32 vision blocks) and tiny width, one
  video prompt of 1,024 vision tokens x G=8 answers, before (sdpa, 2 rows a micro-batch: the real-model preset
  until issue 58) and after (the preset as it is: variable-length attention, a token budget that holds a group)
  in one run: seconds per trained token, aten operations and attention calls an update, their ratios
  (:mod:`perf.update_speed`); a GPU runs such an update host-bound, so the operation count is what it feels;
* ``step``: forward + backward of ``Policy.forward_logprobs`` over a video batch (2 prompts x G=8 rollouts,
  16 frames at 112x112 per video) with vision features shared across the group vs. one vision-tower run
  per sequence (what peer frameworks do);
* ``rollout``: generating G=8 completions per prompt with ``num_return_sequences`` and shared features vs.
  the prompt repeated G times with one tower run per sequence;
* ``longvideo``: generating G=8 completions of 16 tokens for 2 long-video prompts (16 frames at 336x336,
  1,200 prompt tokens) with each prompt prefilled once per group (``rollout.prefill_once``) vs the prompt
  repeated G times before its prefill (:mod:`perf.longvideo`);
* ``decode``: seconds per video of each video decoder that runs here (``data.media.decoder``: decord, PyAV,
  torchcodec where FFmpeg's libraries load) on the same MP4 files of three kinds (toy 112x112, a 30 s 336x336 video, a
  5 s 640x360 30 fps clip): opening + the frames a run samples, and opening + every frame; ratios to PyAV's, and
  what ``data.media.decode_timeout``'s thread per call costs (:mod:`perf.decode`);
* ``build``: seconds to build the small toy world (``make_toy(size="small")``) and a tiny random-weight model
  of each Qwen-VL family (``make_tiny``), the fixtures every test and demo starts from;
* ``semantic``: seconds per 1000 answers of the medical rewards' semantic scorer (all-MiniLM-L6-v2 cosine and
  BERTScore), with an empty embedding cache and with every text cached (:mod:`perf.semantic`);
* ``libraries``: hand-written code against the library that replaced it or does the same
  (:mod:`perf.libraries`): the word edit distance (old Python DP vs rapidfuzz) on a 512 x 512-word pair, the
  variance filters' scoring on a 1,000-prompt pool before and after, mmrl's BERTScore vs torchmetrics';
* ``memory``: the peak memory of ONE training micro-batch (``forward_logprobs`` with entropies, a scalar loss,
  backward) at 16 sequences x 512 response tokens on a tiny Qwen2.5-VL (hidden 64, 2 layers) with Qwen's
  real 151,936-token vocabulary: the full log-softmax at once ("before", ``chunk_tokens=0``) vs. chunks of
  ``PolicyOptions.logprob_chunk_tokens`` rows ("after"), entropies without and with gradient, and the ratio
  after/before. Each mode runs in a fresh process (:func:`mmrl.engine.memory.measure_in_subprocess`); on CUDA it
  counts live tensor bytes, on CPU the resident set. Where the machine cannot hold the unchunked modes at
  16 sequences it halves the sequences until it can, and says so (``--memory-seqs``, ``--memory-tokens``,
  ``--device``; ``--only memory`` runs it alone).

* ``trl``: mmrl's GRPO step against TRL's ``GRPOTrainer`` in one process (:mod:`perf.trl_compare`): the same
  tiny Qwen2.5-VL folder at about 1M and 23M parameters, 2 prompts x G=8 on 112x112 images, at most 16 new
  tokens, fp32, no reference, one update per batch, the same reward, measured as interleaved pairs of step
  blocks (mmrl, TRL, mmrl, TRL, ... after a warm-up pair): the per-pair ratios of samples/s and their median,
  and the seconds per step of each stage on both sides (generation, the rest of the rollout, log-prob and
  reference passes, forward+backward, optimizer and the rest); then mmrl's framework overhead on the 23M model
  (the share of a step outside model forward, backward and ``generate``); mmrl's video GRPO step with the
  shared-prefix forward and the per-step vision cache on vs both off (and a frozen tower's tower runs against
  the unique videos); HF ``generate`` against the vLLM engine on the CPU, and one weight push to it (when vLLM
  is installed).

Repetitions of the two modes are interleaved after a warm-up, and medians are reported, so both numbers
come from the same run on the same machine state. Builds are timed after one untimed warm-up build (imports,
first-call caches), each into a fresh folder; medians are reported.
"""
