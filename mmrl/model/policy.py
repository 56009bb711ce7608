"""The policy: a Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, and the MoE ones) with its processor,
behind one front.

It renders chats, turns prompts into token sequences, generates, and computes per-token log-probabilities and
entropies. The work lives beside it, one job per module: media encoding and the vision-feature cache
(:mod:`.vision`), model inputs and M-RoPE positions (:mod:`.inputs`), log-prob passes (:mod:`.logprobs`,
:mod:`.shared_prefix`, :mod:`.logprob_head`), generation (:mod:`.generation`). How it computes is fixed when
it is built: :class:`~.options.PolicyOptions` (from the run config) and :class:`~.options.RankBinding` (across
data-parallel ranks), both frozen; :meth:`Policy.configure` and :meth:`Policy.bind_ranks` replace them, and
:meth:`Policy.reference` makes the KL reference with the same processor, options and media store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from . import generation, inputs, logprobs, recurrent, rope, sequence_parallel
from .options import PolicyOptions, RankBinding
from .types import EncodedMedia, Generation, MediaInput, MediaStore, TokenSeq
from .vision import VisionEncoder


class Policy:
    def __init__(self, model: torch.nn.Module, processor: Any, *, options: PolicyOptions | None = None,
                 binding: RankBinding | None = None, media: MediaStore | None = None,
                 load_args: dict[str, Any] | None = None):
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.family: str = model.config.model_type
        self.base = model.model  # the Qwen-VL base model: .visual, .language_model, get_rope_index
        # the encoded media by key, shared with the KL reference (same keys, same features)
        self.media: dict[str, EncodedMedia] = media if media is not None else MediaStore()
        self.options = recurrent.fit_options(self.family, options or PolicyOptions())
        self.binding = binding or RankBinding()
        # How load_policy loaded it (path, dtype, attn_implementation, device): a ZeRO-3-partitioned model's KL
        # reference is loaded again from them (a partitioned model cannot be copied)
        self.load_args = load_args
        self._generation_depth = 0
        params = inspect.signature(self.base.get_rope_index).parameters
        self.rope_takes_seconds = "second_per_grid_ts" in params  # read before install() replaces it
        # M-RoPE by the pre-training rule in the model's own forward and generate too (see mmrl.model.rope)
        rope.install(model)
        self.vision = VisionEncoder(self)
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

    # ------------------------------------------------------------------------------------- settings
    def configure(self, options: PolicyOptions | None = None, **changes: Any) -> Policy:
        """New options: ``options`` whole, and/or ``changes`` to single fields (``padding_free=False``).
        Unknown names are an error. Returns the policy."""
        unknown = sorted(set(changes) - set(PolicyOptions.names()))
        if unknown:
            raise TypeError(f"unknown policy option(s) {unknown}; known: {', '.join(PolicyOptions.names())}")
        self.options = recurrent.fit_options(self.family, dataclasses.replace(options or self.options, **changes))
        return self

    def bind_ranks(self, binding: RankBinding) -> None:
        """How the passes behave across data-parallel ranks (:class:`RankBinding`; the trainer binds it once,
        when its updater exists)."""
        self.binding = binding

    def reference(self, model: torch.nn.Module) -> Policy:
        """The KL reference with ``model`` (a copy of this policy's model): the same processor, options, media
        store (same keys, and a frozen tower's cached features) and rank invariance; whole weights of its own
        (no gathering for generation or weight reads)."""
        return Policy(model, self.processor, options=self.options, media=self.media, load_args=self.load_args,
                      binding=RankBinding(invariant=self.binding.invariant, max_int=self.binding.max_int,
                                          sequence_group=self.binding.sequence_group))

    def on_encode(self, listener: Callable[[Sequence[MediaInput]], None] | None) -> None:
        """``listener(media)`` after each successful :meth:`encode` (:meth:`VisionEncoder.on_encode`)."""
        self.vision.on_encode(listener)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def generation_weights(self) -> Iterator[None]:
        """Inside, generation runs on the whole weights without collectives: under ZeRO-3 they are gathered
        once on entering (a collective: every rank enters together) and released on leaving, as TRL's
        ``unwrap_model_for_generation`` does, instead of a gather per module per generated token.
        Re-entrant (an inner block costs nothing); nothing to do without ZeRO-3."""
        gather = self.binding.gather_for_generation
        with gather() if gather is not None and not self._generation_depth else contextlib.nullcontext():
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
        return self.vision.calls.n

    @property
    def tower_calls(self) -> int:
        """Forward calls of the vision tower (one per pass that encodes anything; dummy calls included)."""
        return self.vision.calls.calls

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
        """:func:`mmrl.model.inputs.prompt_text` with this policy's tokenizer."""
        return inputs.prompt_text(self.tokenizer, seq)

    def encode(self, text: str, media: Sequence[MediaInput] = ()) -> TokenSeq:
        """Tokenise rendered text with its media (placeholders expanded by the processor); the media are
        registered under their keys so forward passes share their vision features (:mod:`.vision`)."""
        return self.vision.encode(text, media)

    @property
    def image_token_id(self) -> int:
        return self.model.config.image_token_id

    @property
    def video_token_id(self) -> int:
        return self.model.config.video_token_id

    def clear_media(self) -> None:
        """Forget the encoded media and, with them, their cached vision features (one call, end of step)."""
        self.media.clear()

    def weights_changed(self) -> None:
        """The weights changed (the trainer calls this after each optimizer step)."""
        self.vision.weights_changed()

    def vision_features(self, keys: Iterable[str]) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
        """Each unique key's (merged embeddings, deepstack features) (:meth:`VisionEncoder.features`)."""
        return self.vision.features(keys)

    def pad(self, seqs: Sequence[TokenSeq], *, left: bool) -> dict[str, torch.Tensor]:
        return inputs.pad(seqs, left=left, pad_id=self.pad_id, device=self.device)

    def position_ids(self, batch: dict[str, torch.Tensor], seqs: Sequence[TokenSeq]) -> torch.Tensor:
        """(3, B, L) M-RoPE positions of a padded batch (:func:`mmrl.model.inputs.position_ids`)."""
        return inputs.position_ids(self, batch, seqs)

    # ------------------------------------------------------------------------------------------ passes
    def forward_logprobs(
        self, seqs: Sequence[TokenSeq], *, temperature: float = 1.0, with_entropy: bool = False,
        entropy_grad: bool = True, chunk_tokens: int | None = None, shared_prefix: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(logps, entropies, mask)`` of each sequence's own tokens, each (B, L)
        (:func:`mmrl.model.logprobs.forward_logprobs`; under a sequence-parallel group,
        :func:`mmrl.model.sequence_parallel.forward_logprobs`: the same values, each rank of the group computing a
        slice of the tokens)."""
        group = self.binding.sequence_group
        if group is not None and group.active:
            return sequence_parallel.forward_logprobs(self, seqs, group, temperature=temperature,
                                                      with_entropy=with_entropy, entropy_grad=entropy_grad,
                                                      chunk_tokens=chunk_tokens)
        return logprobs.forward_logprobs(self, seqs, temperature=temperature, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad, chunk_tokens=chunk_tokens,
                                         shared_prefix=shared_prefix)

    def generate(
        self, seqs: Sequence[TokenSeq], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
        top_k: int = 0, do_sample: bool = True, stop: Sequence[str] = (), num_return_sequences: int = 1,
        with_logprobs: bool = True, with_entropies: bool = False,
    ) -> list[list[Generation]]:
        """``num_return_sequences`` sampled continuations of each sequence with their log-probabilities
        (:func:`mmrl.model.generation.generate`)."""
        return generation.generate(
            self, seqs, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            do_sample=do_sample, stop=stop, num_return_sequences=num_return_sequences,
            with_logprobs=with_logprobs, with_entropies=with_entropies)


def checkpointing_switch(model: torch.nn.Module, on: bool) -> None:
    """Turn activation (gradient) checkpointing on or off, by the name this transformers release uses."""
    verb = "enable" if on else "disable"
    fn = getattr(model, f"activation_checkpointing_{verb}", None) or getattr(model, f"gradient_checkpointing_{verb}")
    fn()
