"""`ModuleBackend`: prefill, decode and score through the transformers module (any causal LM).

The fallback backend: whatever `AutoModelForCausalLM` loads (and peft wraps) runs here, with
transformers' own cache. Rows that share a prompt run it once and get copies of its keys/values
(`share_prompts`), except in train mode with active dropout, where each sample must draw its own masks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.distributed.tensor import DTensor
from transformers import DynamicCache

from textzoo.decoding.backends import HeadInput
from textzoo.decoding.fastlm import SharedRows, distinct_rows

# Decoders whose sdpa attention mask is exactly causal + key padding (no ALiBi, no softcapping masks).
_PLAIN_MASK_MODELS = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "granite"})
# Causal LMs whose logits are exactly `get_output_embeddings()(final hidden states)` (no scaling or
# softcapping after the head), so scoring may run the head itself, a chunk of positions at a time.
_PLAIN_HEAD_MODELS = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2"})


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


class ModuleBackend:
    """The transformers module's forward, with its `DynamicCache`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.share_prompts = True
        # transformers renamed `past_key_values` to `cache`; read the forward signature once.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._captured: list[torch.Tensor] | None = None
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        plain = getattr(getattr(base, "config", None), "model_type", None) in _PLAIN_HEAD_MODELS
        self.head: torch.nn.Module | None = head if plain and isinstance(head, torch.nn.Module) else None
        """The LM head that scoring runs itself (None: scoring takes the module's logits)."""

    def prompt_cache(self):
        return nullcontext()

    # ----------------------------------------------------------------------------------- decoding
    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int) -> ModuleDecoding:
        S, P = prompt_ids.shape
        attention = torch.cat([prompt_mask, prompt_mask.new_ones((S, max_new_tokens))], 1)  # [S, P+N]
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
            _expand_cache(cache, shared)
            logits = logits[shared.inverse, -1]  # [S, V]
        return ModuleDecoding(self, logits, cache, step_attention, position[:, -1:], P)

    # ----------------------------------------------------------------------------------- scoring
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        scored: torch.Tensor | None = None,
    ) -> HeadInput:
        """The final hidden states ([S, C, d]) predicting each completion token and the LM head; for
        models whose head is not known to be plain (`head` None), the logits ([S, C, V]) themselves.
        The module runs every position (``scored`` is not used)."""
        with self._head_inputs() as head:
            out = self._score(prompt_ids, prompt_mask, completion_ids)  # [S, C, d] or [S, C, V]
        return HeadInput(out, head)

    @contextmanager
    def _head_inputs(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """Within, `_forward` returns the LM head's input instead of its output: a pre-hook on the head
        keeps the hidden states it is given and hands it zero positions (so no logits are computed).
        Yields the head to apply later (the identity when the head is not plain)."""
        if self.head is None:
            yield _identity
            return
        self._captured = []

        def grab(module, args):
            self._captured.append(args[0])  # [S, keep, d]
            return (args[0][..., :0, :], *args[1:])

        handle = self.head.register_forward_pre_hook(grab)
        try:
            yield self.head
        finally:
            handle.remove()
            self._captured = None

    def _score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor):
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
                _expand_cache(cache, shared)
                rest = self._forward(completion_ids[:, :-1], attention[:, :-1], position[:, P:-1], cache, C - 1)
                logits = torch.cat([logits, rest], 1)  # [S, C, V]
        return logits

    # ----------------------------------------------------------------------------------- helpers
    def _distinct_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> SharedRows | None:
        """Which rows share a prompt (None when sharing is off or every row differs). Never for an
        FSDP-sharded model: each forward is a collective, so every process must make the same number
        of them, which sharing (one forward, or two) would make depend on each process's batch."""
        if not self.share_prompts or isinstance(next(self.model.parameters()), DTensor):
            return None
        return distinct_rows(ids, mask)

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
            logits = self.model(**kwargs, logits_to_keep=keep).logits
        else:
            logits = self.model(**kwargs).logits
        if self._captured is not None:  # within `_head_inputs`: the head's input instead
            return self._captured.pop()[:, -keep:]  # [S, keep, d]
        return logits[:, -keep:]


class ModuleDecoding:
    """Rows decoding through the module: its cache, the attention mask and each row's next position."""

    def __init__(self, backend: ModuleBackend, logits, cache, step_attention, position, seen: int) -> None:
        self.backend = backend
        self.logits = logits  # [S, V]
        self.features = None
        self.cache = cache
        self.step_attention = step_attention  # [S, P+N] or [S, 1, 1, P+N]
        self.position = position  # [S, 1] the last position written
        self.seen = seen  # columns of the attention mask in use

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self.position, self.seen = self.position + 1, self.seen + 1
        attention = self.step_attention[..., : self.seen]
        return self.backend._forward(tokens[:, None], attention, self.position, self.cache, 1)[:, -1]  # [S, V]

    def retain(self, rows: torch.Tensor) -> torch.Tensor:
        """Keep exactly ``rows``: their cache entries, mask rows and positions are copied out."""
        if len(rows) == self.position.shape[0]:
            return rows
        self.cache.reorder_cache(rows)
        self.step_attention = self.step_attention.index_select(0, rows)
        self.position = self.position.index_select(0, rows)
        return rows


def _expand_cache(cache: DynamicCache, shared: SharedRows) -> None:
    """Give every row its prompt's keys/values: contiguous equal groups repeat (whose backward is a
    cheap sum), other layouts gather rows."""
    if shared.group:
        cache.batch_repeat_interleave(shared.group)
    else:
        cache.reorder_cache(shared.inverse)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
