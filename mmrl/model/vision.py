"""Media encoding and the vision-feature cache of a policy.

**Vision features once.** Every media item has a key. In one forward pass (or one ``generate`` call) the vision
tower runs once per unique key and the features are shared by every sequence that shows the item (the G
rollouts of a prompt, a re-asked prompt, later turns). Gradients still flow into the tower when it is
trainable, since the shared tensor is part of the graph. Features are cached on the media items under a tag
that changes whenever they could (:meth:`VisionEncoder.feature_tag`), and dropped with the media at the end of
each step.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from mmrl_common.errors import MediaError, MmrlError

from .types import IMAGE, TEXT, VIDEO, EncodedMedia, MediaInput, MediaStore, PolicyParts, TokenSeq

Features = dict[str, tuple[torch.Tensor, list[torch.Tensor]]]


class VisionEncoder:
    """A policy's media encoding (processor, registration in its media store, placeholder order) and vision
    features (one tower call per pass for what is not cached; the cache's tags). It keeps the counters and
    memos of the policy's vision tower; the settings are the policy's (:class:`~mmrl.model.PolicyOptions`,
    :class:`~mmrl.model.RankBinding`)."""

    def __init__(self, policy: PolicyParts) -> None:
        self.policy = policy
        # The hook holds a small counter, not the Policy: a copy of the model (the reference) must not drag a
        # second Policy (processor, media) along.
        self.calls = CallCounter()  # media items the vision tower encoded, and its forward calls
        policy.base.visual.register_forward_hook(self.calls, with_kwargs=True)
        self.weights_epoch = 0  # bumped by weights_changed()
        self.tower_memo: tuple[Any, str] | None = None  # (tower state, content digest) of a frozen tower
        self.listener: Callable[[Sequence[MediaInput]], None] | None = None

    def on_encode(self, listener: Callable[[Sequence[MediaInput]], None] | None) -> None:
        """Call ``listener(media)`` after each successful :meth:`encode` (one listener: the latest replaces
        the one before; None removes it). The vLLM backend keeps the media's source this way."""
        self.listener = listener

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
            out = self.policy.processor(**kwargs)
        except (ValueError, RuntimeError) as exc:
            # a media problem the user can skip (on_bad_sample: skip), named by its file
            paths = ", ".join(m.key.split("|")[0].split(":", 1)[-1] for m in media) or "(text only)"
            raise MediaError(paths, f"the processor rejected this media: {exc}") from exc
        ids = out["input_ids"][0].tolist()
        mm_types = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else [
            IMAGE if i == self.policy.image_token_id else VIDEO if i == self.policy.video_token_id else TEXT for i in ids]
        self.register(out, images=[m for m in media if m.kind == "image"], videos=videos)
        order = self.media_order(ids, media)
        if self.listener is not None:
            self.listener(media)
        return TokenSeq(ids=ids, mm_types=mm_types, media=order)


    def register(self, out: Any, *, images: list[MediaInput], videos: list[MediaInput]) -> None:
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
                known = self.policy.media.get(item.key)
                if known is not None:
                    if not (known.pixel_values.shape == pixels.shape and torch.equal(known.pixel_values, pixels)):
                        raise MmrlError(
                            f"media key {item.key!r} is already registered with different pixels; give each "
                            "distinct image or video (a crop, a re-sampled clip) a key of its own")
                    continue
                sec = float(seconds[i]) if seconds is not None else None
                self.policy.media[item.key] = EncodedMedia(
                    key=item.key, kind=kind, pixel_values=pixels, grid_thw=grids[i].clone(), second_per_grid=sec)

    def media_order(self, ids: list[int], media: Sequence[MediaInput]) -> list[str]:
        """Media keys in placeholder order (images and videos interleaved as they appear in the text).

        A video may be split into several placeholder runs (Qwen3-VL puts a timestamp before each frame
        group), so runs are consumed until the item's token count is reached.
        """
        merge = self.policy.base.visual.spatial_merge_size ** 2
        queues = {kind: [m.key for m in media if m.kind == kind] for kind in ("image", "video")}
        order: list[str] = []
        need = {"image": 0, "video": 0}
        for tok in ids:
            kind = "image" if tok == self.policy.image_token_id else "video" if tok == self.policy.video_token_id else None
            if kind is None:
                continue
            if need[kind] == 0:
                if not queues[kind]:
                    raise MmrlError(f"the prompt has more {kind} placeholders than {kind}s")
                key = queues[kind].pop(0)
                order.append(key)
                need[kind] = self.policy.media[key].num_patches // merge
            need[kind] -= 1
        return order

    # ---------------------------------------------------------------------------------------- vision
    def weights_changed(self) -> None:
        """The weights changed (the trainer calls this after each optimizer step): features a trainable tower
        computed before are not reused. In-place updates are caught without it too (the tower state in the
        tag holds each parameter's version counter); this covers updaters that swap tensors instead."""
        self.weights_epoch += 1

    def feature_tag(self) -> Any:
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
        * Never with ``cache_vision_features`` or ``share_vision_features`` off, under a rank binding (:class:`~mmrl.model.RankBinding`)
          (ZeRO-3: every pass runs the tower once on every rank), or in train mode for a tower with dropout.
        """
        opts, invariant = self.policy.options, self.policy.binding.invariant
        if not (opts.cache_vision_features and opts.share_vision_features) or invariant:
            return None
        visual = self.policy.base.visual
        tensors = [*visual.parameters(), *visual.buffers()]
        adapters = adapter_states(visual)
        state = (tuple((t.data_ptr(), t._version) for t in tensors), adapters)
        if visual.training and has_dropout(visual):
            return None
        if any(p.requires_grad for p in visual.parameters()):
            if torch.is_grad_enabled():
                return None
            return ("live", id(self.policy.model), self.weights_epoch, visual.training, state)
        if self.tower_memo is None or self.tower_memo[0] != state:
            self.tower_memo = (state, weights_digest(visual, self.policy.device))
        return ("frozen", self.tower_memo[1], adapters)

    def features(self, keys: Iterable[str]) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
        """Encode each unique key's media: key -> (merged embeddings, deepstack features).

        The media not cached yet go through the vision tower in **one** call (images and videos together:
        the tower treats every item by its own grid). Features are cached on the media items under
        :meth:`feature_tag` and reused by later passes with the same tag (rollout, reference, old log-probs
        and, for a frozen tower, the update), until the media are cleared at the end of the step."""
        return self.run(keys)[0]

    def run(self, keys: Iterable[str]) -> tuple[dict[str, tuple[torch.Tensor, list[torch.Tensor]]],
                                                     torch.Tensor | None]:
        """:meth:`features` and an *anchor*: under a rank binding (:class:`~mmrl.model.RankBinding`) a pass with nothing to encode
        still runs the tower once, on a dummy input, and the anchor (0 times its output) must join the pass's
        result so that the tower's backward runs on every rank too (else None)."""
        tag = self.feature_tag()
        feats: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        todo: list[str] = []
        for key in dict.fromkeys(keys):
            cached = self.policy.media[key].features.get(tag) if tag is not None else None
            if cached is not None:
                feats[key] = cached
            else:
                todo.append(key)
        if not todo:
            return feats, (self.dummy_tower() if self.policy.binding.invariant else None)
        items = [self.policy.media[k] for k in todo]
        pixels = torch.cat([m.pixel_values for m in items]).to(self.policy.device)
        grids = torch.stack([m.grid_thw for m in items]).to(self.policy.device)
        out = self.policy.base.get_image_features(pixels, grids, return_dict=True)  # the tower videos go through too
        deepstack = getattr(out, "deepstack_features", None) or []
        if isinstance(self.policy.media, MediaStore):
            self.policy.media.count_vision_calls(len(items))
        for i, (key, m) in enumerate(zip(todo, items)):
            embeds, deep = out.pooler_output[i], [d[i] for d in deepstack]
            feats[key] = (embeds, deep)
            if tag is not None:
                if tag[0] == "live":  # this model's features from before its weights changed are stale
                    for stale in [t for t in m.features if t[0] == "live" and t[1] == tag[1]]:
                        del m.features[stale]
                m.features[tag] = (embeds.detach(), [d.detach() for d in deep])
        return feats, None

    def dummy_tower(self) -> torch.Tensor:
        """Run the vision tower on the smallest input it takes (one merged token of zeros) and return 0 times
        its output: the same module calls as a real pass, for ranks that have no media in it (ZeRO-3)."""
        visual = self.policy.base.visual
        cfg = visual.config
        merge = int(getattr(cfg, "spatial_merge_size", 2))
        patch = int(cfg.in_channels) * int(cfg.temporal_patch_size) * int(cfg.patch_size) ** 2
        grid = torch.tensor([[1, merge, merge]], device=self.policy.device)
        pixels = torch.zeros(merge * merge, patch, device=self.policy.device)
        self.calls.counting = False  # not a media item
        try:
            out = self.policy.base.get_image_features(pixels, grid, return_dict=True)
        finally:
            self.calls.counting = True
        parts = [*out.pooler_output, *(d for layer in getattr(out, "deepstack_features", None) or [] for d in layer)]
        return sum(p.sum() for p in parts) * 0.0

    def encoder_outputs(self, seqs: Sequence[TokenSeq]) -> tuple[dict[str, Any], torch.Tensor | None]:
        """The ``mm_encoder_outputs`` of ``seqs`` and :meth:`run`'s anchor."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        anchor = None
        if self.policy.options.share_vision_features or self.policy.binding.invariant:
            feats, anchor = self.run(k for s in seqs for k in s.media)
        else:  # one tower run per occurrence, as the peer frameworks do (for benchmarks)
            feats = None
        outputs: dict[str, Any] = {}
        for kind in ("image", "video"):
            keys = [k for s in seqs for k in s.media if self.policy.media[k].kind == kind]
            if not keys:
                continue
            per_item = [feats[k] if feats is not None else self.features([k])[k] for k in keys]
            out = BaseModelOutputWithPooling(pooler_output=tuple(f[0] for f in per_item))
            if per_item[0][1]:
                out["deepstack_features"] = [tuple(f[1][layer] for f in per_item)
                                             for layer in range(len(per_item[0][1]))]
            outputs[kind] = out
        return outputs, anchor


def has_dropout(module: torch.nn.Module) -> bool:
    """A dropout with a non-zero rate anywhere in ``module`` (its train-mode output is random)."""
    return any((isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0)
               or float(getattr(m, "attention_dropout", 0) or 0) > 0 for m in module.modules())


def adapter_states(module: torch.nn.Module) -> tuple:
    """The on/off state and active adapters of each PEFT (LoRA) layer in ``module``: ``disable_adapter()``
    changes what the layers compute without touching a weight."""
    if "peft" not in sys.modules:  # no adapter layer can exist
        return ()
    from peft.tuners.tuners_utils import BaseTunerLayer

    return tuple((bool(m.disable_adapters), tuple(m.active_adapters)) for m in module.modules()
                 if isinstance(m, BaseTunerLayer))


def weights_digest(module: torch.nn.Module, device: torch.device) -> str:
    """A digest of a module's parameters and buffers (names, dtypes, shapes and bytes) and its device: equal
    digests, equal weights."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{type(module).__name__}|{device}".encode())
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        t = t.detach()
        h.update(f"|{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


class CallCounter:
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
