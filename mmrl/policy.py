"""The policy: a Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with its processor.

It renders chats, turns prompts into token sequences, generates, and computes per-token log-probabilities
and entropies. Two things matter for speed and correctness:

* **Vision features once.** Every media item has a key. In one forward pass (or one ``generate`` call)
  the vision tower runs once per unique key and the features are shared by every sequence that shows the
  item (the G rollouts of a prompt, a re-asked prompt, later turns). Gradients still flow into the tower
  when it is trainable, since the shared tensor is part of the graph.
* **M-RoPE computed, not guessed.** Position ids come from the model's own ``get_rope_index`` with the
  image/video grids, the token-type ids and (Qwen2.5-VL) the video seconds-per-grid, on the padded batch;
  they equal the positions the model computes for each sequence alone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from mmrl import packing, rope
from mmrl_common.errors import MediaError, MmrlError

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass
class MediaInput:
    """One decoded media item, ready for the processor. ``key`` identifies it for feature sharing."""

    key: str
    kind: str  # "image" | "video"
    data: Any  # PIL image, or a video.sampling.SampledVideo
    timestamps: list[float] | None = None
    layout: str = "video"  # a video's prompt.video_layout: "video" or "frames" (mmrl.prompts.media_parts)


@dataclass
class EncodedMedia:
    key: str
    kind: str
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor  # (3,)
    second_per_grid: float | None = None
    # The item's vision features by the tag of the tower that computed them (Policy._feature_tag): they live
    # and go with the item (the trainer clears the media at the end of each step).
    features: dict[Any, tuple[torch.Tensor, list[torch.Tensor]]] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def num_patches(self) -> int:
        return int(self.grid_thw.prod())


class MediaStore(dict):
    """The encoded media by key (:class:`EncodedMedia`), shared by a policy and its reference. Each item keeps
    its cached vision features, so clearing the store (the trainer does at the end of each step) drops both.
    ``vision_calls`` counts the vision-tower runs made for it by every policy that shares it; it is never
    reset (take differences)."""

    vision_calls: int = 0


@dataclass
class TokenSeq:
    """A token sequence with its media: a prompt, or a prompt plus completion turns.

    ``loss_mask`` marks tokens the policy produced (trained on); prompt and environment tokens are 0.
    ``media`` lists media keys in the order their placeholders appear.
    """

    ids: list[int]
    mm_types: list[int]
    media: list[str] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.loss_mask:
            self.loss_mask = [0] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Sequence[int], *, trained: bool, mm_types: Sequence[int] | None = None,
               media: Iterable[str] = ()) -> TokenSeq:
        return TokenSeq(
            ids=self.ids + list(ids),
            mm_types=self.mm_types + (list(mm_types) if mm_types is not None else [TEXT] * len(ids)),
            media=self.media + list(media),
            loss_mask=self.loss_mask + [1 if trained else 0] * len(ids),
        )

    def head(self, k: int) -> TokenSeq:
        """The first ``k`` tokens, with the whole media list (the shared-prefix passes cut a row to its prompt,
        which holds every placeholder)."""
        return replace(self, ids=self.ids[:k], mm_types=self.mm_types[:k], loss_mask=self.loss_mask[:k])


@dataclass
class Generation:
    """One sampled continuation: its tokens, text, the log-probabilities under the sampling distribution."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finished: bool  # ended on EOS or a stop string (not cut by max_new_tokens)
    entropies: list[float] = field(default_factory=list)  # per token, when asked for


def check_model_dir(path: str | Path) -> Path:
    """Cheap checks of a model folder (before any data is built or loaded); errors name the folder."""
    path = Path(path)
    if not path.is_dir():
        raise MmrlError(f"model folder not found: {path}")
    if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        adapter_base(path)  # a LoRA checkpoint: its base model must be found
        return path
    if not (path / "config.json").is_file():
        raise MmrlError(f"{path}: no config.json; expected a Hugging Face model folder (save_pretrained)")
    has_processor = any((path / name).is_file() for name in (
        "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"))
    if not has_processor:
        raise MmrlError(
            f"{path}: no processor (preprocessor_config.json or processor_config.json); "
            "save the processor beside the model with processor.save_pretrained(folder)")
    return path


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU (with a warning when the machine has
    GPUs that CUDA cannot use: :func:`mmrl.distributed.warn_cpu_fallback`)."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        from mmrl.distributed import warn_cpu_fallback

        warn_cpu_fallback()
        return torch.device("cpu")
    return torch.device(device)


def load_policy(path: str | Path, *, dtype: str = "fp32", attn_implementation: str = "sdpa",
                device: str = "auto") -> Policy:
    """Load any Qwen-VL folder in Hugging Face format onto ``device``; errors name the folder and what is
    missing."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    path = check_model_dir(path)
    if not (path / "config.json").is_file():  # a LoRA checkpoint: its base with the adapters merged in
        return _load_adapter_checkpoint(path, dtype=dtype, attn_implementation=attn_implementation, device=device)
    config = AutoConfig.from_pretrained(path)
    if config.model_type not in FAMILIES:
        raise MmrlError(f"{path}: model type '{config.model_type}' is not supported; "
                        f"mmrl trains {', '.join(FAMILIES)}")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch_dtype, attn_implementation=attn_implementation)
    if not hasattr(next(model.parameters()), "ds_id"):  # ZeRO-3 partitions already sit on their device
        model = model.to(resolve_device(device))
    policy = Policy(model, processor)
    policy.load_args = {"path": str(path), "dtype": dtype, "attn_implementation": attn_implementation,
                        "device": device}
    return policy


def adapter_base(folder: Path) -> Path:
    """The base model of a LoRA checkpoint (``adapter_config.json``'s ``base_model_name_or_path``): as saved
    when it is a folder; a relative one also against the run folder, whose ``config.yaml`` names the model the
    run started from. Errors say where it looked."""
    import json

    saved = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    tried = [Path(saved)] if saved else []
    if saved and not Path(saved).is_absolute():
        tried.append(folder.parent / saved)
    run_cfg = folder.parent / "config.yaml"
    if run_cfg.is_file():
        import yaml

        start = ((yaml.safe_load(run_cfg.read_text()) or {}).get("model") or {}).get("path")
        if start:
            tried.append(Path(start) if Path(start).is_absolute() else folder.parent / start)
    for cand in tried:
        if (cand / "config.json").is_file():
            return cand.resolve()
    raise MmrlError(f"{folder}: a LoRA checkpoint whose base model was not found (base_model_name_or_path "
                    f"{saved!r}; looked in {', '.join(str(t) for t in tried) or 'nothing'}); evaluate the run's "
                    "final/ folder (the merged model), or set base_model_name_or_path in its adapter_config.json")


def _load_adapter_checkpoint(folder: Path, **kwargs: Any) -> Policy:
    """A LoRA checkpoint (adapters and processor) as a model: the base loaded, the adapters merged in."""
    from peft import PeftModel

    policy = load_policy(adapter_base(folder), **kwargs)
    merged = PeftModel.from_pretrained(policy.model, str(folder)).merge_and_unload()
    from transformers import AutoProcessor

    out = Policy(merged, AutoProcessor.from_pretrained(folder))
    out.load_args = {**policy.load_args, "path": str(folder)}
    return out


class Policy:
    def __init__(self, model: torch.nn.Module, processor: Any):
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.family: str = model.config.model_type
        self.base = model.model  # the Qwen-VL base model: .visual, .language_model, get_rope_index
        self.media: dict[str, EncodedMedia] = MediaStore()
        self._calls = _CallCounter()  # media items the vision tower encoded, and its forward calls
        self.share_vision_features = True
        # Vision features reused across passes while the tower is unchanged (see vision_features)
        self.cache_vision_features = True
        self._weights_epoch = 0  # bumped by weights_changed()
        self._tower_memo: tuple[Any, str] | None = None  # (tower state, content digest) of a frozen tower
        # ZeRO-3 across ranks (the trainer sets it): every forward pass makes the same module calls on every
        # rank, whatever its data (see :attr:`rank_invariant`)
        self.rank_invariant = False
        # The hook holds a small counter, not this Policy: a copy of the model (the reference) must not
        # drag a second Policy (processor, media) along.
        self.base.visual.register_forward_hook(self._calls, with_kwargs=True)
        params = inspect.signature(self.base.get_rope_index).parameters
        self._rope_takes_seconds = "second_per_grid_ts" in params  # read before install() replaces it
        # M-RoPE by the pre-training rule in the model's own forward and generate too (see mmrl.rope)
        rope.install(model)
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        # End of a turn: <|im_end|>, the tokenizer's EOS and the model's generation-config EOS ids (real
        # Qwen-VL checkpoints list <|endoftext|> there too), so a sampled <|endoftext|> ends the reply.
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos]
        self.eos_ids = sorted({i for i in (tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id, *gen_eos)
                               if isinstance(i, int) and i >= 0})
        # The policy must never emit vision placeholders (a known cause of feature/token mismatches).
        self.suppress_ids = sorted({tok.convert_tokens_to_ids(t) for t in (
            "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
            if tok.convert_tokens_to_ids(t) is not None})

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # Set by the trainer under ZeRO-3 (the updater's gathered_for_generation): a context in which the whole
    # weights are local and forward passes make no collectives.
    gather_for_generation: Any = None
    # Set by the trainer under ZeRO-3 (the updater's gather_params): ``gather_params(params)`` is a context in
    # which those parameters are whole (mmrl.weights.stream_weights reads the weights through it).
    gather_params: Any = None
    # How load_policy loaded it (path, dtype, attn_implementation, device): a ZeRO-3-partitioned model's KL
    # reference is loaded again from them (a partitioned model cannot be copied)
    load_args: dict[str, Any] | None = None
    _generation_depth: int = 0

    @contextlib.contextmanager
    def generation_weights(self) -> Iterator[None]:
        """Inside, generation runs on the whole weights without collectives: under ZeRO-3 they are gathered
        once on entering (a collective: every rank enters together) and released on leaving, as TRL's
        ``unwrap_model_for_generation`` does, instead of a gather per module per generated token.
        Re-entrant (an inner block costs nothing); nothing to do without ZeRO-3."""
        if self.gather_for_generation is None or self._generation_depth:
            self._generation_depth += 1
            try:
                yield
            finally:
                self._generation_depth -= 1
            return
        with self.gather_for_generation():
            self._generation_depth += 1
            try:
                yield
            finally:
                self._generation_depth -= 1

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """Eval mode, gradient checkpointing off, no grad; the previous state comes back afterwards.

        Generation with the model left in train mode and gradient checkpointing on drops the KV cache
        and samples from a different distribution; every gradient-free pass goes through here.
        """
        model = self.model
        was_training = model.training
        checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
        if checkpointing:
            checkpointing_switch(model, False)
        model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            model.train(was_training)
            if checkpointing:
                checkpointing_switch(model, True)

    @property
    def vision_calls(self) -> int:
        """Media items the vision tower encoded (through this model), over its life."""
        return self._calls.n

    @vision_calls.setter
    def vision_calls(self, value: int) -> None:
        self._calls.n = value

    @property
    def tower_calls(self) -> int:
        """Forward calls of the vision tower (one per pass that encodes anything; dummy calls included)."""
        return self._calls.calls

    # ----------------------------------------------------------------------------------------- freezing
    def set_trainable(self, *, vision: bool = True, merger: bool = True, llm: bool = True) -> None:
        """Freeze switches for the vision tower (without merger), the merger, and the language model."""
        visual = self.base.visual
        for name, p in visual.named_parameters():
            is_merger = name.startswith(("merger", "deepstack_merger"))
            p.requires_grad_(merger if is_merger else vision)
        for p in self.base.language_model.parameters():
            p.requires_grad_(llm)
        for p in self.model.lm_head.parameters():
            p.requires_grad_(llm)

    # ---------------------------------------------------------------------------------------- encoding
    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        return self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def prompt_text(self, seq: TokenSeq) -> str:
        """The prompt of ``seq`` as the model saw it (the tokens before its first trained token, chat-template
        and vision tokens included), each run of a repeated media placeholder shown once with its count
        (``<|video_pad|>×96``), for the logged rollouts."""
        end = next((i for i, m in enumerate(seq.loss_mask) if m), len(seq.ids))
        ids, parts = seq.ids[:end], []
        i = 0
        while i < len(ids):
            j = i
            while j < len(ids) and ids[j] == ids[i] and seq.mm_types[j] != TEXT:
                j += 1
            if j - i > 1:
                parts.append(f"{self.tokenizer.decode([ids[i]])}×{j - i}")
                i = j
                continue
            j = i + 1
            while j < len(ids) and seq.mm_types[j] == TEXT:
                j += 1
            parts.append(self.tokenizer.decode(ids[i:j]))
            i = j
        return "".join(parts)

    def encode(self, text: str, media: Sequence[MediaInput] = ()) -> TokenSeq:
        """Tokenise rendered text with its media (placeholders expanded by the processor).

        Media are registered under their keys so forward passes can share their vision features.
        """
        images = [m.data for m in media if m.kind == "image"]
        videos = [m for m in media if m.kind == "video"]
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
        if videos:
            kwargs["videos"] = [v.data.frames for v in videos]
            kwargs["video_metadata"] = [v.data.metadata for v in videos]
            kwargs["do_sample_frames"] = False
        try:
            out = self.processor(**kwargs)
        except (ValueError, RuntimeError) as exc:
            # a media problem the user can skip (on_bad_sample: skip), named by its file
            paths = ", ".join(m.key.split("|")[0].split(":", 1)[-1] for m in media) or "(text only)"
            raise MediaError(paths, f"the processor rejected this media: {exc}") from exc
        ids = out["input_ids"][0].tolist()
        mm_types = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else [
            IMAGE if i == self.image_token_id else VIDEO if i == self.video_token_id else TEXT for i in ids]
        self._register(out, images=[m for m in media if m.kind == "image"], videos=videos)
        order = self._media_order(ids, media)
        return TokenSeq(ids=ids, mm_types=mm_types, media=order)

    @property
    def image_token_id(self) -> int:
        return self.model.config.image_token_id

    @property
    def video_token_id(self) -> int:
        return self.model.config.video_token_id

    def _register(self, out: Any, *, images: list[MediaInput], videos: list[MediaInput]) -> None:
        for kind, items, pix_key, grid_key in (
            ("image", images, "pixel_values", "image_grid_thw"),
            ("video", videos, "pixel_values_videos", "video_grid_thw"),
        ):
            if not items:
                continue
            grids = out[grid_key]
            offsets = [0]
            for g in grids:
                offsets.append(offsets[-1] + int(g.prod()))
            seconds = out.get("second_per_grid_ts") if kind == "video" else None
            for i, item in enumerate(items):
                pixels = out[pix_key][offsets[i]:offsets[i + 1]]
                known = self.media.get(item.key)
                if known is not None:
                    if not (known.pixel_values.shape == pixels.shape and torch.equal(known.pixel_values, pixels)):
                        raise MmrlError(
                            f"media key {item.key!r} is already registered with different pixels; give each "
                            "distinct image or video (a crop, a re-sampled clip) a key of its own")
                    continue
                sec = float(seconds[i]) if seconds is not None else None
                self.media[item.key] = EncodedMedia(
                    key=item.key, kind=kind, pixel_values=pixels, grid_thw=grids[i].clone(), second_per_grid=sec)

    def _media_order(self, ids: list[int], media: Sequence[MediaInput]) -> list[str]:
        """Media keys in placeholder order (images and videos interleaved as they appear in the text).

        A video may be split into several placeholder runs (Qwen3-VL puts a timestamp before each frame
        group), so runs are consumed until the item's token count is reached.
        """
        merge = self.base.visual.spatial_merge_size ** 2
        queues = {kind: [m.key for m in media if m.kind == kind] for kind in ("image", "video")}
        order: list[str] = []
        need = {"image": 0, "video": 0}
        for tok in ids:
            kind = "image" if tok == self.image_token_id else "video" if tok == self.video_token_id else None
            if kind is None:
                continue
            if need[kind] == 0:
                if not queues[kind]:
                    raise MmrlError(f"the prompt has more {kind} placeholders than {kind}s")
                key = queues[kind].pop(0)
                order.append(key)
                need[kind] = self.media[key].num_patches // merge
            need[kind] -= 1
        return order

    # ---------------------------------------------------------------------------------------- vision
    def clear_media(self) -> None:
        """Forget the encoded media and, with them, their cached vision features (one call, end of step)."""
        self.media.clear()

    def weights_changed(self) -> None:
        """The weights changed (the trainer calls this after each optimizer step): features a trainable tower
        computed before are not reused. In-place updates are caught without it too (the tower state in the
        tag holds each parameter's version counter); this covers updaters that swap tensors instead."""
        self._weights_epoch += 1

    def _feature_tag(self) -> Any:
        """The key under which this model's vision features may be cached and looked up now; None: not now.

        Invalidation is by the tag: it changes whenever the features could. The tower state is every tower
        parameter's and buffer's storage and version counter (an optimizer step, ``load_state_dict`` or an
        adapter swap writes in place and bumps them) plus its LoRA layers' on/off state.

        * A **frozen** tower (no tower parameter requires grad) is tagged by a digest of its weights' bytes
          (computed again only when the tower state changes): every pass of every model with an identical
          tower shares one encoding, with or without gradient, the policy and its reference (a copy of
          the policy, whose frozen tower never changes) included.
        * A **trainable** tower: only passes without gradient use the cache, tagged by this model, the tower
          state, :meth:`weights_changed`'s count and train/eval mode; passes with gradient run the tower.
        * Never with ``cache_vision_features`` or ``share_vision_features`` off, under :attr:`rank_invariant`
          (ZeRO-3: every pass runs the tower once on every rank), or in train mode for a tower with dropout.
        """
        if not (self.cache_vision_features and self.share_vision_features) or self.rank_invariant:
            return None
        visual = self.base.visual
        tensors = [*visual.parameters(), *visual.buffers()]
        adapters = _adapter_states(visual)
        state = (tuple((t.data_ptr(), t._version) for t in tensors), adapters)
        if visual.training and _has_dropout(visual):
            return None
        if any(p.requires_grad for p in visual.parameters()):
            if torch.is_grad_enabled():
                return None
            return ("live", id(self.model), self._weights_epoch, visual.training, state)
        if self._tower_memo is None or self._tower_memo[0] != state:
            self._tower_memo = (state, _weights_digest(visual, self.device))
        return ("frozen", self._tower_memo[1], adapters)

    def vision_features(self, keys: Iterable[str]) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
        """Encode each unique key's media: key -> (merged embeddings, deepstack features).

        The media not cached yet go through the vision tower in **one** call (images and videos together:
        the tower treats every item by its own grid). Features are cached on the media items under
        :meth:`_feature_tag` and reused by later passes with the same tag (rollout, reference, old log-probs
        and, for a frozen tower, the update), until the media are cleared at the end of the step."""
        return self._vision(keys)[0]

    def _vision(self, keys: Iterable[str]) -> tuple[dict[str, tuple[torch.Tensor, list[torch.Tensor]]],
                                                     torch.Tensor | None]:
        """:meth:`vision_features` and an *anchor*: under :attr:`rank_invariant` a pass with nothing to encode
        still runs the tower once, on a dummy input, and the anchor (0 times its output) must join the pass's
        result so that the tower's backward runs on every rank too (else None)."""
        tag = self._feature_tag()
        feats: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        todo: list[str] = []
        for key in dict.fromkeys(keys):
            cached = self.media[key].features.get(tag) if tag is not None else None
            if cached is not None:
                feats[key] = cached
            else:
                todo.append(key)
        if not todo:
            return feats, (self._dummy_tower() if self.rank_invariant else None)
        items = [self.media[k] for k in todo]
        pixels = torch.cat([m.pixel_values for m in items]).to(self.device)
        grids = torch.stack([m.grid_thw for m in items]).to(self.device)
        out = self.base.get_image_features(pixels, grids, return_dict=True)  # the tower videos go through too
        deepstack = getattr(out, "deepstack_features", None) or []
        if isinstance(self.media, MediaStore):
            self.media.vision_calls += len(items)
        for i, (key, m) in enumerate(zip(todo, items)):
            embeds, deep = out.pooler_output[i], [d[i] for d in deepstack]
            feats[key] = (embeds, deep)
            if tag is not None:
                if tag[0] == "live":  # this model's features from before its weights changed are stale
                    m.features = {t: f for t, f in m.features.items() if t[0] != "live" or t[1] != tag[1]}
                m.features[tag] = (embeds.detach(), [d.detach() for d in deep])
        return feats, None

    def _dummy_tower(self) -> torch.Tensor:
        """Run the vision tower on the smallest input it takes (one merged token of zeros) and return 0 times
        its output: the same module calls as a real pass, for ranks that have no media in it (ZeRO-3)."""
        visual = self.base.visual
        cfg = visual.config
        merge = int(getattr(cfg, "spatial_merge_size", 2))
        patch = int(cfg.in_channels) * int(cfg.temporal_patch_size) * int(cfg.patch_size) ** 2
        grid = torch.tensor([[1, merge, merge]], device=self.device)
        pixels = torch.zeros(merge * merge, patch, device=self.device)
        self._calls.counting = False  # not a media item
        try:
            out = self.base.get_image_features(pixels, grid, return_dict=True)
        finally:
            self._calls.counting = True
        parts = [*out.pooler_output, *(d for layer in getattr(out, "deepstack_features", None) or [] for d in layer)]
        return sum(p.sum() for p in parts) * 0.0

    def _encoder_outputs(self, seqs: Sequence[TokenSeq]) -> tuple[dict[str, Any], torch.Tensor | None]:
        """The ``mm_encoder_outputs`` of ``seqs`` and :meth:`_vision`'s anchor."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        anchor = None
        if self.share_vision_features or self.rank_invariant:
            feats, anchor = self._vision(k for s in seqs for k in s.media)
        else:  # one tower run per occurrence, as the peer frameworks do (for benchmarks)
            feats = None
        outputs: dict[str, Any] = {}
        for kind in ("image", "video"):
            keys = [k for s in seqs for k in s.media if self.media[k].kind == kind]
            if not keys:
                continue
            per_item = [feats[k] if feats is not None else self.vision_features([k])[k] for k in keys]
            out = BaseModelOutputWithPooling(pooler_output=tuple(f[0] for f in per_item))
            if per_item[0][1]:
                out["deepstack_features"] = [tuple(f[1][layer] for f in per_item)
                                             for layer in range(len(per_item[0][1]))]
            outputs[kind] = out
        return outputs, anchor

    def _grid_kwargs(self, seqs: Sequence[TokenSeq]) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        image_grids = [self.media[k].grid_thw for s in seqs for k in s.media if self.media[k].kind == "image"]
        videos = [self.media[k] for s in seqs for k in s.media if self.media[k].kind == "video"]
        if image_grids:
            kw["image_grid_thw"] = torch.stack(image_grids).to(self.device)
        if videos:
            kw["video_grid_thw"] = torch.stack([v.grid_thw for v in videos]).to(self.device)
            if self._rope_takes_seconds:
                kw["second_per_grid_ts"] = torch.tensor(
                    [v.second_per_grid if v.second_per_grid is not None else 1.0 for v in videos], device=self.device)
        return kw

    # ---------------------------------------------------------------------------------------- batching
    def pad(self, seqs: Sequence[TokenSeq], *, left: bool) -> dict[str, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(seqs), width), dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        loss = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            sl = slice(width - len(s), width) if left else slice(0, len(s))
            ids[i, sl] = torch.tensor(s.ids)
            types[i, sl] = torch.tensor(s.mm_types)
            attn[i, sl] = 1
            loss[i, sl] = torch.tensor(s.loss_mask)
        out = {"input_ids": ids, "mm_token_type_ids": types, "attention_mask": attn, "loss_mask": loss}
        return {k: v.to(self.device) for k, v in out.items()}

    def position_ids(self, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq]) -> torch.Tensor:
        """(3, B, L) M-RoPE positions for a padded batch, by the pre-training rule (:func:`mmrl.rope.rope_index`,
        the function the model's own forward and ``generate`` use too): text after a vision block resumes at
        the block's largest position + 1."""
        grid_kw = self._grid_kwargs(seqs)
        if not grid_kw:  # text only: plain positions on all three axes
            pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            return pos.unsqueeze(0).expand(3, -1, -1)
        pos, _ = rope.rope_index(
            self.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
            attention_mask=batch["attention_mask"], **grid_kw)
        return pos

    # ---------------------------------------------------------------------------------------- forward
    # Rows of the LM head that :meth:`forward_logprobs` computes at a time (None or 0: all rows at once, the
    # unchunked full log-softmax). At Qwen's 152k vocabulary one fp32 row is 0.6 MB, so 1024 rows are about
    # 0.6 GB per full-vocabulary tensor, whatever the micro-batch size.
    logprob_chunk_tokens: int | None = 1024
    # The prompt once per group in log-prob passes (see :meth:`forward_logprobs`); False: every sequence whole,
    # in one padded batch (set from train.shared_prefix).
    shared_prefix_forward: bool = True
    # Padding-free log-prob passes (:mod:`mmrl.packing`; set from train.padding_free): the plain pass and the
    # shared-prefix path's first pass pack their sequences without padding
    padding_free: bool = True

    def _packing_impl(self) -> str | None:
        """The attention implementation to pack for (see :attr:`padding_free`), or None: padded (off, or an
        implementation packing is not known to be exact with)."""
        return packing.attention_impl(self.base.language_model) if self.padding_free else None

    # Packed rows: None: one row under flash attention, under sdpa/eager the rows that cost least
    # (:func:`mmrl.packing.layout`); True: one row always (the GPU's layout, for tests and measurements)
    pack_one_row: bool | None = None
    _row_cost: Any = None  # packing.row_cost of the language model, on first use

    def _cost(self) -> Any:
        """:func:`packing.row_cost` of the language model (computed once)."""
        if self._row_cost is None:
            self._row_cost = packing.row_cost(self.base.language_model)
        return self._row_cost

    def _pack(self, batch: dict[str, torch.Tensor], position_ids: torch.Tensor, src: Sequence[int],
              lengths: Sequence[int], impl: str, **tree: Any) -> packing.Packed:
        """Sequences ``src[j]`` (their first ``lengths[j]`` tokens) of the padded ``batch``, packed for ``impl``
        (``tree``: :func:`packing.pack`'s ``offsets``, ``parents`` and ``units``)."""
        one_row = impl in packing.FLASH or bool(self.pack_one_row)
        return packing.pack(batch["input_ids"], batch["mm_token_type_ids"], position_ids, src, lengths,
                            one_row=one_row, pad_id=self.pad_id, cost=None if one_row else self._cost(), **tree)

    def _compute_dtype(self) -> torch.dtype:
        """The dtype of the language model's activations (an additive attention mask is built in it)."""
        return self.base.language_model.embed_tokens.weight.dtype

    def forward_logprobs(
        self, seqs: Sequence[TokenSeq], *, temperature: float = 1.0, with_entropy: bool = False,
        entropy_grad: bool = True, chunk_tokens: int | None = None, shared_prefix: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per-token log-probabilities (and entropies) of each sequence's own tokens.

        Returns ``(logps, entropies, mask)``, each (B, L): entry ``t`` scores token ``t`` given tokens
        ``< t``; ``mask`` is the loss mask (1 on policy-produced tokens). Only masked positions are
        computed through the LM head (the rest are 0), which keeps memory flat for long prompts.
        ``entropy_grad=False`` computes the entropies without a graph (for logging and shaping only).

        Memory: the masked rows go through the LM head ``chunk_tokens`` rows at a time (default
        :attr:`logprob_chunk_tokens`; 0 or a ``logprob_chunk_tokens`` of None: all at once). Each chunk
        keeps ``logit[target] - logsumexp(logits)`` and, when asked for, its entropy; its logits are not kept
        for backward but recomputed there one chunk at a time (activation checkpointing per chunk), so no
        full-vocabulary tensor of the whole micro-batch exists in forward or backward. The values and
        gradients equal those of the full log-softmax within fp32 round-off. With ``entropy_grad=True``
        each chunk keeps its own log-softmax graph while it is recomputed (more memory per chunk).

        Shared prefix (``shared_prefix``, default :attr:`shared_prefix_forward`): consecutive sequences with
        the same prompt (the tokens before the first trained one, and the same media) form a group; the
        group's longest common token prefix, which must hold all its vision tokens, goes through the language
        model once and the group's continuations attend to that one encoding (its KV cache). The results, and
        the gradients, which reach the prefix's computation once summed over the continuations, are those of
        the padded batch within round-off. Groups of one sequence, groups without a common prefix and groups
        with vision tokens after it take the padded path (in the same prefix pass, whole); so does the whole
        micro-batch with :attr:`share_vision_features` off. Activation checkpointing works as usual (the
        prefix's keys and values are written once and only read afterwards, so recomputation is exact).

        With sdpa or eager attention and padding-free passes, the shared prefix may instead run as one packed
        pass (:meth:`_one_pass`, chosen by cost: no second call of every module, no summing of each weight's
        gradients from two passes): each prompt once, followed by its continuations, each of which sees the
        prompt and itself.

        Padding-free (:attr:`padding_free`, :mod:`mmrl.packing`): the padded path and the shared-prefix path's
        first pass put their sequences back to back without padding, each with its own positions and attending
        to itself only (flash attention: one row and the kernel's variable-length call; sdpa/eager: a
        block-diagonal causal mask over the rows that cost least, :func:`mmrl.packing.layout`). The results and
        gradients are the padded batch's within round-off.
        """
        batch = self.pad(seqs, left=False)
        position_ids = self.position_ids(batch, seqs)
        mask = batch["loss_mask"].clone()
        mask[:, 0] = 0
        rows, cols = mask.nonzero(as_tuple=True)
        use_shared = self.shared_prefix_forward if shared_prefix is None else shared_prefix
        # share_vision_features off is the peer-framework baseline (every sequence on its own, its media
        # encoded per occurrence): the padded path
        plan = self._prefix_plan(seqs) if use_shared and (self.share_vision_features or self.rank_invariant) \
            else None
        if plan is None and use_shared and self.rank_invariant:  # the same two passes on every rank
            plan = [([i], 0) for i in range(len(seqs))]
        if plan is not None and self._one_pass(plan, seqs):
            hidden_rows = self._one_pass_hidden(seqs, batch, position_ids, plan, rows, cols)
        elif plan is not None:
            hidden_rows = self._shared_prefix_hidden(seqs, batch, position_ids, plan, rows, cols)
        elif (impl := self._packing_impl()) is not None:  # padding-free: the sequences back to back
            lengths = [len(s) for s in seqs]
            packed = self._pack(batch, position_ids, range(len(seqs)), lengths, impl)
            # media in the order their placeholders appear in the packed rows
            encoder_outputs, anchor = self._encoder_outputs([seqs[j] for j in packed.order])
            out = self.base(
                input_ids=packed.input_ids, position_ids=packed.position_ids,
                mm_token_type_ids=packed.mm_token_type_ids, mm_encoder_outputs=encoder_outputs or None,
                use_cache=False, **packed.model_kwargs(impl, self._compute_dtype()),
            )
            flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
            hidden_rows = flat[packed.flat_index(rows, cols - 1)]
            if anchor is not None:
                hidden_rows = hidden_rows + anchor
        else:
            encoder_outputs, anchor = self._encoder_outputs(seqs)
            out = self.base(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=position_ids,
                mm_token_type_ids=batch["mm_token_type_ids"], mm_encoder_outputs=encoder_outputs or None,
                use_cache=False,
            )
            hidden_rows = out.last_hidden_state[rows, cols - 1]
            if anchor is not None:
                hidden_rows = hidden_rows + anchor
        chunk = (self.logprob_chunk_tokens if chunk_tokens is None else chunk_tokens) or 0
        calls = 0
        if self.rank_invariant and chunk > 0:  # as many LM-head calls as the rank that needs the most
            from mmrl.distributed import world

            calls = world().max_int(-(-int(rows.numel()) // chunk))
        # Under ZeRO-3 a frozen LM head (LoRA) comes back empty to a checkpointed recomputation in backward
        # (measured with DeepSpeed 0.19.8: its weight is not gathered again there): its chunks keep their logits
        recompute = self.gather_params is None or any(p.requires_grad for p in self.model.lm_head.parameters())
        lp, ent = _token_logprobs(self.model.lm_head, hidden_rows, batch["input_ids"][rows, cols],
                                  temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                  chunk=chunk, calls=calls, recompute=recompute)
        logps = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), lp)
        entropies = None
        if ent is not None:
            entropies = torch.zeros(mask.shape, dtype=torch.float32, device=lp.device).index_put((rows, cols), ent)
        return logps, entropies, mask

    # ------------------------------------------------------------------------------------ shared prefix
    @contextlib.contextmanager
    def _cache_under_checkpointing(self) -> Iterator[None]:
        """Let checkpointed decoder layers keep the shared-prefix caches (HF drops any cache there, since its
        own caches grow again when a layer is recomputed in backward; :func:`_prefix_caches` do not)."""
        layers = [m for m in self.base.language_model.modules()
                  if getattr(m, "gradient_checkpointing", False) is True and "_can_checkpoint_with_cache" not in vars(m)]
        for m in layers:
            m._can_checkpoint_with_cache = True
        try:
            yield
        finally:
            for m in layers:
                del m._can_checkpoint_with_cache

    def _prefix_plan(self, seqs: Sequence[TokenSeq]) -> list[tuple[list[int], int]] | None:
        """Groups of consecutive rows with one prompt and media: ``[(rows, prefix length), ...]``, covering
        every row in order; a prefix length of 0 means the rows run whole (a group of one, no common prefix,
        vision tokens after the common prefix). None when no group shares a prefix."""
        def prompt_key(s: TokenSeq) -> tuple:
            first = s.loss_mask.index(1) if 1 in s.loss_mask else len(s)
            return tuple(s.ids[:first]), tuple(s.mm_types[:first]), tuple(s.media)

        groups: list[list[int]] = []
        last = None
        for i, s in enumerate(seqs):
            key = prompt_key(s)
            if groups and key == last:
                groups[-1].append(i)
            else:
                groups.append([i])
            last = key
        plan: list[tuple[list[int], int]] = []
        for group in groups:
            n = 0
            if len(group) > 1:
                first = seqs[group[0]]
                n = min(len(seqs[i]) for i in group) - 1  # every row keeps a token after the prefix
                for i in group[1:]:
                    s = seqs[i]
                    k = 0
                    while k < n and s.ids[k] == first.ids[k] and s.mm_types[k] == first.mm_types[k]:
                        k += 1
                    n = k
                if any(t != TEXT for i in group for t in seqs[i].mm_types[n:]):
                    n = 0  # vision tokens after the shared part: their features would be needed twice
            plan.append((group, n))
        if all(n == 0 for _, n in plan):
            return None
        return plan

    # The shared prefix in one packed pass (sdpa/eager, padding-free): each group's prompt, then its
    # continuations, each continuation seeing the prompt and itself (:meth:`_one_pass_hidden`). None: where the
    # cost model says it is cheaper than two passes; True/False force it (tests).
    shared_prefix_one_pass: bool | None = None
    # the second pass's own work (summing every weight's gradients from both passes, a second call of every
    # module) in multiply-adds per weight of a decoder layer, for the choice
    second_pass_cost: float = 30.0

    def _one_pass(self, plan: list[tuple[list[int], int]], seqs: Sequence[TokenSeq]) -> bool:
        """Whether the shared prefix runs as one packed pass instead of two (:meth:`_shared_prefix_hidden`).

        Only with a masked attention (sdpa/eager: flash attention's variable-length call cannot let a
        continuation see its prompt) and padding-free passes on, and never where every rank must make the same
        calls (ZeRO-3 gathers per call, and ranks may differ in whether they share a prefix). Two passes sum
        every weight's gradient from both (a parameter-sized add per weight, and a second call of every
        module); one pass computes each continuation's attention over its whole group's row, prompt and the
        other continuations included (masked, yet computed by sdpa/eager). By :func:`packing.row_cost`: one
        pass when its rows, all as wide as the widest group, cost no more than the two passes' tokens plus the
        extra pass's parameter-sized work."""
        if self.rank_invariant or self._packing_impl() not in packing.MASKED:
            return False
        if self.shared_prefix_one_pass is not None:
            return self.shared_prefix_one_pass
        cost = self._cost()
        q = (cost(2) - 2 * cost(1)) / 4  # cost(w) = w * (P + 2 * w * q)
        params = cost(1) - 2 * q
        one_row = bool(self.pack_one_row)

        def packed_price(lengths: list[int]) -> float:
            rows = packing.layout(lengths, one_row=one_row, cost=cost)
            return len(rows) * cost(max(sum(lengths[j] for j in r) for r in rows))

        lengths = [len(s) for s in seqs]
        one = packed_price([n + sum(lengths[i] - 1 - n for i in g) if n else lengths[i] - 1
                            for g, n in plan for i in (g[:1] if n else g)])
        prefixes = [n if n else lengths[i] for g, n in plan for i in (g[:1] if n else g)]
        rest = [lengths[i] - n for g, n in plan if n for i in g]
        width = max(rest)  # pass 2: padded continuations, each attending to the widest prefix and itself
        two = packed_price(prefixes) + len(rest) * width * (params + 2 * (max(prefixes) + width) * q)
        return one <= two + self.second_pass_cost * params

    def _one_pass_hidden(self, seqs: Sequence[TokenSeq], batch: dict[str, torch.Tensor],
                         position_ids: torch.Tensor, plan: list[tuple[list[int], int]],
                         rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Last hidden states at ``(rows, cols - 1)`` of the padded batch, from one packed pass: per group,
        its prompt (the shared prefix, with the vision features) once, then each row's continuation, which
        sees the prompt whole and its own earlier tokens (a 4-D mask, :func:`packing.pack` with parents), with
        its slice of the full sequence's positions; unshared rows whole. Each row's last token is left out
        (nothing reads its hidden state). The values and gradients are the padded batch's within round-off."""
        lengths = [len(s) for s in seqs]
        src: list[int] = []
        lens: list[int] = []
        offsets: list[int] = []
        parents: list[int] = []
        units: list[list[int]] = []
        item_pre = [0] * len(seqs)  # the packed item holding each row's first `split` tokens
        item_suf = [0] * len(seqs)  # the one holding the rest (but the last)
        split = [0] * len(seqs)

        def add(i: int, off: int, k: int, parent: int) -> int:
            src.append(i)
            offsets.append(off)
            lens.append(k)
            parents.append(parent)
            return len(src) - 1

        # a row's last token is left out: its hidden state would predict a token after the row
        for group, n in plan:
            if n == 0:
                for i in group:
                    j = add(i, 0, max(lengths[i] - 1, 1), -1)
                    item_pre[i] = item_suf[i] = j
                    split[i] = lengths[i]
                    units.append([j])
                continue
            p = add(group[0], 0, n, -1)
            unit = [p]
            for i in group:
                item_pre[i], split[i] = p, n
                if lengths[i] - 1 > n:  # else every hidden state it needs is the prompt's
                    item_suf[i] = add(i, n, lengths[i] - 1 - n, p)
                    unit.append(item_suf[i])
            units.append(unit)
        impl = self._packing_impl()
        packed = self._pack(batch, position_ids, src, lens, impl, offsets=offsets, parents=parents, units=units)
        # media: only prompts and unshared rows hold placeholders, in packed order
        media_seqs = [seqs[src[j]].head(lens[j]) for j in packed.order if parents[j] < 0]
        encoder_outputs, anchor = self._encoder_outputs(media_seqs)
        out = self.base(input_ids=packed.input_ids, position_ids=packed.position_ids,
                        mm_token_type_ids=packed.mm_token_type_ids, mm_encoder_outputs=encoder_outputs or None,
                        use_cache=False, **packed.model_kwargs(impl, self._compute_dtype()))
        flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        dev = rows.device
        pos = cols - 1
        cut = torch.tensor(split, device=dev)[rows]
        first = pos < cut
        item = torch.where(first, torch.tensor(item_pre, device=dev)[rows], torch.tensor(item_suf, device=dev)[rows])
        hidden = flat[packed.flat_index(item, torch.where(first, pos, pos - cut))]
        return hidden + anchor if anchor is not None else hidden

    def _shared_prefix_hidden(self, seqs: Sequence[TokenSeq], batch: dict[str, torch.Tensor],
                              position_ids: torch.Tensor, plan: list[tuple[list[int], int]],
                              rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Last hidden states at ``(rows, cols - 1)`` of the padded batch, each shared prefix run once.

        Pass 1 runs one row per shared group (its prefix, with the vision features) and every unshared row
        whole, right-padded together or, padding-free (:meth:`_packing_impl`), packed back to back, recording
        each layer's keys and values. Pass 2 runs every shared row's continuation, right-padded, attending to
        its group's recorded keys and values (selected along the batch, or gathered out of the packed rows:
        their gradient sums over the group) and its own, with the continuation's slice of the full sequence's
        M-RoPE positions and a 2-D mask over the prefix (its padding excluded) and the continuation. Pass 2
        stays padded: its continuations read different prefixes, which a packed row cannot express with one
        block-diagonal mask or flash attention's variable-length call (its keys are not the queries' own).
        """
        recorder_cls, reader_cls = _prefix_caches()
        dev = batch["input_ids"].device
        lengths = [len(s) for s in seqs]
        pre_src: list[int] = []  # source row of each pass-1 row
        pre_len: list[int] = []
        suf_src: list[int] = []  # source row of each pass-2 row
        suf_pre: list[int] = []  # its pass-1 row
        row_pre = [0] * len(seqs)  # pass-1 row of each source row
        row_suf = [-1] * len(seqs)  # pass-2 row (-1: none)
        row_split = [0] * len(seqs)  # tokens of the row computed in pass 1
        for group, n in plan:
            if n == 0:
                for i in group:
                    row_pre[i], row_split[i] = len(pre_src), lengths[i]
                    pre_src.append(i)
                    pre_len.append(lengths[i])
                continue
            p = len(pre_src)
            pre_src.append(group[0])
            pre_len.append(n)
            for i in group:
                row_pre[i], row_split[i], row_suf[i] = p, n, len(suf_src)
                suf_src.append(i)
                suf_pre.append(p)
        width = max(pre_len)
        src = torch.tensor(pre_src, device=dev)
        keep = torch.arange(width, device=dev)[None, :] < torch.tensor(pre_len, device=dev)[:, None]
        pre_attn = keep.long()
        pre_seqs = [seqs[i].head(k) for i, k in zip(pre_src, pre_len)]
        impl = self._packing_impl()
        packed = None
        if impl is not None:  # padding-free pass 1: the prefixes and unshared rows back to back
            packed = self._pack(batch, position_ids, pre_src, pre_len, impl)
            encoder_outputs, anchor = self._encoder_outputs([pre_seqs[j] for j in packed.order])
            inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
                      "mm_token_type_ids": packed.mm_token_type_ids,
                      **packed.model_kwargs(impl, self._compute_dtype())}
        else:
            encoder_outputs, anchor = self._encoder_outputs(pre_seqs)
            inputs = {"input_ids": batch["input_ids"][src, :width].masked_fill(~keep, self.pad_id),
                      "attention_mask": pre_attn, "position_ids": position_ids[:, src, :width] * keep,
                      "mm_token_type_ids": batch["mm_token_type_ids"][src, :width] * keep}
        recorded = recorder_cls()
        second_pass = bool(suf_src) or self.rank_invariant  # rank-invariant: pass 2 runs on every rank
        with self._cache_under_checkpointing():
            out = self.base(**inputs, mm_encoder_outputs=encoder_outputs or None,
                            past_key_values=recorded if second_pass else None, use_cache=False)
        pre_hidden = out.last_hidden_state
        if anchor is not None:
            pre_hidden = pre_hidden + anchor
        # where each (row, col - 1) lies: in pass 1's rows or in pass 2's
        pos = cols - 1
        split = torch.tensor(row_split, device=dev)[rows]
        in_pre = pos < split
        pre_row = torch.tensor(row_pre, device=dev)[rows]
        if packed is not None:
            pre_index = packed.flat_index(pre_row, pos.clamp(max=split - 1))
            rec_width = packed.width
            # pass 2 reads each group's prefix out of the packed rows, into a padded (prefix, width) layout
            last = packed.start + packed.start.new_tensor(pre_len) - 1
            prefix_cols = (packed.start[:, None] + torch.arange(width, device=dev)[None, :]).minimum(last[:, None])
        else:
            pre_index = pre_row * width + pos
            rec_width, prefix_cols = width, None
        if not suf_src:
            hidden = pre_hidden.reshape(-1, pre_hidden.shape[-1])[pre_index]
            if second_pass:  # a one-token dummy continuation, attending to nothing of pass 1's
                owner = torch.zeros(1, dtype=torch.long, device=dev)
                attn = torch.cat([pre_attn.new_zeros(1, rec_width),
                                  torch.ones(1, 1, dtype=pre_attn.dtype, device=dev)], dim=1)
                with self._cache_under_checkpointing():
                    dummy = self.base(input_ids=torch.full((1, 1), self.pad_id, device=dev), attention_mask=attn,
                                      position_ids=position_ids[:, :1, :1] * 0,
                                      mm_token_type_ids=torch.zeros(1, 1, dtype=torch.long, device=dev),
                                      past_key_values=reader_cls(recorded, owner), use_cache=False)
                hidden = hidden + dummy.last_hidden_state.sum() * 0.0
            return hidden
        starts = torch.tensor([row_split[i] for i in suf_src], device=dev)
        ends = torch.tensor([lengths[i] for i in suf_src], device=dev)
        suf_width = int((ends - starts).max())
        take = starts[:, None] + torch.arange(suf_width, device=dev)[None, :]
        suf_attn = (take < ends[:, None]).long()
        take = take.clamp(max=batch["input_ids"].shape[1] - 1)
        sidx = torch.tensor(suf_src, device=dev)[:, None]
        suf_ids = batch["input_ids"][sidx, take].masked_fill(suf_attn == 0, self.pad_id)
        suf_pos = position_ids[:, sidx, take] * suf_attn
        owner = torch.tensor(suf_pre, device=dev)
        attn = torch.cat([pre_attn[owner], suf_attn], dim=1)
        take = None if packed is None else (packed.row[owner][:, None], prefix_cols[owner])
        with self._cache_under_checkpointing():
            suf_out = self.base(input_ids=suf_ids, attention_mask=attn, position_ids=suf_pos,
                                mm_token_type_ids=torch.zeros_like(suf_ids),
                                past_key_values=reader_cls(recorded, owner, take), use_cache=False)
        suf_hidden = suf_out.last_hidden_state
        suf_index = torch.tensor(row_suf, device=dev)[rows].clamp(min=0) * suf_width + (pos - split).clamp(min=0)
        # gather each pass's rows, then put them back in (rows, cols) order
        first, second = in_pre.nonzero().squeeze(-1), (~in_pre).nonzero().squeeze(-1)
        gathered = torch.cat([pre_hidden.reshape(-1, pre_hidden.shape[-1])[pre_index[first]],
                              suf_hidden.reshape(-1, suf_hidden.shape[-1])[suf_index[second]]])
        return gathered[torch.cat([first, second]).argsort()]

    # ---------------------------------------------------------------------------------------- generate
    # Sampling several continuations of a prompt computes the prompt once and decodes its samples from copies
    # of its KV cache (:mod:`mmrl.generation`); False: generate repeats each prompt before its prefill
    # (set from rollout.prefill_once).
    prefill_once: bool = True

    @torch.no_grad()
    def generate(
        self, seqs: Sequence[TokenSeq], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
        top_k: int = 0, do_sample: bool = True, stop: Sequence[str] = (), num_return_sequences: int = 1,
        with_logprobs: bool = True, with_entropies: bool = False,
    ) -> list[list[Generation]]:
        """Sample continuations for each sequence (``num_return_sequences`` each), with their log-probs.

        Log-probabilities are those of the temperature-scaled distribution (before top-p/top-k), the same
        quantity :meth:`forward_logprobs` computes for training. They need every step's full-vocabulary
        logits; ``with_logprobs=False`` skips them (the trainer recomputes log-probs itself).

        With :attr:`prefill_once` (the default) and ``num_return_sequences`` > 1, each prompt (vision tokens
        included) goes through the model once and its samples are decoded from copies of its KV cache; the
        tokens drawn and their log-probs are those of the plain call (up to fp32 round-off).
        """
        if not do_sample and num_return_sequences > 1:  # greedy: n equal copies (HF refuses n > 1 here)
            once = self.generate(seqs, max_new_tokens=max_new_tokens, do_sample=False, stop=stop,
                                 with_logprobs=with_logprobs, with_entropies=with_entropies)
            return [[replace(g[0], token_ids=list(g[0].token_ids), logprobs=list(g[0].logprobs),
                             entropies=list(g[0].entropies))
                     for _ in range(num_return_sequences)] for g in once]
        from transformers import GenerationConfig

        from mmrl.generation import can_prefill_once, prefill_once_inputs

        batch = self.pad(seqs, left=True)
        encoder_outputs, _ = self._encoder_outputs(seqs)  # one tower call for the batch's media
        # each prompt through the model once, its samples decoded from copies of its cache (mmrl.generation)
        prefilled = can_prefill_once(self, seqs, num_return_sequences)
        # Finished rows are padded with a suppressed token (never sampled), so padding can never be
        # mistaken for a sampled EOS (the tokenizer's pad, <|endoftext|>, is an EOS of Qwen checkpoints).
        fill = self.suppress_ids[0] if self.suppress_ids else self.pad_id
        # A clean generation config: the checkpoint's own (repetition penalty, min_p, ...) would make the
        # sampling distribution differ from the one training computes log-probabilities for.
        # transformers fills every unset (None) field from the checkpoint's generation config, so the
        # neutral values of the processors that change the distribution are set explicitly.
        # A neutral value that still adds a logits processor is left unset (None) where the checkpoint leaves it
        # unset too: min_p=0.0 (it masks nothing, at a softmax and a sort per step) and min_new_tokens=0
        # (min_length becomes the prompt length, a check per step that never fires).
        own = getattr(self.model, "generation_config", None)
        min_p = None if getattr(own, "min_p", None) is None else 0.0
        min_new = None if not getattr(own, "min_new_tokens", None) else 0
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "typical_p": 1.0,
                    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0} if do_sample else {}
        gen = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=do_sample,
            num_return_sequences=1 if prefilled else num_return_sequences,
            eos_token_id=self.eos_ids, pad_token_id=fill, suppress_tokens=self.suppress_ids or None,
            output_logits=with_logprobs or with_entropies, return_dict_in_generate=True, repetition_penalty=1.0,
            encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
            min_length=0, min_new_tokens=min_new, renormalize_logits=False, **sampling,
            **({"stop_strings": list(stop)} if stop else {}))
        # synced_gpus off: generation is each rank's own (under ZeRO-3 inside generation_weights, the whole
        # weights local; transformers would otherwise turn it on while a DeepSpeed ZeRO-3 config is alive)
        kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                                  "mm_token_type_ids": batch["mm_token_type_ids"], "generation_config": gen,
                                  "synced_gpus": False}
        if stop:
            kwargs["tokenizer"] = self.tokenizer
        if prefilled:  # the B*n rows, positions and the prompts' expanded cache (which holds the media)
            kwargs.update(prefill_once_inputs(self, batch, seqs, encoder_outputs, num_return_sequences))
        elif encoder_outputs:
            kwargs["mm_encoder_outputs"] = encoder_outputs
            kwargs.update(self._grid_kwargs(seqs))
        out = self.model.generate(**kwargs)
        prompt_len = batch["input_ids"].shape[1]
        new = out.sequences[:, prompt_len:].cpu()
        logp = ent = None
        if with_logprobs or with_entropies:  # (B*n, T, V) float32: memory grows with length x vocabulary
            logits = torch.stack(out.logits, dim=1).float()
            scale = temperature if do_sample else 1.0
            logp_all = F.log_softmax(logits / scale, dim=-1)
            logp = logp_all.gather(-1, new.to(logits.device)[..., None]).squeeze(-1) if with_logprobs else None
            ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropies else None
            del logits, logp_all
        results: list[list[Generation]] = [[] for _ in seqs]
        for row in range(new.shape[0]):
            toks = new[row].tolist()
            n, finished = len(toks), False
            for j, t in enumerate(toks):
                if t in self.eos_ids:
                    n, finished = j + 1, True
                    break
                if t == fill:  # padding after a stop string ended this row
                    n, finished = j, True
                    break
            toks = toks[:n]
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            if not finished and stop and any(s in text for s in stop):
                finished = True
            results[row // num_return_sequences].append(Generation(
                token_ids=toks, text=text, logprobs=logp[row, :n].tolist() if logp is not None else [],
                finished=finished, entropies=ent[row, :n].tolist() if ent is not None else []))
        return results


# ---------------------------------------------------------------------------------------- shared prefix
@functools.cache
def _prefix_caches() -> tuple[type, type]:
    """The two KV caches of the shared-prefix forward (classes built on first use: transformers is imported
    lazily). Neither changes after a layer has written to it, so a layer recomputed in backward (activation
    checkpointing) sees what it saw in forward.

    * the recorder (pass 1) keeps each layer's first keys and values (its prefix rows) and returns them as
      they are; a recomputation's second write is ignored;
    * the reader (pass 2) returns, per layer, the recorded rows selected for each continuation (``owner``;
      after a packed pass 1, its prefix's tokens gathered out of the packed rows by ``take``) followed by the
      continuation's own keys and values, and stores nothing.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    class Recorder(DynamicCache):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            while len(self.layers) <= layer_idx:
                self.layers.append(DynamicLayer())
            layer = self.layers[layer_idx]
            if not layer.is_initialized:
                layer.lazy_initialization(key_states, value_states)
                layer.keys, layer.values = key_states, value_states
            return key_states, value_states

    class Reader(DynamicCache):
        def __init__(self, recorded: DynamicCache, owner: torch.Tensor,
                     take: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
            super().__init__()
            self.layers = list(recorded.layers)
            self.owner = owner
            # packed pass 1: each continuation's packed row (n, 1) and its prefix's columns there (n, width)
            self.take = take

        def _rows(self, t: torch.Tensor) -> torch.Tensor:
            if self.take is None:
                return t.index_select(0, self.owner)
            row, col = self.take  # (rows, heads, width, dim)[row, :, col] is (n, width, heads, dim)
            return t[row, :, col].transpose(1, 2)

        # the length the attention mask is built for: the recorded width, or the gathered prefixes' width
        def get_seq_length(self, layer_idx: int = 0) -> int:
            return super().get_seq_length(layer_idx) if self.take is None else int(self.take[1].shape[1])

        def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
            if self.take is None:
                return super().get_mask_sizes(query_length, layer_idx)
            return int(self.take[1].shape[1]) + query_length, 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            layer = self.layers[layer_idx]
            return (torch.cat([self._rows(layer.keys), key_states], dim=-2),
                    torch.cat([self._rows(layer.values), value_states], dim=-2))

    return Recorder, Reader


# ---------------------------------------------------------------------------------------- log-probs
def _token_logprobs(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                    *, with_entropy: bool, entropy_grad: bool, chunk: int, calls: int = 0,
                    recompute: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) fp32 log-probs of ``targets`` (and entropies) under ``lm_head(hidden) / temperature``.

    ``chunk`` > 0: ``chunk`` rows at a time, each under non-reentrant activation checkpointing, so forward
    and backward hold one chunk's full-vocabulary tensors at a time; 0: the full log-softmax at once.
    ``calls``: call the LM head at least this many times, the extra calls on one dummy row whose result
    joins the output times 0 (ZeRO-3: every rank makes the same calls, forward and backward). ``recompute``
    False: no checkpointing, each chunk keeps its logits for backward (more memory).
    """
    if chunk <= 0:
        return _full_logprobs(lm_head, hidden, targets, temperature, with_entropy=with_entropy,
                              entropy_grad=entropy_grad)
    graph = recompute and torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    logps, ents = [], []
    pieces = list(zip(hidden.split(chunk), targets.split(chunk)))
    anchor = None
    for _ in range(max(0, calls - len(pieces))):
        # in the graph of ``hidden`` (when it has one), so the LM head's backward runs for it too
        h = hidden.new_zeros(1, hidden.shape[-1]) + hidden.sum() * 0.0
        fn = _ChunkLogprobs(lm_head, temperature, False)
        out = checkpoint(fn, h, targets.new_zeros(1), use_reentrant=False) if graph else fn(h, targets.new_zeros(1))
        anchor = out.sum() * 0.0 if anchor is None else anchor + out.sum() * 0.0
    for h, t in pieces:
        if with_entropy and entropy_grad:
            fn: Any = functools.partial(_chunk_logprobs_with_entropy, lm_head, temperature=temperature)
        else:
            fn = _ChunkLogprobs(lm_head, temperature, with_entropy)
        out = checkpoint(fn, h, t, use_reentrant=False) if graph else fn(h, t)
        if isinstance(fn, _ChunkLogprobs):
            logps.append(out)
            ents.append(fn.entropy)
        else:
            logps.append(out[0])
            ents.append(out[1])
    if not logps:  # nothing masked
        empty = hidden.new_zeros(0, dtype=torch.float32)
        if anchor is not None:
            empty = empty + anchor
        return empty, (hidden.new_zeros(0, dtype=torch.float32) if with_entropy else None)
    lp = torch.cat(logps)
    return (lp if anchor is None else lp + anchor), (torch.cat(ents) if with_entropy else None)


def _full_logprobs(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   *, with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unchunked path: the full (N, vocabulary) fp32 log-softmax, kept for backward (the reference)."""
    logits = lm_head(hidden).float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)
    return logps, ent


def _chunk_logprobs_with_entropy(lm_head: torch.nn.Module, h: torch.Tensor, t: torch.Tensor, *,
                                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, entropies with gradient: the plain log-softmax graph (recomputed per chunk in backward)."""
    logp_all = F.log_softmax(lm_head(h).float() / temperature, dim=-1)
    return logp_all.gather(-1, t[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


class _ChunkLogprobs:
    """One chunk's log-probs of its targets, the function :func:`torch.utils.checkpoint.checkpoint` runs.

    The entropy (no gradient) is taken on the first call only and kept in :attr:`entropy`: the second call,
    checkpointing's recomputation in backward, needs the logits alone.
    """

    def __init__(self, lm_head: torch.nn.Module, temperature: float, with_entropy: bool) -> None:
        self.lm_head, self.temperature, self.with_entropy = lm_head, temperature, with_entropy
        self.entropy: torch.Tensor | None = None

    def __call__(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        want = self.with_entropy and self.entropy is None
        logp, ent = _TargetLogprob.apply(self.lm_head(h), t, self.temperature, want)
        if want:
            self.entropy = ent
        return logp


_ROW_BLOCK = 128  # rows per temporary inside one chunk (128 x 152k fp32 = 78 MB)


class _TargetLogprob(torch.autograd.Function):
    """``log_softmax(logits / T)[target]`` (fp32) keeping only the logits (in their own dtype) and the
    logsumexp for backward, where the gradient ``(onehot - softmax) * g / T`` is built in one fp32 buffer.
    The second output is the entropy when asked for (else empty), without gradient."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = logits.float() / temperature  # a new fp32 tensor: the logits stay as they are
        # logsumexp and the entropy a few rows at a time: their temporaries are never a third chunk-sized
        # tensor (each row's value is the same either way)
        lse = torch.cat([torch.logsumexp(rows, dim=-1) for rows in logp_all.split(_ROW_BLOCK)])
        logp_all.sub_(lse[:, None])
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        ent = (torch.cat([-(rows.exp().mul_(rows)).sum(-1) for rows in logp_all.split(_ROW_BLOCK)])
               if with_entropy else logp.new_zeros(0))
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[torch.Tensor, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        temperature = ctx.temperature
        out = (logits.float() / temperature).sub_(lse[:, None]).exp_()  # softmax
        out.mul_(-grad[:, None]).scatter_add_(-1, targets[:, None], grad[:, None]).div_(temperature)
        return out.to(logits.dtype), None, None, None


def _has_dropout(module: torch.nn.Module) -> bool:
    """A dropout with a non-zero rate anywhere in ``module`` (its train-mode output is random)."""
    return any((isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0)
               or float(getattr(m, "attention_dropout", 0) or 0) > 0 for m in module.modules())


def _adapter_states(module: torch.nn.Module) -> tuple:
    """The on/off state and active adapters of each PEFT (LoRA) layer in ``module``: ``disable_adapter()``
    changes what the layers compute without touching a weight."""
    if "peft" not in sys.modules:  # no adapter layer can exist
        return ()
    from peft.tuners.tuners_utils import BaseTunerLayer

    return tuple((bool(m.disable_adapters), tuple(m.active_adapters)) for m in module.modules()
                 if isinstance(m, BaseTunerLayer))


def _weights_digest(module: torch.nn.Module, device: torch.device) -> str:
    """A digest of a module's parameters and buffers (names, dtypes, shapes and bytes) and its device: equal
    digests, equal weights."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{type(module).__name__}|{device}".encode())
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        t = t.detach()
        h.update(f"|{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


class _CallCounter:
    """A forward hook on the vision tower: ``n`` counts the media items it encoded (the rows of its
    ``grid_thw``; dummy calls are not counted), ``calls`` its forward calls."""

    def __init__(self) -> None:
        self.n = 0
        self.calls = 0
        self.counting = True

    def __call__(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        self.calls += 1
        if not self.counting:
            return
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        self.n += int(grid.shape[0]) if isinstance(grid, torch.Tensor) and grid.dim() == 2 else 1


def checkpointing_switch(model: torch.nn.Module, on: bool) -> None:
    """Turn activation (gradient) checkpointing on or off, by the name this transformers release uses."""
    verb = "enable" if on else "disable"
    fn = getattr(model, f"activation_checkpointing_{verb}", None) or getattr(model, f"gradient_checkpointing_{verb}")
    fn()
