"""`PlainBackend`: prefill, decode and score through the plain-torch decoder (`textzoo.decoding.fastlm`).

Rows that share a prompt (the G samples of a group) run it once and attend to its keys/values in one
grouped matmul, in decoding and in scoring (`share_prompts`); the sampling pass also hands each
prompt's final hidden state to the caller (`Decoding.features`, what a value head on the model's
trunk reads); and within `prompt_cache()`, scoring calls one sample at a time (per-sample backward)
share their prompt's forward too.

Decoding runs over a growing cache (`PlainDecoding`, the grouped layout) or over the fixed buffers of
`textzoo.decoding.backends.static` (`decode_mode`; on CUDA, "auto" replays each step as a CUDA graph).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from textzoo.decoding.backends import HeadInput, keep_all, static
from textzoo.decoding.backends.static import LENGTH_STEP, MODES, StaticCache, StaticDecoding, bucket
from textzoo.decoding.fastlm import FastDecoder, KVCache, Prefix, SharedRows, first_tokens_first, shared_rows
from textzoo.errors import ConfigError


class PlainBackend:
    """The plain-torch forward of a model whose architecture `FastDecoder` supports."""

    def __init__(self, decoder: FastDecoder) -> None:
        self.decoder = decoder
        self.share_prompts = True
        self.decode_mode = "auto"
        """"dynamic", "static", "graph" or "auto" (see `textzoo.decoding.backends.static.MODES`)."""
        self._prompt_cache: _PromptCache | None = None
        self._static: StaticCache | None = None

    @property
    def usable(self) -> bool:
        """Whether the plain forward is exact in the model's current mode (see `FastDecoder.usable`)."""
        return self.decoder.usable

    # ----------------------------------------------------------------------------------- decoding
    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int):
        prefix, last, rows = self._prefix(prompt_ids, prompt_mask)
        mode = self._mode(prompt_ids.device)
        if mode != "dynamic":
            cache = self._static_cache(len(rows.inverse), prefix.bias.shape[-1] + max_new_tokens, prefix.keys[0])
            return StaticDecoding(self.decoder, cache, prefix, rows, last, graphs=mode == "graph")
        logits = self.decoder.head(last)[rows.inverse]  # [S, V]: the LM head once per distinct prompt
        cache = self.decoder.new_cache(capacity=max_new_tokens)
        lengths = prefix.lengths[rows.inverse]  # [S]
        prefix = self.decoder.share(prefix, rows)
        return PlainDecoding(self.decoder, logits, last[rows.inverse], prefix, cache, lengths[:, None])

    def _mode(self, device: torch.device) -> str:
        """The decode mode of this call ("auto" resolved; "graph" checked)."""
        mode = self.decode_mode
        if mode not in MODES:
            raise ConfigError(f"decode_mode must be one of {', '.join(MODES)}, got {mode!r}")
        graphable = static.graphs_available(device) and self.decoder.graph_safe
        if mode == "graph" and not graphable:
            raise ConfigError(
                "decode_mode='graph' needs a CUDA device and a model whose decode step has static shapes "
                f"(this one is on {device.type}); use 'static' for the same path without graphs, or 'auto'"
            )
        if mode == "auto":
            return "graph" if graphable else "dynamic"
        return mode

    def _static_cache(self, rows: int, length: int, like: torch.Tensor) -> StaticCache:
        """The backend's static cache, (re)allocated when it is too small or of another dtype/device;
        graphs captured against other weights storage are dropped."""
        fast = self.decoder
        length = -(-length // LENGTH_STEP) * LENGTH_STEP
        cache = self._static
        if cache is None or not cache.fits(bucket(rows), length, like.dtype, like.device):
            rows = max(bucket(rows), cache.rows if cache is not None else 0)
            self._static = cache = StaticCache(
                len(fast.layers), rows, fast.kv_heads, length, like.shape[-1], like.dtype, like.device
            )
        weights = tuple(p.data_ptr() for p in fast.model.parameters())
        if weights != cache.weights:
            cache.graphs.clear()
            cache.weights = weights
        return cache

    def release(self) -> None:
        """Free the static cache and its graphs (the next static decoding allocates them again)."""
        self._static = None

    def _rows(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> SharedRows:
        """Which rows share which prompt (each row its own when prompts are not shared)."""
        if self.share_prompts:
            return shared_rows(prompt_ids, prompt_mask)
        return SharedRows.each(prompt_ids.shape[0], prompt_ids.device)

    def _prefix(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[Prefix, torch.Tensor, SharedRows]:
        """Each distinct prompt through the decoder once: their `Prefix`, final hidden states ([U, d])
        and which rows share which prompt."""
        rows = self._rows(prompt_ids, prompt_mask)
        prefix, last = self.decoder.prefill(*first_tokens_first(prompt_ids[rows.first], prompt_mask[rows.first]))
        return prefix, last, rows

    # ----------------------------------------------------------------------------------- scoring
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        scored: torch.Tensor | None = None,
    ) -> HeadInput:
        """Final hidden states ([S, C, d]) predicting each completion token, and the LM head.

        Each distinct prompt runs once; its samples' completions attend to its keys/values (with their
        graph) in one grouped matmul, so the prompt's gradient is the sum over its samples. With
        ``scored``, the positions after each row's last scored token are not computed (`Packed`).
        """
        fast = self.decoder
        C = completion_ids.shape[1]
        needed = None
        if scored is not None and C > 1:  # input t feeds the scored tokens after it: t < each row's last scored column
            last = C - 1 - scored.flip(1).int().argmax(1)  # [S] (0 for a row with nothing scored)
            last = torch.where(scored.any(1), last, torch.zeros_like(last))
            needed = torch.arange(C - 1, device=last.device) < last[:, None]  # [S, C-1]
        cache = self._prompt_cache
        if cache is not None and torch.is_grad_enabled() and cache.holds_one_prompt(prompt_ids, prompt_mask):
            prefix, last, lengths = cache.prefix(prompt_ids, prompt_mask, fast)
            hidden = last[:, None]  # [S, 1, d]
            if C > 1:
                position = lengths[:, None] + torch.arange(C - 1, device=prompt_ids.device)  # [S, C-1]
                rest = fast.extend(completion_ids[:, :-1], position, prefix, fast.new_cache(), C - 1, needed)
                hidden = torch.cat([hidden, rest], 1)  # [S, C, d]
            return HeadInput(hidden, fast.head)
        rows = self._rows(prompt_ids, prompt_mask)
        prompts, lengths = first_tokens_first(prompt_ids[rows.first], prompt_mask[rows.first])
        if C == 1:
            hidden = fast.prefill(prompts, lengths)[1][rows.inverse, None]  # [S, 1, d]
        else:  # the prompts and the completions in one pass
            last, rest = fast.score(prompts, lengths, rows, completion_ids[:, :-1], needed)  # [U, d], [S, C-1, d]
            hidden = torch.cat([last[rows.inverse, None], rest], 1)  # [S, C, d]
        return HeadInput(hidden, fast.head)

    @contextmanager
    def prompt_cache(self) -> Iterator[None]:
        """Within: scoring calls whose rows share one prompt run that prompt once while it repeats;
        each sample back-propagates into the prompt's cached keys/values, and the prompt's own backward
        runs once, when the next prompt arrives and on exit (so call `backward` inside)."""
        outer, self._prompt_cache = self._prompt_cache, _PromptCache()
        try:
            yield
        finally:
            cache, self._prompt_cache = self._prompt_cache, outer
            cache.flush()


class PlainDecoding:
    """Rows decoding through the plain-torch decoder: the prompts' `Prefix` and the completion cache."""

    def __init__(
        self, decoder: FastDecoder, logits, features, prefix: Prefix, cache: KVCache, position: torch.Tensor
    ) -> None:
        self.decoder = decoder
        self.logits = logits  # [S, V]
        self.features = features  # [S, d]
        self.prefix = prefix
        self.cache = cache
        self.position = position  # [S, 1] the next token's position

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        fast = self.decoder
        out = fast.head(fast.extend(tokens[:, None], self.position, self.prefix, self.cache, 1)[:, -1])  # [S, V]
        self.position = self.position + 1
        return out

    def decode_many(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` ([S, k]: k columns, in one pass) and return the logits after the last ([S, V])."""
        fast, k = self.decoder, tokens.shape[1]
        position = self.position + torch.arange(k, device=tokens.device)  # [S, k]
        out = fast.head(fast.extend(tokens, position, self.prefix, self.cache, 1)[:, -1])  # [S, V]
        self.position = self.position + k
        return out

    def retain(self, rows: torch.Tensor) -> torch.Tensor:
        """Keep every prompt with a row in ``rows`` and all of that prompt's rows (the grouped layout
        holds a prompt's G rows together); the kept rows' prefix and cache entries are copied out."""
        prefix, G = self.prefix, self.prefix.group
        prompts = torch.unique(rows // G)  # [U'] sorted
        if len(prompts) == prefix.prompts:
            return keep_all(rows, self.position.shape[0])
        kept = (prompts[:, None] * G + torch.arange(G, device=rows.device)).flatten()  # [U' * G]
        self.prefix = Prefix(
            [k.index_select(0, prompts) for k in prefix.keys],
            [v.index_select(0, prompts) for v in prefix.values],
            prefix.bias.index_select(0, prompts),
            prefix.lengths.index_select(0, prompts),
            G,
        )
        self.cache.select_prompts(prompts, prefix.prompts)
        self.position = self.position.index_select(0, kept)
        return kept


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
        """The rows' `Prefix`, the prompt's final hidden state ([S, d]) and prompt lengths ([S])."""
        key = tuple(ids[0][mask[0].bool()].tolist())
        if key != self.key:
            self.flush()
            prefix, hidden = fast.prefill(*first_tokens_first(ids[:1], mask[:1]))  # [1, d]
            self.outputs = [*prefix.keys, *prefix.values, hidden]
            # an output no trainable weight reaches (layer 0's keys when LoRA skips k_proj) stays a constant
            self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self.outputs]
            self.key, self.bias, self.lengths = key, prefix.bias, prefix.lengths
        layers = (len(self.leaves) - 1) // 2
        S = ids.shape[0]
        prefix = Prefix(self.leaves[:layers], self.leaves[layers:-1], self.bias, self.lengths, group=S)
        return prefix, self.leaves[-1].expand(S, -1), self.lengths.expand(S)

    def flush(self) -> None:
        """Back-propagate what the samples accumulated on the prompt's keys/values through its prefill."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self.key, self.outputs, self.leaves = None, [], []
