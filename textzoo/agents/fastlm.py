"""A plain-torch forward of GPT-2 and Llama-family decoders over the transformers module's own weights.

`FastDecoder.build(model)` returns a decoder for a supported model (None otherwise): it reads the
parameters of the module at every call, so gradients, optimizers and checkpoints are unchanged; it
only skips transformers' per-call overhead (mask construction, cache objects, kwargs plumbing), which
dominates for the tiny models textzoo trains on CPU. Supported: GPT-2 (`GPT2LMHeadModel`) and
Llama / Qwen2 / Mistral (full attention, no sliding window) with unwrapped `nn.Linear` / `Conv1D`
layers: a LoRA- or otherwise-wrapped layer, cross-attention, or active dropout makes `usable` false
and callers fall back to the module.

`KVCache` holds keys and values per layer ([S, H_kv, T, D]); with `capacity` set it writes appended
steps into preallocated room (decoding), otherwise it concatenates (differentiable, for scoring).
`reorder_cache(index)` selects rows the way transformers' caches do, so one prefill of each unique
prompt serves all of its samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

_LLAMA_LIKE = frozenset({"llama", "qwen2", "mistral"})


class KVCache:
    """Keys and values of every layer; appends grow by concatenation or into preallocated room."""

    def __init__(self, layers: int, capacity: int = 0) -> None:
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.lengths = [0] * layers
        self.capacity = capacity

    def get_seq_length(self) -> int:
        return self.lengths[0]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``, ``v`` ([S, H, T, D]) to ``layer``; return all keys and values so far."""
        n, T = self.lengths[layer], k.shape[2]
        old_k, old_v = self.keys[layer], self.values[layer]
        if not self.capacity:
            self.keys[layer] = k if old_k is None else torch.cat([old_k, k], 2)  # [S, H, n+T, D]
            self.values[layer] = v if old_v is None else torch.cat([old_v, v], 2)
            self.lengths[layer] = n + T
            return self.keys[layer], self.values[layer]
        if old_k is None:
            room = (k.shape[0], k.shape[1], max(self.capacity, T), k.shape[3])
            old_k, old_v = k.new_empty(room), v.new_empty(room)  # [S, H, capacity, D]
            self.keys[layer], self.values[layer] = old_k, old_v
        if n + T > old_k.shape[2]:
            raise ValueError(f"KVCache capacity {old_k.shape[2]} exceeded by {n + T} positions")
        old_k[:, :, n : n + T] = k
        old_v[:, :, n : n + T] = v
        self.lengths[layer] = n + T
        return old_k[:, :, : n + T], old_v[:, :, : n + T]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (row s becomes rows s*repeats ... s*repeats+repeats-1)."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                k = k[:, None].expand(-1, repeats, -1, -1, -1).flatten(0, 1)  # [S*repeats, H, T, D]
                v = v[:, None].expand(-1, repeats, -1, -1, -1).flatten(0, 1)
                if self.capacity:  # later steps write into these rows: each needs its own memory
                    k, v = k.contiguous(), v.contiguous()
                self.keys[i], self.values[i] = k, v

    def reorder_cache(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (repeats allowed) of every layer: row s becomes old row index[s]."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k.index_select(0, index), v.index_select(0, index)


def attention_bias(attention: torch.Tensor, queries: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive sdpa mask ([S, 1, T, K]) for the last ``queries`` of K positions from a 2D key mask.

    Query i (absolute position K - T + i) sees real keys up to itself. A query always sees its own
    key, so a padding query has a finite (unused) output instead of NaN, whose gradient would be NaN.
    """
    S, K = attention.shape
    past = K - queries
    q_pos = torch.arange(queries, device=attention.device)[:, None] + past  # [T, 1]
    k_pos = torch.arange(K, device=attention.device)[None, :]  # [1, K]
    visible = (attention.bool()[:, None, None, :] & (k_pos <= q_pos)) | (k_pos == q_pos)  # [S, 1, T, K]
    return torch.zeros(visible.shape, dtype=dtype, device=attention.device).masked_fill_(~visible, float("-inf"))


class FastDecoder:
    """Forward of a supported causal LM in plain torch ops, reading the module's parameters."""

    def __init__(self, model: nn.Module, kind: str) -> None:
        self.model = model
        self.kind = kind
        config = model.config
        if kind == "gpt2":
            self.body = model.transformer
            self.layers = list(model.transformer.h)
            self.heads = config.n_head
            self.kv_heads = config.n_head
            self.dropout = max(config.resid_pdrop, config.embd_pdrop, config.attn_pdrop)
        else:
            self.body = model.model
            self.layers = list(model.model.layers)
            self.heads = config.num_attention_heads
            self.kv_heads = config.num_key_value_heads
            self.dropout = float(config.attention_dropout)

    @classmethod
    def build(cls, model: nn.Module) -> FastDecoder | None:
        """A decoder for ``model`` when its architecture is supported exactly, else None."""
        config = getattr(model, "config", None)
        kind = getattr(config, "model_type", None)
        try:
            if kind == "gpt2" and _plain_gpt2(model):
                return cls(model, kind)
            if kind in _LLAMA_LIKE and _plain_llama(model):
                return cls(model, kind)
        except AttributeError:  # a module layout this version of transformers does not have
            return None
        return None

    @property
    def usable(self) -> bool:
        """Whether this forward is exact now: dropout is only reproduced by the module itself."""
        return not (self.model.training and self.dropout > 0)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(len(self.layers), capacity)

    def __call__(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor,
        position: torch.Tensor,
        cache: KVCache | None,
        keep: int,
    ) -> torch.Tensor:
        """Logits ([S, keep, V]) at the last ``keep`` of the T new positions ``ids`` ([S, T]).

        ``attention`` is the 2D key mask over cached + new positions ([S, K]) or a ready additive
        mask ([S, 1, T, K]); ``position`` ([S, T]) the position ids; new keys go to ``cache``.
        """
        dtype = self.body.get_input_embeddings().weight.dtype
        if attention.dim() == 2:
            attention = attention_bias(attention, ids.shape[1], dtype)  # [S, 1, T, K]
        if self.kind == "gpt2":
            hidden = self._gpt2(ids, attention, position, cache)  # [S, T, d]
            hidden = _layer_norm(hidden[:, -keep:], self.body.ln_f)
        else:
            hidden = self._llama(ids, attention, position, cache)
            hidden = _rms_norm(hidden[:, -keep:], self.body.norm)
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)  # [S, keep, V]

    def _gpt2(self, ids, attention, position, cache) -> torch.Tensor:
        S, T = ids.shape
        body = self.body
        hidden = body.wte(ids) + body.wpe(position)  # [S, T, d] (the modules: padding_idx keeps a zero gradient)
        d = hidden.shape[-1]
        for i, block in enumerate(self.layers):
            attn, mlp = block.attn, block.mlp
            x = _layer_norm(hidden, block.ln_1).view(S * T, d)
            qkv = torch.addmm(attn.c_attn.bias, x, attn.c_attn.weight).view(S, T, 3, self.heads, -1)  # [S, T, 3, H, D]
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x [S, H, T, D]
            if cache is not None:
                k, v = cache.update(i, k, v)  # [S, H, K, D]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention, scale=attn.scaling)  # [S, H, T, D]
            out = out.transpose(1, 2).reshape(S * T, d)
            hidden = hidden + torch.addmm(attn.c_proj.bias, out, attn.c_proj.weight).view(S, T, d)
            x = _layer_norm(hidden, block.ln_2).view(S * T, d)
            x = mlp.act(torch.addmm(mlp.c_fc.bias, x, mlp.c_fc.weight))  # [S*T, 4d]
            hidden = hidden + torch.addmm(mlp.c_proj.bias, x, mlp.c_proj.weight).view(S, T, d)
        return hidden

    def _llama(self, ids, attention, position, cache) -> torch.Tensor:
        S, T = ids.shape
        body = self.body
        hidden = body.embed_tokens(ids)  # [S, T, d] (the module: padding_idx keeps a zero gradient)
        cos, sin = body.rotary_emb(hidden, position)  # [S, T, D] each
        cos, sin = cos[:, None], sin[:, None]  # [S, 1, T, D]
        gqa = self.kv_heads != self.heads
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(hidden, layer.input_layernorm)
            q = _linear(x, attn.q_proj).view(S, T, self.heads, -1).transpose(1, 2)  # [S, H, T, D]
            k = _linear(x, attn.k_proj).view(S, T, self.kv_heads, -1).transpose(1, 2)  # [S, H_kv, T, D]
            v = _linear(x, attn.v_proj).view(S, T, self.kv_heads, -1).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            if cache is not None:
                k, v = cache.update(i, k, v)  # [S, H_kv, K, D]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention, scale=attn.scaling, enable_gqa=gqa)
            hidden = hidden + _linear(out.transpose(1, 2).reshape(S, T, -1), attn.o_proj)
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            hidden = hidden + _linear(mlp.act_fn(_linear(x, mlp.gate_proj)) * _linear(x, mlp.up_proj), mlp.down_proj)
        return hidden


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Llama's RMSNorm: normalise in float32, scale by the weight in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _plain_gpt2(model: nn.Module) -> bool:
    config = model.config
    if config.add_cross_attention or type(model.lm_head) is not nn.Linear:
        return False
    for block in model.transformer.h:
        convs = (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
        norms = (block.ln_1, block.ln_2)
        if any(type(c) is not Conv1D for c in convs) or any(type(n) is not nn.LayerNorm for n in norms):
            return False
    return type(model.transformer.ln_f) is nn.LayerNorm


def _plain_llama(model: nn.Module) -> bool:
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if type(model.lm_head) is not nn.Linear:
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(m) is not nn.Linear for m in linears):
            return False
        if set(dict(layer.named_children())) != {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}:
            return False  # extra sub-layers (e.g. q/k norms) this forward does not apply
        if set(dict(attn.named_children())) != {"q_proj", "k_proj", "v_proj", "o_proj"}:
            return False
    return hasattr(model.model.norm, "variance_epsilon")
