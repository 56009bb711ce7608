"""``make gpu-check`` (``python -m perf.gpu_check``): the acceptance run on a machine with one GPU, and its CPU mode.

The run is a list of stages, each in its own Python process with its own timeout (:mod:`perf.gpu_check.runner`
starts them; :mod:`perf.gpu_check.stages` is what each runs):

``environment``
    Python, torch, CUDA, the GPU; every ``pyproject.toml`` dependency the training path needs (less those
    :data:`perf.gpu_check.image.NOT_CARRIED` leaves behind), each imported and against its minimum version, and
    every distribution that importing the training path loaded, with where it came from; free disk; on a GPU a
    measured bf16 matrix-product rate. It always runs first; when it fails nothing else runs. What the lent
    machine's image holds and what travels to it as wheels: :mod:`perf.gpu_check.image`.
``gpu-tests``
    ``pytest -m gpu tests/test_gpu.py`` (the GPU tests: never skipped, so a run without CUDA fails them).
``train``
    The README's one-GPU command: Qwen2.5-VL-3B (a random-weight model of the published configuration, built
    here: no download), full fine-tuning in bf16 with activation checkpointing, HF rollouts, 8 prompts x 8
    answers x 512 tokens, videos of 32 frames at the pixel budget's most (448 x 448), for ``--steps`` steps
    and the checkpoint the run writes at its end. An H200 (or any card over ``--cap-gb``) is held to an H100's
    memory with ``torch.cuda.set_per_process_memory_fraction``. Reports per-stage seconds and memory peaks
    (the run's ``memory/*`` metrics, the checkpoint's too), the whole run's (the most allocated and the most
    reserved in any of those windows), tokens per second; with ``--memory-history`` what was live at the run's
    most-allocated moment, by where it was allocated.
``profile``
    One update micro-batch of that run (its model, settings and a real prompt with its 32-frame video, 2 answers
    of 512 tokens): its FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` (the vision tower and
    attention included), timed with CUDA events, and the utilisation against the card's dense bf16 peak;
    the kernels that took the most time (``torch.profiler``).
``deepspeed``
    ZeRO-2 and ZeRO-3 in one process on the GPU (bf16, a tiny model): 4 steps with a checkpoint at step 2, then
    a copy of the run resumed from that checkpoint, whose final weights must equal the uninterrupted run's bit
    for bit. Skipped (and said so) where DeepSpeed does not import.

After every stage the results are written (``perf/results/gpu_check-<device>-<date>.json`` and ``.md``), so a
run that is killed keeps what finished. A call has a budget (``--call-budget``; 540 s on a GPU: a lent machine
runs a command for 10 minutes) that cuts each stage's timeout; a run split over calls gives the second
``--merge RESULTS.json``, the first call's file. Each stage runs in its own process group, stopped with the
runner on SIGTERM, SIGINT or SIGHUP, and dies with a runner killed outright (``PR_SET_PDEATHSIG``). The exit status is 0 when every stage passed and every budget held,
1 when a stage failed or timed out (the later stages still run), 2 when a budget was exceeded, 3 for both.
Budgets (``--budget STAGE.KEY<=VALUE``; on a GPU by default ``train.peak_gb<=80`` and
``train.peak_reserved_gb<=80``: the 3B command on one 80 GB card) are checked on the numbers a stage reports; aims (``profile.mfu>=0.25``) are reported, not enforced.

Without CUDA (``--mode cpu``) the same stages run on a tiny model in seconds; ``tests/test_gpu_check.py`` runs
them inside ``make test`` so that the runner and its asserts cannot rot.

This package's ``__init__`` and the runner import only the standard library: the runner starts on any Python
and leaves torch to the stages.
"""

from __future__ import annotations

FAMILY = "qwen2_5_vl"
# The published Qwen2.5-VL configurations (config.json of Qwen/Qwen2.5-VL-3B-Instruct and -7B-Instruct).
VISION = {"vision_depth": 32, "vision_hidden_size": 1280, "vision_heads": 16, "vision_intermediate_size": 3420}
# The published processor's pixel budgets (preprocessor_config.json: min_pixels 3136, max_pixels 12845056, for
# images and videos alike): the tiny models' small defaults would shrink every frame the settings ask for.
PROCESSOR = {"image_min_pixels": 3136, "image_max_pixels": 12845056, "video_min_pixels": 3136,
             "video_max_pixels": 12845056}
REAL_SIZES = {
    "3b": {"hidden_size": 2048, "layers": 36, "heads": 16, "kv_heads": 2, "intermediate_size": 11008,
           "tie_word_embeddings": True, **VISION, **PROCESSOR},
    "7b": {"hidden_size": 3584, "layers": 28, "heads": 28, "kv_heads": 4, "intermediate_size": 18944,
           "tie_word_embeddings": False, **VISION, **PROCESSOR},
}
REAL_OVERRIDES = {"text_config": {"vocab_size": 151936},
                  "vision_config": {"window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}}

# dense bf16 peak FLOP/s by device name (vendor data sheets), for the utilisation figures
PEAK_BF16 = (("H200", 989e12), ("H100 SXM", 989e12), ("H100 80GB HBM3", 989e12), ("H100 PCIe", 756e12),
             ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))

# torch's total_memory of an H100 80GB (10^9 bytes): what `--cap-gb` holds a larger card to
H100_GB = 85.0


def peak_flops(name: str | None) -> float | None:
    """The dense bf16 peak of a device by its name, or None when unknown (the CPU)."""
    return next((v for key, v in PEAK_BF16 if name and key in name), None)
