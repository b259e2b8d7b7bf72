"""`Policy`: a causal LM + tokenizer that samples completions and scores them, token in / token out.

Sampling and scoring use one distribution: ``log_softmax(logits / temperature)`` restricted to
``allowed_tokens`` (when set). ``Generation.logprobs`` are log-probs under that distribution, and
``Policy.score`` recomputes exactly them (in eval mode, up to float error). top-k / top-p only
truncate the distribution that the next token is *drawn* from; they do not change the recorded
log-probs, so the importance ratio of a fresh sample is 1 and the scored sequence is the sampled one.

Speed without changing results: rows that share a prompt (the G samples of a group) run it once,
in generation and in scoring, and attend to its keys/values (`share_prompts`); supported decoders run
a plain-torch forward over the module's own weights (`fast_forward`, see `textzoo.agents.fastlm`),
whose sampling pass also hands each prompt's final hidden state to the `Generation`
(`prompt_features`, what a value head on this model's trunk reads); and within `prompt_cache()`,
scoring calls one sample at a time (per-sample backward) share their prompt's forward too.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from textzoo.agents.fastlm import FastDecoder, Prefix, SharedRows, distinct_rows, first_tokens_first, shared_rows
from textzoo.agents.tokenizer import byte_tokenizer
from textzoo.errors import ConfigError, ModelError


@dataclass
class GenerationConfig:
    """How a policy samples completions."""

    max_new_tokens: int = 32
    """Token budget of one completion; a sample that reaches it ends there (its last token is scored)."""
    temperature: float = 1.0
    """Logits are divided by this for sampling and scoring alike."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of tokens with this much mass (1.0 = off)."""
    top_k: int = 0
    """Draw from the k most likely tokens only (0 = off)."""
    stop_strings: tuple[str, ...] = ()
    """A sample ends once its text contains one of these; the text keeps the stop string."""
    allowed_tokens: tuple[int, ...] | None = None
    """Restrict sampling and scoring to these token ids (EOS is always allowed); None = all."""
    max_prompt_tokens: int = 384
    """Longer prompts keep their last tokens."""

    def __post_init__(self) -> None:
        if isinstance(self.stop_strings, str):
            raise ConfigError(
                "generation.stop_strings must be a sequence of strings, not one string; wrap it in a tuple"
            )
        self.stop_strings = tuple(self.stop_strings)
        if self.allowed_tokens is not None:
            self.allowed_tokens = tuple(int(t) for t in self.allowed_tokens)
        if self.max_new_tokens < 1:
            raise ConfigError(f"generation.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ConfigError(
                f"generation.temperature must be > 0 (use greedy=True for argmax), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"generation.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"generation.top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ConfigError(f"generation.stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.allowed_tokens is not None and (not self.allowed_tokens or min(self.allowed_tokens) < 0):
            raise ConfigError(
                "generation.allowed_tokens must be a non-empty list of token ids >= 0 (or None), "
                f"got {self.allowed_tokens!r}"
            )
        if self.max_prompt_tokens < 1:
            raise ConfigError(f"generation.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


@dataclass
class Generation:
    """A batch of S sampled completions; all tensors on the policy's device.

    ``completion_mask`` is 1 on every sampled token up to and including the one that ended the
    sample (EOS, the token that completed a stop string, or the last token of the budget).
    ``texts`` are the decoded completions without the EOS; a stop string is kept and anything the
    final token added after it is cut.
    """

    prompt_ids: torch.Tensor  # [S, P] left-padded
    prompt_mask: torch.Tensor  # [S, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [S, C] right-padded
    completion_mask: torch.Tensor  # [S, C] 1 on scored tokens
    logprobs: torch.Tensor  # [S, C] sampling log-probs, 0 where the mask is 0
    texts: list[str] = field(default_factory=list)
    prompt_features: torch.Tensor | None = None
    """[S, d] the model's final hidden state at each prompt's last token, when the sampling pass
    produced it (the plain-torch decoder does): what a value head on this model's trunk reads."""

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, index: Sequence[int] | torch.Tensor) -> Generation:
        """The sub-batch at ``index`` (padding columns that became all-pad are dropped)."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.prompt_ids.device).reshape(-1)  # [S']
        prompt_mask = self.prompt_mask[idx]  # [S', P]
        completion_mask = self.completion_mask[idx]  # [S', C]
        first = _first_used_column(prompt_mask)
        last = _last_used_column(completion_mask)
        return Generation(
            prompt_ids=self.prompt_ids[idx, first:],
            prompt_mask=prompt_mask[:, first:],
            completion_ids=self.completion_ids[idx, :last],
            completion_mask=completion_mask[:, :last],
            logprobs=self.logprobs[idx, :last],
            texts=[self.texts[i] for i in idx.tolist()],
            prompt_features=None if self.prompt_features is None else self.prompt_features[idx],
        )

    def to(self, device: torch.device | str) -> Generation:
        """A copy with every tensor on ``device``."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "texts"}
        moved = {name: None if t is None else t.to(device) for name, t in tensors.items()}
        return Generation(**moved, texts=list(self.texts))

    @staticmethod
    def cat(items: list[Generation], pad_id: int) -> Generation:
        """Concatenate batches: prompts re-padded on the left, completions on the right."""
        if not items:
            raise ValueError("Generation.cat needs at least one batch")
        P = max(g.prompt_ids.shape[1] for g in items)
        C = max(g.completion_ids.shape[1] for g in items)

        def left(t: torch.Tensor, value: float) -> torch.Tensor:
            return F.pad(t, (P - t.shape[1], 0), value=value)

        def right(t: torch.Tensor, value: float) -> torch.Tensor:
            return F.pad(t, (0, C - t.shape[1]), value=value)

        return Generation(
            prompt_ids=torch.cat([left(g.prompt_ids, pad_id) for g in items]),  # [S, P]
            prompt_mask=torch.cat([left(g.prompt_mask, 0) for g in items]),  # [S, P]
            completion_ids=torch.cat([right(g.completion_ids, pad_id) for g in items]),  # [S, C]
            completion_mask=torch.cat([right(g.completion_mask, 0) for g in items]),  # [S, C]
            logprobs=torch.cat([right(g.logprobs, 0.0) for g in items]),  # [S, C]
            texts=[t for g in items for t in g.texts],
            prompt_features=None
            if any(g.prompt_features is None for g in items)
            else torch.cat([g.prompt_features for g in items]),
        )


def _first_used_column(mask: torch.Tensor) -> int:
    """Index of the first column of a left-padded mask with any 1 (its width when none)."""
    used = mask.any(0).nonzero()
    return int(used[0]) if len(used) else mask.shape[1]


def _last_used_column(mask: torch.Tensor) -> int:
    """One past the last column of a right-padded mask with any 1 (0 when none)."""
    used = mask.any(0).nonzero()
    return int(used[-1]) + 1 if len(used) else 0


# Decoders whose sdpa attention mask is exactly causal + key padding (no ALiBi, no softcapping masks).
_PLAIN_MASK_MODELS = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "granite"})


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether ``model`` drops anything in train mode (a dropout module or attention dropout > 0)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in base.modules()):
        return True
    return float(getattr(getattr(base, "config", None), "attention_dropout", 0.0) or 0.0) > 0


def _key_mask_suffices(config) -> bool:
    """Whether a one-position decode step may take a ready 4D key-padding mask (sdpa, full attention)."""
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.model_type not in _PLAIN_MASK_MODELS:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)


class Policy:
    """A causal LM + tokenizer + generation settings on one device."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast,
        generation: GenerationConfig | None = None,
        name: str = "policy",
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
        model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        model_eos = [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys([self.eos_id, *model_eos]))
        # transformers renamed `past_key_values` to `cache`; read the forward signature once.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._bias_key: tuple | None = None
        self._bias: torch.Tensor | None = None
        self.fast_forward = True
        """Run the plain-torch forward (`textzoo.agents.fastlm`) when the architecture supports it."""
        self.share_prompts = True
        """Run each distinct prompt of a batch once (generate and score) and share its keys/values."""
        self._fast_model: torch.nn.Module | None = None
        self._fast_decoder: FastDecoder | None = None
        self._prompt_cache: _PromptCache | None = None

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
        """Load a hub id or a local folder (e.g. one written by `save_pretrained`)."""
        source = str(name_or_path)
        local = Path(source).expanduser()
        # A hub id is "name" or "org/name"; anything else that is not a folder is a missing path.
        looks_like_path = (
            source.startswith((".", "/", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source)
        )
        if local.is_dir():
            source = str(local)
        elif local.exists() or looks_like_path:
            raise ModelError(
                f"model folder {source!r} does not exist (or is not a folder); pass a folder written by "
                "Policy.save_pretrained / transformers save_pretrained, or a hub id such as 'Qwen/Qwen2.5-0.5B'"
            )
        kwargs: dict = {"trust_remote_code": trust_remote_code}
        if local_files_only is not None:
            kwargs["local_files_only"] = local_files_only
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, **kwargs, **({} if dtype is None else {"dtype": dtype})
            )
            if local.is_dir() and (local / "tokenizer.json").exists():
                # AutoTokenizer may swap the pre-tokenizer of locally built folders (DESIGN, sharp edges).
                tokenizer = PreTrainedTokenizerFast.from_pretrained(source, **kwargs)
            else:
                tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        except (OSError, ValueError, KeyError) as err:
            raise ModelError(
                f"could not load model {source!r}: {err}. Check the hub id (and network access or the local "
                "Hugging Face cache; set local_files_only=True offline) or pass a folder written by save_pretrained"
            ) from err
        return cls(model.to(device), tokenizer, generation, name=source)

    @classmethod
    def tiny(
        cls,
        arch: str = "gpt2",
        *,
        n_layer: int = 2,
        n_embd: int = 64,
        n_head: int = 2,
        n_positions: int = 512,
        seed: int = 0,
        device: torch.device | str = "cpu",
        generation: GenerationConfig | None = None,
        dropout: float = 0.0,
        tokenizer: PreTrainedTokenizerFast | None = None,
    ) -> Policy:
        """A randomly initialised tiny model ("gpt2", "llama" or "qwen2") with `byte_tokenizer` (or
        `tokenizer`, whose vocabulary and special ids shape the model).

        Deterministic given ``seed``; the global RNG is left untouched.
        """
        if tokenizer is None:
            tokenizer = byte_tokenizer(model_max_length=n_positions)
        ids = dict(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        if arch == "gpt2":
            # Exact GELU instead of GPT-2's tanh approximation: same shapes, ~4x faster activation on CPU.
            config = GPT2Config(
                n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions, activation_function="gelu",
                resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **ids,
            )  # fmt: skip
        elif arch in ("llama", "qwen2"):
            config_cls = LlamaConfig if arch == "llama" else Qwen2Config
            config = config_cls(
                hidden_size=n_embd, intermediate_size=4 * n_embd, num_hidden_layers=n_layer,
                num_attention_heads=n_head, num_key_value_heads=n_head, max_position_embeddings=n_positions,
                attention_dropout=dropout, tie_word_embeddings=True, **ids,
            )  # fmt: skip
        else:
            raise ConfigError(f"arch must be 'gpt2', 'llama' or 'qwen2', got {arch!r}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config)
        return cls(model.to(device), tokenizer, generation, name=f"tiny-{arch}")

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write model and tokenizer so that `Policy.from_pretrained(path)` reloads them."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------------------------- encoding
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask ([S, P]); a long prompt keeps its last tokens."""
        rows = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        keep = self.generation.max_prompt_tokens
        rows = [r[-keep:] for r in rows]
        P = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), P), self.pad_id, dtype=torch.long)  # [S, P]
        mask = torch.zeros((len(rows), P), dtype=torch.long)  # [S, P]
        for i, r in enumerate(rows):
            if r:
                ids[i, P - len(r) :] = torch.tensor(r)
                mask[i, P - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _prepare_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-align the prompts, drop all-pad columns, and give an empty prompt one start token."""
        ids, mask = ids.to(self.device), mask.to(self.device).long()
        if mask.shape[1] and not bool(mask[:, -1].all()):
            # Not left-padded (or some row is empty): move real tokens right, keeping their order.
            order = torch.argsort(mask, dim=1, stable=True)  # [S, P]
            ids, mask = ids.gather(1, order), mask.gather(1, order)
        first = _first_used_column(mask)
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

    # ---------------------------------------------------------------------------------- sampling
    def _allowed_bias(self, vocab: int) -> torch.Tensor | None:
        """0 on allowed ids (and EOS), -inf elsewhere; None when every token is allowed."""
        allowed = self.generation.allowed_tokens
        if allowed is None:
            return None
        key = (allowed, vocab, self.device, self.eos_ids)
        if key != self._bias_key:
            ids = sorted({*allowed, *self.eos_ids})
            if ids[-1] >= vocab:
                raise ConfigError(
                    f"generation.allowed_tokens contains id {ids[-1]}, but policy {self.name!r} has {vocab} logits"
                )
            bias = torch.full((vocab,), float("-inf"), device=self.device)  # [V]
            bias[ids] = 0.0
            self._bias_key, self._bias = key, bias
        return self._bias

    def _log_probs(self, logits: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The sampling/scoring distribution: log_softmax(logits / T), restricted by ``bias``."""
        logits = logits.float()  # [..., V]
        if self.generation.temperature != 1.0:
            logits = logits / self.generation.temperature
        if bias is not None:
            logits = logits + bias
        return torch.log_softmax(logits, dim=-1)  # [..., V]

    def _draw(self, logp: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Sample one token per row from ``logp`` after top-k / top-p truncation."""
        cfg = self.generation
        if cfg.top_k > 0 and cfg.top_k < logp.shape[-1]:
            kth = logp.topk(cfg.top_k, dim=-1).values[:, -1:]  # [S, 1]
            logp = logp.masked_fill(logp < kth, float("-inf"))
        if cfg.top_p < 1.0:
            sorted_logp, order = logp.sort(dim=-1, descending=True)  # [S, V]
            sorted_p = sorted_logp.softmax(-1)  # [S, V] renormalised after top-k
            # Keep a token while the mass ranked above it is below top_p (so the top token is kept).
            drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p  # [S, V]
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)  # [S, V] in vocab order
            logp = logp.masked_fill(drop, float("-inf"))
        # Inverse-CDF sampling: one uniform per row instead of multinomial's V exponentials (~10x
        # faster on CPU, same RNG source). u lies in (0, total], and searchsorted returns the first
        # index with cdf >= u, so a zero-probability token is never drawn. float64 keeps tiny
        # probabilities resolved in the running sum.
        cdf = logp.double().exp().cumsum(-1)  # [S, V] unnormalised after truncation; u scales by the total
        uniform = torch.rand((logp.shape[0], 1), dtype=torch.float64, device=logp.device, generator=generator)
        u = (1.0 - uniform) * cdf[:, -1:]  # [S, 1]
        return torch.searchsorted(cdf, u).squeeze(1)  # [S]

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
        global RNG; without it, the global RNG is used (runners checkpoint it).
        """
        cfg = self.generation
        prompt_ids, prompt_mask = self._prepare_prompts(prompt_ids, prompt_mask)
        S = prompt_ids.shape[0]
        N = cfg.max_new_tokens
        device = prompt_ids.device
        if S == 0:
            empty = torch.zeros((0, 0), dtype=torch.long, device=device)
            return Generation(empty, empty, empty, empty, empty.float(), [])
        eos = torch.tensor(self.eos_ids, device=device)  # [E]
        done = torch.zeros(S, dtype=torch.bool, device=device)  # [S]
        by_stop = torch.zeros(S, dtype=torch.bool, device=device)  # [S]
        stop_window = 4 * max((len(s) for s in cfg.stop_strings), default=0) + 4
        # Per-step results go to lists and are stacked once: indexed writes cost more per step.
        tokens, token_logps, done_after = [], [], []  # each N' x [S]

        was_training = self.model.training
        self.model.eval()
        try:
            logits, step, features = self._start_decoding(prompt_ids, prompt_mask, N)  # [S, V], fn, [S, d] | None
            bias = self._allowed_bias(logits.shape[-1])
            for t in range(N):
                logp = self._log_probs(logits, bias)  # [S, V]
                token = logp.argmax(-1) if greedy else self._draw(logp, generator)  # [S]
                token = token.masked_fill(done, self.pad_id)  # finished rows emit padding
                tokens.append(token)
                token_logps.append(logp.gather(1, token[:, None]).squeeze(1))
                done = done | (token == eos[0] if len(self.eos_ids) == 1 else torch.isin(token, eos))
                if cfg.stop_strings:
                    tail = torch.stack(tokens[-stop_window:], 1)  # [S, W]
                    hit = self._stop_hits(tail, ~done)  # [S]
                    by_stop |= hit
                    done = done | hit
                done_after.append(done)
                if bool(done.all()) or t + 1 == N:
                    break
                logits = step(token)  # [S, V]
        finally:
            self.model.train(was_training)

        completion = torch.stack(tokens, 1)  # [S, C]
        # A token is scored iff its row was not done before it: every sampled token up to and
        # including the one that ended the sample.
        done_before = torch.stack([torch.zeros_like(done), *done_after[:-1]], 1)  # [S, C]
        completion_mask = (~done_before).long()  # [S, C]
        logprobs = torch.stack(token_logps, 1).masked_fill(done_before, 0.0)  # [S, C]
        texts = self._texts(completion, completion_mask, by_stop)
        return Generation(prompt_ids, prompt_mask, completion, completion_mask, logprobs, texts, features)

    def _start_decoding(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, N: int):
        """Run the prompts; return the logits of the first completion token ([S, V]), ``step(token)``,
        which appends tokens ([S]) and returns the next logits ([S, V]), and the prompts' final hidden
        states ([S, d]) when this pass has them (else None)."""
        fast = self._fast()
        if fast is not None:
            prefix, logits, lengths, features = self._fast_prefix(prompt_ids, prompt_mask, fast)
            cache = fast.new_cache(capacity=N)
            position = lengths[:, None]  # [S, 1] the first completion token's position

            def fast_step(token: torch.Tensor) -> torch.Tensor:
                nonlocal position
                out = fast.head(fast.extend(token[:, None], position, prefix, cache, 1)[:, -1])  # [S, V]
                position = position + 1
                return out

            return logits, fast_step, features
        S, P = prompt_ids.shape
        attention = torch.cat([prompt_mask, prompt_mask.new_ones((S, N))], 1)  # [S, P+N]
        position = (prompt_mask.cumsum(1) - 1).clamp(min=0)  # [S, P]
        step_attention = attention
        if _key_mask_suffices(self.model.config):
            # For one query position the mask is just the key padding mask (causality is implied):
            # a ready 4D boolean mask skips transformers' per-step mask construction (~10% faster).
            step_attention = attention.bool()[:, None, None, :]  # [S, 1, 1, P+N]
        cache = DynamicCache(config=self.model.config)
        # Prefill: each distinct prompt once; its keys/values are then copied to all of its rows.
        shared = self._distinct_prompts(prompt_ids, prompt_mask)
        if shared is None:
            logits = self._forward(prompt_ids, attention[:, :P], position, cache, 1)[:, -1]  # [S, V]
        else:
            first = shared.first
            logits = self._forward(prompt_ids[first], attention[first, :P], position[first], cache, 1)
            self._expand_cache(cache, shared)
            logits = logits[shared.inverse, -1]  # [S, V]
        position = position[:, -1:]  # [S, 1]
        seen = P

        def module_step(token: torch.Tensor) -> torch.Tensor:
            nonlocal position, seen
            position, seen = position + 1, seen + 1
            return self._forward(token[:, None], step_attention[..., :seen], position, cache, 1)[:, -1]

        return logits, module_step, None

    def _fast_prefix(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, fast: FastDecoder):
        """Each distinct prompt through ``fast`` once: the rows' `Prefix`, the logits of their first
        completion token ([S, V]), their prompt lengths ([S]) and final hidden states ([S, d])."""
        rows = (
            shared_rows(prompt_ids, prompt_mask)
            if self.share_prompts
            else SharedRows.each(prompt_ids.shape[0], prompt_ids.device)
        )
        prefix, last = fast.prefill(*first_tokens_first(prompt_ids[rows.first], prompt_mask[rows.first]))  # [U, d]
        logits = fast.head(last)[rows.inverse]  # [S, V]: the LM head once per distinct prompt
        return fast.share(prefix, rows), logits, prefix.lengths[rows.inverse], last[rows.inverse]

    def _fast(self) -> FastDecoder | None:
        """The plain-torch forward of this model when it is supported and exact in the current mode."""
        if not self.fast_forward:
            return None
        if self._fast_model is not self.model:
            self._fast_model, self._fast_decoder = self.model, FastDecoder.build(self.model)
        fast = self._fast_decoder
        return fast if fast is not None and fast.usable else None

    @contextmanager
    def prompt_cache(self) -> Iterator[None]:
        """Within: scoring calls whose rows share one prompt (e.g. per-sample backward over a group)
        run that prompt once while it repeats; each sample back-propagates into the prompt's cached
        keys/values, and the prompt's own backward runs once, when the next prompt arrives and on
        exit (so call `backward` inside). Exact gradients; activation memory stays one prompt plus one
        sample. Applies to the plain-torch decoder with gradients on; other calls are unaffected."""
        outer, self._prompt_cache = self._prompt_cache, _PromptCache()
        try:
            yield
        finally:
            cache, self._prompt_cache = self._prompt_cache, outer
            cache.flush()

    def _distinct_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> SharedRows | None:
        """Which rows share a prompt (None when sharing is off or every row differs)."""
        return distinct_rows(ids, mask) if self.share_prompts else None

    @staticmethod
    def _expand_cache(cache: DynamicCache, shared: SharedRows) -> None:
        """Give every row its prompt's keys/values: contiguous equal groups repeat (whose backward
        is a cheap sum), other layouts gather rows."""
        if shared.group:
            cache.batch_repeat_interleave(shared.group)
        else:
            cache.reorder_cache(shared.inverse)

    def _forward(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor,
        position: torch.Tensor,
        cache: DynamicCache | None,
        keep: int,
    ) -> torch.Tensor:
        """Logits ([S, keep, V]) at the last ``keep`` positions of one forward of the transformers module."""
        kwargs = {"input_ids": ids, "attention_mask": attention, "position_ids": position}
        if cache is not None:
            kwargs.update({self._cache_kwarg: cache, "use_cache": True})
        else:
            kwargs["use_cache"] = False
        if self._has_logits_to_keep:
            return self.model(**kwargs, logits_to_keep=keep).logits
        return self.model(**kwargs).logits[:, -keep:]

    def _stop_hits(self, tail: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Rows (among ``live``) whose recent tokens ``tail`` ([S, W]) contain a stop string."""
        hit = torch.zeros_like(live)
        rows = live.nonzero().squeeze(1).tolist()
        if rows:
            texts = self.tokenizer.batch_decode(tail[rows].tolist(), skip_special_tokens=True)
            for row, text in zip(rows, texts):
                hit[row] = any(s in text for s in self.generation.stop_strings)
        return hit

    def _texts(self, completion: torch.Tensor, mask: torch.Tensor, by_stop: torch.Tensor) -> list[str]:
        """Decode the scored tokens of each row, dropping the final EOS and cutting after a stop string."""
        lengths = mask.sum(1)  # [S]
        last = completion.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)  # [S]
        ends_eos = torch.isin(last, torch.tensor(self.eos_ids, device=completion.device)) & (lengths > 0)  # [S]
        keep = (lengths - ends_eos.long()).tolist()
        rows = [row[:n] for row, n in zip(completion.tolist(), keep)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for i in by_stop.nonzero().squeeze(1).tolist():
            ends = [texts[i].find(s) + len(s) for s in self.generation.stop_strings if s in texts[i]]
            if ends:
                texts[i] = texts[i][: min(ends)]
        return texts

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
        C = completion_ids.shape[1]
        if prompt_ids.shape[1] == 0:
            raise ValueError("score needs at least one prompt token per sample (generate adds BOS to empty prompts)")
        fast = self._fast()
        if fast is not None and C > 0:
            # Each distinct prompt runs once; its samples' completions attend to its keys/values (with
            # their graph) in one grouped matmul, so the prompt's gradient is the sum over its samples.
            ids, mask = self._prepare_prompts(prompt_ids, prompt_mask)
            cache = self._prompt_cache
            if cache is not None and torch.is_grad_enabled() and cache.holds_one_prompt(ids, mask):
                prefix, logits, lengths = cache.prefix(ids, mask, fast)
            else:
                prefix, logits, lengths, _ = self._fast_prefix(ids, mask, fast)
            logits = logits[:, None]  # [S, 1, V]
            if C > 1:
                position = lengths[:, None] + torch.arange(C - 1, device=device)  # [S, C-1]
                rest = fast.head(fast.extend(completion_ids[:, :-1], position, prefix, fast.new_cache(), C - 1))
                logits = torch.cat([logits, rest], 1)  # [S, C, V]
        else:
            logits = self._module_logits(prompt_ids, prompt_mask, completion_ids)  # [S, C, V]
        logp = self._log_probs(logits, self._allowed_bias(logits.shape[-1]))  # [S, C, V]
        token_logp = logp.gather(2, completion_ids[..., None]).squeeze(2)  # [S, C]
        scored = completion_mask.bool()
        token_logp = token_logp.masked_fill(~scored, 0.0)
        if not return_entropy:
            return token_logp
        entropy = torch.special.entr(logp.exp()).sum(-1).masked_fill(~scored, 0.0)  # [S, C]
        return token_logp, entropy

    def _module_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor):
        """Logits ([S, C, V]) predicting each completion token, through the transformers module."""
        C = completion_ids.shape[1]
        attention = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)  # [S, P+C]
        position = (attention.cumsum(1) - 1).clamp(min=0)  # [S, P+C]
        P = prompt_ids.shape[1]
        # With dropout in train mode, each sample draws its own masks: a shared prompt pass would not.
        share = C > 0 and not (self.model.training and has_dropout(self.model))
        shared = self._distinct_prompts(prompt_ids, prompt_mask) if share else None
        # Logits at the last prompt position and each completion position but the last predict
        # completion tokens 0..C-1; logits at earlier prompt positions are never computed.
        if shared is None:
            ids = torch.cat([prompt_ids, completion_ids], 1)  # [S, P+C]
            logits = self._forward(ids, attention, position, None, C + 1)[:, :C]  # [S, C, V]
        else:
            # Each distinct prompt runs once; its keys/values (with their graph) are indexed out to
            # its samples' completions, so the prompt's gradient is the sum over those samples.
            first = shared.first
            cache = DynamicCache(config=self.model.config)
            last = self._forward(prompt_ids[first], prompt_mask[first], position[first, :P], cache, 1)  # [U, 1, V]
            logits = last[shared.inverse]  # [S, 1, V]
            if C > 1:
                self._expand_cache(cache, shared)
                rest = self._forward(completion_ids[:, :-1], attention[:, :-1], position[:, P:-1], cache, C - 1)
                logits = torch.cat([logits, rest], 1)  # [S, C, V]
        return logits


class _PromptCache:
    """One prompt's prefill with its graph, and detached copies (leaves) that scoring calls use."""

    def __init__(self) -> None:
        self.key: tuple[int, ...] | None = None  # the cached prompt's tokens
        self.outputs: list[torch.Tensor] = []  # keys, values of every layer, last hidden state (with graph)
        self.leaves: list[torch.Tensor] = []  # the same, detached, requiring grad
        self.bias: torch.Tensor | None = None  # [1, 1, 1, P] the prompt's key mask
        self.lengths: torch.Tensor | None = None  # [1]

    @staticmethod
    def holds_one_prompt(ids: torch.Tensor, mask: torch.Tensor) -> bool:
        return ids.shape[0] >= 1 and bool((ids == ids[:1]).all()) and bool((mask == mask[:1]).all())

    def prefix(self, ids: torch.Tensor, mask: torch.Tensor, fast: FastDecoder):
        """The rows' `Prefix`, first-token logits ([S, V]) and prompt lengths ([S]) from the cache."""
        key = tuple(ids[0][mask[0].bool()].tolist())
        if key != self.key:
            self.flush()
            prefix, hidden = fast.prefill(*first_tokens_first(ids[:1], mask[:1]))  # [1, d]
            self.outputs = [*prefix.keys, *prefix.values, hidden]
            self.leaves = [t.detach().requires_grad_() for t in self.outputs]
            self.key, self.bias, self.lengths = key, prefix.bias, prefix.lengths
        layers = (len(self.leaves) - 1) // 2
        S = ids.shape[0]
        prefix = Prefix(self.leaves[:layers], self.leaves[layers:-1], self.bias, self.lengths, group=S)
        logits = fast.head(self.leaves[-1]).expand(S, -1)  # [S, V]
        return prefix, logits, self.lengths.expand(S)

    def flush(self) -> None:
        """Back-propagate what the samples accumulated on the prompt's keys/values through its prefill."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self.key, self.outputs, self.leaves = None, [], []
