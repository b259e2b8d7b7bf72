"""`Policy`: a causal LM + tokenizer that samples completions and scores them, token in / token out.

Sampling and scoring use one distribution: ``log_softmax(logits / temperature)`` restricted to
``allowed_tokens`` (when set). ``Generation.logprobs`` are log-probs under that distribution, and
``Policy.score`` recomputes exactly them (in eval mode, up to float error); see
`textzoo.decoding.sampling`.

The model runs behind a backend (`textzoo.decoding.backends`), both built once per model: the
plain-torch decoder (`fast_forward`, for the architectures of `textzoo.decoding.fastlm`) when it
reproduces the model exactly in the current mode, else the transformers module. Either way, rows
that share a prompt (the G samples of a group) run it once, in generation and in scoring
(`share_prompts`); the plain decoder's sampling pass also hands each prompt's final hidden state to
the `Generation` (`prompt_features`, what a value head on this model's trunk reads); and within
`prompt_cache()`, scoring calls one sample at a time (per-sample backward) share their prompt's
forward too.

Models come from `textzoo.models.loading` (`from_pretrained`: a hub id, a folder or a `.gguf` file;
`tiny`: built here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textzoo.decoding import sampling
from textzoo.decoding.backends import Backend
from textzoo.decoding.backends.module import ModuleBackend
from textzoo.decoding.backends.plain import PlainBackend
from textzoo.decoding.fastlm import FastDecoder
from textzoo.decoding.generation import Generation, GenerationConfig, first_used_column, left_padded
from textzoo.decoding.modes import eval_mode
from textzoo.decoding.precision import PRECISIONS, autocast
from textzoo.errors import ModelError
from textzoo.models.loading import build_tiny, end_token_ids, load_pretrained

__all__ = ["Policy"]


class Backends(NamedTuple):
    """The two backends of one model: the transformers module and, when supported, the plain decoder."""

    module: ModuleBackend
    plain: PlainBackend | None


class Policy:
    """A causal LM + tokenizer + generation settings on one device."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        generation: GenerationConfig | None = None,
        name: str = "policy",
        precision: str = "fp32",
        engine: Any = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation = generation if generation is not None else GenerationConfig()
        self.name = name
        if tokenizer.eos_token_id is None:
            raise ModelError(
                f"tokenizer of policy {name!r} has no EOS token; set tokenizer.eos_token before building a Policy"
            )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.pad_id: int = tokenizer.pad_token_id
        self.eos_id: int = tokenizer.eos_token_id
        # Chat models may end a turn with any of several ids (e.g. <|im_end|> and <|endoftext|>).
        self.eos_ids: tuple[int, ...] = end_token_ids(model, tokenizer)
        self.fast_forward = True
        """Run the plain-torch decoder (`textzoo.decoding.fastlm`) when the architecture supports it."""
        self.precision = precision
        """The precision name the builder resolved (`textzoo.decoding.precision.PRECISIONS`); what `autocast` and
        the weights' dtype implement (the builder moves the weights to its dtype before building the policy)."""
        self.autocast: torch.dtype | None = PRECISIONS[precision].compute
        """Run forwards (generate, score) under ``torch.autocast`` to this dtype (bf16-mixed precision);
        None = compute in the weights' dtype."""
        self.compact_finished = True
        """Let finished rows go during decoding once at most half the rows run are live (same samples)."""
        self.logits_chunk = sampling.LOGITS_CHUNK
        """Logit elements scoring computes at a time (positions x vocabulary; 0 = all logits at once)."""
        self.engine = engine
        """Where samples come from: None = this policy's own decoder; else an `EngineClient` of
        `textzoo.decoding.engine` (e.g. a vLLM engine), which `generate_ids` / `generate_script` hand requests
        to while it is open."""
        self._share_prompts = True
        self._decode_mode = "auto"
        self._bound: torch.nn.Module | None = None  # the model the backends were built for
        self._built: Backends | None = None
        self._bias_key: tuple | None = None
        self._bias: torch.Tensor | None = None

    # ----------------------------------------------------------------------------------- building
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | str | None = None,
        generation: GenerationConfig | None = None,
        trust_remote_code: bool = False,
        local_files_only: bool | None = None,
    ) -> Policy:
        """Load a hub id, a local folder (e.g. one written by `save_pretrained`) or a `.gguf` file; see
        `load_pretrained`."""
        model, tokenizer = load_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=local_files_only
        )
        return cls(model.to(device), tokenizer, generation, name=str(name_or_path))

    @classmethod
    def tiny(
        cls,
        arch: str = "gpt2",
        *,
        device: torch.device | str = "cpu",
        generation: GenerationConfig | None = None,
        **shape: Any,
    ) -> Policy:
        """A randomly initialised tiny model ("gpt2", "llama", "qwen2" or "qwen3") built by `build_tiny`, whose
        keyword arguments (`n_layer`, `n_embd`, `n_head`, `n_positions`, `seed`, `dropout`, `tokenizer`)
        ``shape`` holds; with `byte_tokenizer` unless a tokenizer is given.

        Deterministic given ``seed``; the global RNG is left untouched.
        """
        model, tokenizer = build_tiny(arch, **shape)
        return cls(model.to(device), tokenizer, generation, name=f"tiny-{arch}")

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write model and tokenizer so that `Policy.from_pretrained(path)` reloads them."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----------------------------------------------------------------------------------- backends
    @property
    def share_prompts(self) -> bool:
        """Run each distinct prompt of a batch once (generate and score) and share its keys/values."""
        return self._share_prompts

    @share_prompts.setter
    def share_prompts(self, value: bool) -> None:
        self._share_prompts = bool(value)
        if self._built is not None:
            for backend in self._built:
                if backend is not None:
                    backend.share_prompts = self._share_prompts

    @property
    def decode_mode(self) -> str:
        """How the plain decoder decodes: "auto" (CUDA graphs over a static cache on CUDA, else the
        dynamic cache), "dynamic", "static" (the static cache, eagerly) or "graph"."""
        return self._decode_mode

    @decode_mode.setter
    def decode_mode(self, value: str) -> None:
        self._decode_mode = value
        if self._built is not None and self._built.plain is not None:
            self._built.plain.decode_mode = value

    def backends(self) -> Backends:
        """The module backend and the plain decoder (None when the architecture is unsupported) of the
        current model, built once per model."""
        if self._bound is not self.model or self._built is None:
            decoder = FastDecoder.build(self.model)
            self._built = Backends(ModuleBackend(self.model), None if decoder is None else PlainBackend(decoder))
            self._bound = self.model
            self.share_prompts, self.decode_mode = self._share_prompts, self._decode_mode
        return self._built

    def backend(self) -> Backend:
        """The backend of this call: the plain decoder when `fast_forward` is on, it supports the
        model and it is exact in the current mode (no active dropout), else the module."""
        module, plain = self.backends()
        return plain if self.fast_forward and plain is not None and plain.usable else module

    @contextmanager
    def prompt_cache(self) -> Iterator[None]:
        """Within: scoring calls whose rows share one prompt (e.g. per-sample backward over a group)
        run that prompt once while it repeats; each sample back-propagates into the prompt's cached
        keys/values, and the prompt's own backward runs once, when the next prompt arrives and on
        exit (so call `backward` inside). Exact gradients; activation memory stays one prompt plus one
        sample. Applies to the plain-torch decoder with gradients on; other calls are unaffected."""
        plain = self.backends().plain
        if plain is None:
            yield
            return
        with plain.prompt_cache():
            yield

    # ---------------------------------------------------------------------------------- encoding
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask ([S, P]); a long prompt keeps its last tokens."""
        rows = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        keep = self.generation.max_prompt_tokens
        ids, mask = left_padded([r[-keep:] for r in rows], self.pad_id)  # [S, P]
        return ids.to(self.device), mask.to(self.device)

    def prepare_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-align the prompts, drop all-pad columns, and give an empty prompt one start token."""
        ids, mask = ids.to(self.device), mask.to(self.device).long()
        if mask.shape[1] and not bool(mask[:, -1].all()):
            # Not left-padded (or some row is empty): move real tokens right, keeping their order.
            order = torch.argsort(mask, dim=1, stable=True)  # [S, P]
            ids, mask = ids.gather(1, order), mask.gather(1, order)
        first = first_used_column(mask)
        ids, mask = ids[:, first:], mask[:, first:]
        empty = mask.sum(1) == 0  # [S]
        if bool(empty.any()):
            # The first token is predicted from something: condition an empty prompt on BOS (or EOS).
            # After left-alignment an empty row's last column is free; add one if there is none.
            # Pad (a copy) so that the caller's tensors are never written to.
            grow = int(mask.shape[1] == 0)
            ids, mask = F.pad(ids, (0, grow), value=self.pad_id), F.pad(mask, (0, grow), value=0)
            start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eos_id
            ids[empty, -1] = start
            mask[empty, -1] = 1
        return ids, mask

    def _allowed_bias(self, vocab: int, allowed: tuple[int, ...] | None) -> torch.Tensor | None:
        """0 on `allowed` ids (and EOS), -inf elsewhere; None when every token is allowed (cached)."""
        if allowed is None:
            return None
        key = (allowed, vocab, self.device, self.eos_ids)
        if key != self._bias_key:
            self._bias = sampling.allowed_bias(allowed, self.eos_ids, vocab, self.device, self.name)
            self._bias_key = key
        return self._bias

    # ---------------------------------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        """Sample one completion per prompt (argmax when ``greedy``)."""
        ids, mask = self.encode(prompts)
        return self.generate_ids(ids, mask, greedy=greedy, generator=generator)

    @torch.no_grad()
    def generate_ids(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Sample one completion per prompt given as ids ([S, P]) and mask; see `generate`.

        ``generator`` (on the policy's device) makes sampling reproducible without touching the
        global RNG; without it, the global RNG is used (runners checkpoint it). With an `engine`, the engine
        samples (its own seed; ``generator`` unused).
        """
        if self._on_engine():
            return self.engine.generate_ids(self, prompt_ids, prompt_mask, greedy)
        return self.decode_ids(prompt_ids, prompt_mask, greedy=greedy, generator=generator)

    @torch.no_grad()
    def decode_ids(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        generation: GenerationConfig | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """`generate_ids` on this policy's own decoder (never its engine), with ``generation``'s sampling
        settings (default: the policy's own): what `textzoo.decoding.engine.LocalEngine` serves requests with."""
        cfg = generation or self.generation
        gen, out = self._decode(prompt_ids, prompt_mask, None, greedy, generator, cfg)
        gen.texts = sampling.completion_texts(self.tokenizer, out, self.eos_ids, cfg.stop_strings)
        return gen

    def _on_engine(self) -> bool:
        """Whether an engine samples for this policy (it has one, and the engine is not closed)."""
        return self.engine is not None and getattr(self.engine, "open", True)

    @torch.no_grad()
    def generate_script(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        scripts: Sequence[sampling.Script],
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[Generation, list[list[str]]]:
        """Complete each prompt ([S, P] ids and mask) through its script of forced and sampled segments
        (`sampling.decode`); return the `Generation` (forced tokens: mask 0, log-prob 0; texts: the whole
        completions decoded) and each row's section texts. Sampling settings other than the budget and
        stop strings (each segment has its own) are ``generation``'s."""
        if prompt_ids.shape[0] != len(scripts):
            raise ValueError(f"{len(scripts)} scripts for {prompt_ids.shape[0]} prompts")
        if self._on_engine():
            return self.engine.generate_script(self, prompt_ids, prompt_mask, scripts, greedy)
        gen, out = self._decode(prompt_ids, prompt_mask, scripts, greedy, generator, self.generation)
        rows = [row[:n] for row, n in zip(out.completion_ids.tolist(), out.lengths.tolist())]
        gen.texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return gen, sampling.section_texts(self.tokenizer, out, scripts, self.eos_ids)

    def _decode(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        scripts: Sequence[sampling.Script] | None,
        greedy: bool,
        generator: torch.Generator | None,
        cfg: GenerationConfig,
    ) -> tuple[Generation, sampling.Decoded]:
        """Prefill the prompts and run `sampling.decode` with ``cfg`` (``scripts`` None: plain samples); no
        texts yet."""
        prompt_ids, prompt_mask = self.prepare_prompts(prompt_ids, prompt_mask)
        S = prompt_ids.shape[0]
        if S == 0:
            empty = torch.zeros((0, 0), dtype=torch.long, device=prompt_ids.device)
            none = sampling.Decoded.empty(sampling.Plan([], self.pad_id, prompt_ids.device))
            return Generation(empty, empty, empty, empty, empty.float(), []), none
        length = cfg.max_new_tokens if scripts is None else max((sum(map(len, s)) for s in scripts), default=0)
        with eval_mode(self.model), autocast(prompt_ids.device, self.autocast):
            decoding = self.backend().prefill(prompt_ids, prompt_mask, max(length, 1))
            bias = self._allowed_bias(decoding.logits.shape[-1], cfg.allowed_tokens)
            choose = sampling.token_choice(cfg, S, greedy, generator)
            out = sampling.decode(
                decoding, choose, cfg, eos_ids=self.eos_ids, pad_id=self.pad_id, bias=bias,
                tokenizer=self.tokenizer, compact=self.compact_finished, scripts=scripts,
            )  # fmt: skip
        gen = Generation(
            prompt_ids, prompt_mask, out.completion_ids, out.completion_mask, out.logprobs, [], decoding.features
        )
        return gen, out

    # ----------------------------------------------------------------------------------- scoring
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        *,
        return_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Log-probs ([S, C]) of the completion tokens under the sampling distribution, 0 where masked.

        Every completion column is attended (tokens after the end sit after all real ones, so they
        change nothing), so ``completion_mask`` only selects which tokens are scored. Gradients flow;
        wrap in ``torch.no_grad()`` for old / reference log-probs. With ``return_entropy``, also the
        entropy ([S, C]) of that distribution at each completion position.
        """
        device = self.device
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).long()
        completion_ids, completion_mask = completion_ids.to(device), completion_mask.to(device)
        if prompt_ids.shape[1] == 0:
            raise ValueError("score needs at least one prompt token per sample (generate adds BOS to empty prompts)")
        prompt_ids, prompt_mask = self.prepare_prompts(prompt_ids, prompt_mask)
        backend = self.backend() if completion_ids.shape[1] > 0 else self.backends().module
        scored = completion_mask.bool()
        with autocast(device, self.autocast):
            inputs = backend.score(prompt_ids, prompt_mask, completion_ids, scored)
            bias = self._allowed_bias(inputs.vocab_size, self.generation.allowed_tokens)
            token_logp, entropy = sampling.selected_log_probs(
                inputs,
                completion_ids,
                self.generation.temperature,
                bias,
                return_entropy=return_entropy,
                chunk=self.logits_chunk,
                mask=scored,
            )
        token_logp = token_logp.masked_fill(~scored, 0.0)
        if not return_entropy:
            return token_logp
        return token_logp, entropy.masked_fill(~scored, 0.0)
