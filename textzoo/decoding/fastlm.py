"""A plain-torch forward of transformers decoders over the module's own weights, one architecture a table entry.

`FastDecoder.build(model)` returns a decoder for a supported model (None otherwise): it reads the
parameters of the module at every call, so gradients, optimizers and checkpoints are unchanged; it
only skips transformers' per-call overhead (mask construction, cache objects, kwargs plumbing), which
dominates for the tiny models textzoo trains on CPU. Under autocast it reads one cast copy per weight
version (`autocast_weight`), each layer's q/k/v and gate/up projections fused into one copy and one
matmul each (`autocast_fused`), the gradients landing on the float32 weights. `ARCHITECTURES` maps
``config.model_type`` to an `Architecture`: where the trunk and its blocks live, one forward function
(GPT-2; Llama / Qwen2 / Mistral share one; Qwen3 adds q/k norms to it), the final norm, the head
counts, and which modules that forward reproduces exactly (unwrapped `nn.Linear` / `Conv1D` layers,
full attention, no extra sub-layers). A LoRA- or otherwise-wrapped layer, cross-attention or a sliding
window makes `build` return None, and active dropout makes `usable` false; callers then run the
transformers module.

`prefill(ids, lengths)` runs the prompts of a batch once each (`Prefix`); `extend(ids, position,
prefix, cache, keep)` runs the tokens after them, the rows that share a prompt (a group of G samples)
attending to its keys/values in one grouped matmul instead of G copies of them. A decode step thus
reads a prompt's keys once per group rather than once per row (attention is memory-bound there), and
in scoring the prompt's gradient is accumulated by the same matmul instead of a scatter of copies.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import activations
from transformers.pytorch_utils import Conv1D

from textzoo.decoding import compiled, mixed_gemm
from textzoo.decoding.precision import native_bf16

FUSE_PROJECTIONS = True
"""Under autocast, compute each layer's q/k/v projections, and its MLP's gate/up projections, as one
matmul over one cast copy of their weights (`FastDecoder.fused`): fewer, wider matmuls and fewer ops
per token. Off: one matmul per projection (the float32 path)."""

GROUPED_SCORES_LIMIT = 1 << 24
"""Attention scores (per layer) above which a multi-token `extend` (scoring) uses one fused sdpa call
over per-row copies of the prompt instead of the grouped matmul: the grouped form keeps its scores
for backward, O(T x (P+T)) per row, which long completions on a GPU cannot afford."""


class _Cast(NamedTuple):
    weights: tuple[weakref.ref, ...]  # the weights it was made from (a fused copy: several)
    version: tuple  # each weight's version counter and storage when it was made
    copy: torch.Tensor  # in the compute dtype (`_CASTS`: with autograd when a weight trains; `_PACKED`: packed)


_CASTS: dict[tuple[int, ...], _Cast] = {}
"""Weight ids -> their cast copy: one weight's (`autocast_weight`) or several fused (`autocast_fused`)."""
_PACKED: dict[tuple[int, ...], _Cast] = {}
"""Weight ids -> their packed copy (`packed_weight`)."""


def _versions(weights: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((w._version, w.data_ptr()) for w in weights)


def _cached(cache: dict, weights: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """The copy of ``weights`` that ``cache`` holds for their current versions in ``dtype``, else None."""
    hit = cache.get(tuple(id(w) for w in weights))
    if hit is None or hit.copy.dtype != dtype or hit.version != _versions(weights):
        return None
    return hit.copy if all(ref() is w for ref, w in zip(hit.weights, weights)) else None


def _remember(cache: dict, weights: tuple[torch.Tensor, ...], copy: torch.Tensor) -> torch.Tensor:
    """Keep ``copy`` of ``weights`` in ``cache`` until they change or one of them is freed."""
    key = tuple(id(w) for w in weights)
    if key not in cache:
        for w in weights:
            weakref.finalize(w, cache.pop, key, None)
    cache[key] = _Cast(tuple(weakref.ref(w) for w in weights), _versions(weights), copy)
    return copy


def forget_casts(optimizer: torch.optim.Optimizer, *_) -> None:
    """Drop the cast and packed copies of ``optimizer``'s parameters, fused ones included (after its step:
    fused AdamW writes the weights without moving their version counters, so the versions alone would not tell)."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for cache in (_CASTS, _PACKED):
        for key in [k for k in cache if not ids.isdisjoint(k)]:
            cache.pop(key, None)


register_optimizer_step_post_hook(forget_casts)


def forget_packed() -> None:
    """Drop every packed copy (`packed_weight`): the update, which reads none, runs without them."""
    _PACKED.clear()


def _cast_dtype(weight: torch.Tensor) -> torch.dtype | None:
    """The dtype `autocast_weight` casts ``weight`` to now; None when it returns the weight itself."""
    if weight.dtype != torch.float32 or type(weight.data) is not torch.Tensor:
        return None
    device = weight.device.type
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device) or not torch.is_autocast_cache_enabled():
        return None  # a CUDA graph capture turns the cache off: its casts must stay inside the graph
    dtype = torch.get_autocast_dtype(device)
    if torch.is_inference_mode_enabled() or dtype == torch.float32:
        return None
    return dtype


def _fused_dtype(weights: tuple[torch.Tensor, ...]) -> torch.dtype | None:
    """The dtype `autocast_fused` casts ``weights`` to now (all alike, on one device); None when it would not."""
    dtype = _cast_dtype(weights[0])
    if dtype is None or any(_cast_dtype(w) != dtype or w.device != weights[0].device for w in weights[1:]):
        return None
    return dtype


def autocast_weight(weight: torch.Tensor | None) -> torch.Tensor | None:
    """``weight`` in the autocast dtype when autocast (with its cache) is on for its device, else itself.

    One copy per weight version, shared by every forward until the weight changes (an optimizer step:
    `forget_casts`; an in-place write such as a load: its version counter): the rollout's decode steps,
    scoring calls and the update's micro-batches all read it, where autocast casts once per autocast
    region, and a frozen weight (a LoRA base) at every call.
    With gradients on, a trainable weight's copy comes through a cast node (`_CastBack`) made at this call,
    whose backward adds the copy's gradient to the float32 weight's ``.grad`` in place: the same sum as
    autocast's cast-back then accumulation, without a float32 temporary per weight per backward pass. A
    node per call, not one cached with the copy: a cached node keeps the autograd sequence number of
    the thread and moment that made it, so the order in which a backward pass adds it and the rest of
    the graph into a shared ``.grad`` (a tied head and embedding) would depend on which thread ran
    the update (`UpdateConfig.parallel_jobs`) and on what ran before."""
    dtype = None if weight is None else _cast_dtype(weight)
    if dtype is None:
        return weight
    copy = _cached(_CASTS, (weight,), dtype)
    if copy is None:
        copy = _remember(_CASTS, (weight,), weight.detach().to(dtype))
    if weight.requires_grad and torch.is_grad_enabled():
        return _CastBack.apply(weight, copy)
    return copy


def autocast_fused(weights: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """The weights ([n_i, d] each) concatenated along their first axis in the autocast dtype, one copy per
    weight version as in `autocast_weight` (one matmul then computes q/k/v, or gate/up, together);
    None when `autocast_weight` would not cast them (no autocast or its cache, float32 autocast, other
    dtypes) or they differ in dtype or device. Trainable weights' gradients land on each weight's own
    ``.grad`` (`_FusedCastBack`), so the parameters, their names and optimizer state stay as they are."""
    dtype = _fused_dtype(weights)
    if dtype is None:
        return None
    copy = _cached(_CASTS, weights, dtype)
    if copy is None:
        copy = _remember(_CASTS, weights, torch.cat([w.detach().to(dtype) for w in weights]))
    if any(w.requires_grad for w in weights) and torch.is_grad_enabled():
        return _FusedCastBack.apply(copy, *weights)
    return copy


PACKED_MATMULS = True
"""Gradient-free bfloat16 forwards on CPU multiply by packed weight copies (`packed_weight`)."""


def packed_weight(weights: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """The weights ([n_i, d] each; several: concatenated along their first axis, as `autocast_fused`) in
    bfloat16 and in oneDNN's packed layout, for a forward without gradients on a CPU that computes bf16
    natively (sampling, old and reference log-probs): `matmul` by it skips the reorder of the weight that
    every ``F.linear`` call makes, which dominates at decode shapes (SmolLM2-135M, 32 rows, 1 thread:
    46 -> 35 ms of matmuls per token, the same products bit for bit). Packed from the weights' cast copy
    (which stays for the update); one copy per weight version until an optimizer step or `forget_packed`.
    None where it does not apply (gradients on, float32 compute, another device, weights that differ in
    dtype or device)."""
    first = weights[0]
    if not PACKED_MATMULS or torch.is_grad_enabled() or first.device.type != "cpu" or not _native_bf16_cpu():
        return None
    dtype = _fused_dtype(weights) if len(weights) > 1 else (_cast_dtype(first) or first.dtype)
    if dtype != torch.bfloat16 or type(first.data) is not torch.Tensor:
        return None
    copy = _cached(_PACKED, weights, dtype)
    if copy is None:  # packed from the cast copy, which the update then reads as it is
        dense = autocast_fused(weights) if len(weights) > 1 else autocast_weight(first)
        copy = _remember(_PACKED, weights, torch.ops.mkldnn._reorder_linear_weight(dense.detach()))
    return copy


@functools.cache
def _native_bf16_cpu() -> bool:
    return native_bf16(torch.device("cpu"))


def matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, sources: tuple[torch.Tensor, ...] = ()
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a weight as it is or packed (`packed_weight`; ``x`` is cast to its
    dtype). ``sources``: the float32 weights ``weight`` is the cast copy of (`FastDecoder.weights`), whose
    ``.grad`` the weight gradient then goes into directly where it can (`_LinearIntoGrad`)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, bias, "none", [], "")
    if sources and _into_grad(weight, sources):
        return _LinearIntoGrad.apply(x.to(weight.dtype), weight.detach(), bias, *sources)
    return F.linear(x, weight, bias)


GRAD_INTO_WEIGHTS: bool | None = None
"""Bf16 linear layers on CPU add their weight gradient to the float32 weights' ``.grad`` in one mixed
GEMM (`mixed_gemm.add_product`) instead of a bf16 product, a cast and an add (`_LinearIntoGrad`):
None where that is the faster (`mixed_gemm.fast`: CPUs with AMX), True or False to force it (A/B runs)."""


def grad_into_weights() -> bool:
    """Whether bf16 weight gradients go through the mixed GEMM in this process (`GRAD_INTO_WEIGHTS`)."""
    if GRAD_INTO_WEIGHTS is None:
        return mixed_gemm.fast()
    return GRAD_INTO_WEIGHTS and mixed_gemm.available()


def _into_grad(weight: torch.Tensor, sources: tuple[torch.Tensor, ...]) -> bool:
    """Whether `matmul` by the cast copy ``weight`` of ``sources`` takes `_LinearIntoGrad` now."""
    return (
        torch.is_grad_enabled()
        and weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and any(w.requires_grad for w in sources)
        and all(w.dtype == torch.float32 and type(w.data) is torch.Tensor for w in sources)
        and grad_into_weights()
    )


class _LinearIntoGrad(torch.autograd.Function):
    """``F.linear(x, copy, bias)`` for the bf16 cast ``copy`` of float32 ``weights`` (their rows
    concatenated when several) whose backward adds ``grad.T @ x`` to each trainable weight's float32
    ``.grad`` in place with float32 products and sums (`mixed_gemm.add_product`): no bf16 weight
    gradient, no cast and no add per weight per backward pass. The bias's gradient flows as usual."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, copy: torch.Tensor, bias: torch.Tensor | None, *weights: torch.Tensor):
        ctx.save_for_backward(x, copy)
        ctx.weights = weights  # leaf parameters: holding them makes no reference cycle
        return F.linear(x, copy, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, copy = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).contiguous()  # [N, sum of out]
        inputs = x.reshape(-1, x.shape[-1]).contiguous()  # [N, in]
        start = 0
        for weight in ctx.weights:
            if weight.requires_grad:
                first = weight.grad is None
                if first:
                    weight.grad = torch.empty_like(weight)
                part = rows[:, start : start + weight.shape[0]]
                mixed_gemm.add_product(weight.grad, part, inputs, accumulate=not first)
            start += weight.shape[0]
        grad_x = grad @ copy if ctx.needs_input_grad[0] else None
        grad_bias = rows.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias, *(None for _ in ctx.weights)


class _FusedCastBack(torch.autograd.Function):
    """``copy``, the cast ``cat(weights)``, as a function of ``weights``: its backward accumulates each
    weight's rows of the gradient into its own float32 ``.grad`` (in place, as `_CastBack`)."""

    @staticmethod
    def forward(ctx, copy: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        ctx.weights = weights  # leaf parameters: holding them makes no reference cycle
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        for weight, part in zip(ctx.weights, grad.split([w.shape[0] for w in ctx.weights])):
            if weight.requires_grad:
                _add_grad(weight, part)
        return (None, *(None for _ in ctx.weights))


class _CastBack(torch.autograd.Function):
    """``copy``, the cast ``weight``, as a function of ``weight``: its backward accumulates into
    ``weight.grad`` itself (float32, in place)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        ctx.weight = weight  # a leaf parameter: holding it makes no reference cycle
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        _add_grad(ctx.weight, grad)
        return None, None


def _add_grad(weight: torch.Tensor, grad: torch.Tensor) -> None:
    """Add ``grad`` (the cast copy's gradient) to ``weight.grad`` in the weight's dtype, in place."""
    if weight.grad is None:
        weight.grad = grad.to(weight.dtype)
    else:
        accumulate(weight.grad, grad)


ACCUMULATE_CHUNK = 1 << 18
"""Elements per in-place add of `accumulate`: a float32 temporary of 1 MiB, which the allocator reuses
from the heap. Whole-tensor mixed-dtype adds make a weight-sized float32 temporary each, fresh pages
the kernel zeroes and faults in every time (SmolLM2's 49,152 x 576 head: ~70-80 ms per add, ~9 ms in
chunks; a 1536 x 576 MLP weight 0.8 vs 0.2 ms)."""


def accumulate(total: torch.Tensor, grad: torch.Tensor) -> None:
    """``total += grad`` in place (``total`` float32, ``grad`` e.g. bfloat16: the same sum, each element
    cast to float32 and added), a chunk of `ACCUMULATE_CHUNK` elements at a time."""
    n = total.numel()
    if n <= ACCUMULATE_CHUNK or grad.dtype == total.dtype or not total.is_contiguous():
        total.add_(grad)
        return
    flat, src = total.view(-1), grad.reshape(-1)
    for start in range(0, n, ACCUMULATE_CHUNK):
        flat[start : start + ACCUMULATE_CHUNK].add_(src[start : start + ACCUMULATE_CHUNK])


class _RowGrad(torch.autograd.Function):
    """``F.embedding(ids, weight)`` whose backward adds the looked-up rows' gradients into ``weight.grad``
    in place (`index_add_`), instead of a dense zero-filled [V, d] gradient per backward pass."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.weight, ctx.padding_idx = weight, padding_idx
        ctx.save_for_backward(ids)
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight, (ids,) = ctx.weight, ctx.saved_tensors
        rows, grad = ids.reshape(-1), grad.reshape(-1, weight.shape[1]).to(weight.dtype)
        if ctx.padding_idx is not None:  # the padding row keeps a zero gradient, as in the module
            keep = rows != ctx.padding_idx
            rows, grad = rows[keep], grad[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, rows, grad)
        return None, None, None


def embed(embedding: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """``embedding(ids)``; under autocast, a trainable table's gradient is accumulated row-wise (`_RowGrad`):
    a 49,152 x 576 vocabulary then costs no dense [V, d] gradient per micro-batch (float32 runs keep the
    module's own backward, and with it their exact sums)."""
    weight = embedding.weight
    device = weight.device.type
    autocasting = device in ("cpu", "cuda") and torch.is_autocast_enabled(device)
    if not (autocasting and weight.requires_grad and torch.is_grad_enabled()) or type(weight.data) is not torch.Tensor:
        return embedding(ids)
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return embedding(ids)
    return _RowGrad.apply(weight, ids, embedding.padding_idx)


MATMUL_ATTENTION_SCORES = 1 << 22
"""Causal attention scores (per layer) up to which a bfloat16/float16 prompt on CPU attends by two batched
matmuls and a float32 softmax (`causal_attention`) instead of sdpa: at prompt lengths of tens to hundreds,
the CPU's fused half-precision kernel runs its forward and backward about 3x slower than that (e.g.
[2, 9, 90, 64]: 6.0 vs 1.8-2.4 ms). float32 and other devices keep sdpa."""


def _matmul_attention(q: torch.Tensor, length: int) -> bool:
    """Whether a causal self-attention of queries ``q`` ([U, H, P, D]) over ``length`` keys takes `causal_attention`."""
    half = q.dtype in (torch.bfloat16, torch.float16)
    return half and q.device.type == "cpu" and q.shape[0] * q.shape[1] * length * length <= MATMUL_ATTENTION_SCORES


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax attention of q [U, H, P, D] over k, v [U, H_kv, P, D] (grouped-query: query head h
    reads kv head h // (H / H_kv)), the scores' softmax in at least float32 -> [U, H, P, D]."""
    U, H, P, D = q.shape
    H_kv = k.shape[1]
    rep = H // H_kv
    scores = (q * scale).reshape(U, H_kv, rep * P, D) @ k.transpose(-1, -2)  # [U, H_kv, rep*P, P]
    future = torch.ones((P, P), dtype=torch.bool, device=q.device).triu(1)  # [P, P] key after query
    scores = scores.view(U, H_kv, rep, P, P).masked_fill(future, float("-inf"))
    weights = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    weights = weights.view(U, H_kv, rep * P, P)
    return (weights @ v).view(U, H, P, D)


def _padding_bias(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[U, 1, 1, width] additive key bias of U prompts of ``lengths`` tokens (real tokens first): 0 on a
    prompt's tokens, -inf on the padding after them."""
    real = torch.arange(width, device=lengths.device) < lengths[:, None]  # [U, width]
    bias = torch.zeros((len(lengths), 1, 1, width), dtype=dtype, device=lengths.device)
    return bias.masked_fill_(~real[:, None, None, :], float("-inf"))


def _causal_bias(T: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """[T, past+T] additive bias of T new positions after ``past`` cached ones: query t sees the keys up
    to its own (-inf after); None for one new position, which sees them all."""
    if T < 2:
        return None
    later = torch.arange(past + T, device=device) > torch.arange(T, device=device)[:, None] + past  # [T, past+T]
    return torch.zeros((T, past + T), dtype=dtype, device=device).masked_fill_(later, float("-inf"))


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

    def select_prompts(self, prompts: torch.Tensor, total: int) -> None:
        """Keep the entries of prompts ``prompts`` ([U'] of ``total``) only: `FastDecoder.extend` stores
        U prompts x H_kv heads on the first axis ([U*H_kv, G, T, D])."""
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:
                    store[i] = t.view(total, -1, *t.shape[1:]).index_select(0, prompts).flatten(0, 1)


@dataclass
class SharedRows:
    """Rows that share a prompt: prompt u is row ``first[u]``; row s has prompt ``inverse[s]``.

    ``group`` = G when the rows are U contiguous runs of G copies (the runner's layout), else 0.
    """

    first: torch.Tensor  # [U]
    inverse: torch.Tensor  # [S]
    group: int

    @classmethod
    def each(cls, rows: int, device: torch.device | str = "cpu") -> SharedRows:
        """Every row its own prompt."""
        index = torch.arange(rows, device=device)
        return cls(index, index, 1)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> SharedRows | None:
    """Rows with equal ids and mask share a prompt (numbered by first occurrence); None when all differ."""
    S = ids.shape[0]
    if S < 2:
        return None
    _, inverse = torch.unique(torch.cat([ids, mask], 1), dim=0, return_inverse=True)  # [S] sorted labels
    U = int(inverse.max()) + 1
    if U == S:
        return None
    rows = torch.arange(S, device=ids.device)
    first = torch.full((U,), S, device=ids.device).scatter_reduce(0, inverse, rows, "amin")  # [U]
    first, rank = first.sort()
    relabel = torch.empty_like(rank)
    relabel[rank] = torch.arange(U, device=ids.device)
    inverse = relabel[inverse]  # [S] prompt u's first row comes before prompt u+1's
    group = S // U if S % U == 0 and torch.equal(inverse, rows // (S // U)) else 0
    return SharedRows(first, inverse, group)


def prompt_runs(ids: torch.Tensor, mask: torch.Tensor) -> SharedRows | None:
    """The runner's layout: runs of G > 1 copies of a prompt (two runs may hold the same prompt, e.g.
    an item drawn twice); None for any other layout."""
    S = ids.shape[0]
    if S < 2:
        return None
    same = ((ids[1:] == ids[:-1]) & (mask[1:] == mask[:-1])).all(1)  # [S-1] row s+1 repeats row s
    G = int(same.logical_not().nonzero()[0]) + 1 if not bool(same.all()) else S
    if G < 2 or S % G:
        return None
    if not torch.equal(same, torch.arange(S - 1, device=ids.device) % G != G - 1):
        return None
    return SharedRows(torch.arange(0, S, G, device=ids.device), torch.arange(S, device=ids.device) // G, G)


def shared_rows(ids: torch.Tensor, mask: torch.Tensor) -> SharedRows:
    """Runs of copies when the rows form them, else distinct prompts, else one prompt per row."""
    return prompt_runs(ids, mask) or distinct_rows(ids, mask) or SharedRows.each(ids.shape[0], ids.device)


def first_tokens_first(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows ([S, P], real tokens contiguous) with their tokens moved to the front, trimmed
    to the longest; and the row lengths ([S])."""
    lengths = mask.sum(1)  # [S]
    width = ids.shape[1]
    column = torch.arange(int(lengths.max()), device=ids.device)[None, :] + (width - lengths)[:, None]
    return ids.gather(1, column.clamp(max=width - 1)), lengths


@dataclass
class Prefix:
    """Keys/values of U distinct prompts (real tokens first, then padding) shared by the rows of a batch.

    Row s attends to prompt ``s // group`` when ``group`` > 0 (the runner's layout: U contiguous runs
    of G rows); `FastDecoder.share` makes a prefix of one prompt per row for other layouts.
    """

    keys: list[torch.Tensor]  # per layer [U, H_kv, P, D]
    values: list[torch.Tensor]  # per layer [U, H_kv, P, D]
    bias: torch.Tensor  # [U, 1, 1, P] additive: 0 on a prompt's tokens, -inf on its padding
    lengths: torch.Tensor  # [U] prompt lengths (the first completion token's position)
    group: int = 1

    @property
    def prompts(self) -> int:
        return self.bias.shape[0]


class FastDecoder:
    """Forward of a supported causal LM in plain torch ops, reading the module's parameters."""

    def __init__(self, model: nn.Module, arch: Architecture, lm: nn.Module | None = None, adapter: str | None = None):
        self.model = model  # whose parameters train and whose mode counts (a LoRA agent's adapter view)
        self.arch = arch
        lm = model if lm is None else lm  # the module holding the layers
        config = lm.config
        self.lm_head: nn.Linear | None = getattr(lm, "lm_head", None)
        self.body = getattr(lm, arch.trunk) if self.lm_head is not None else lm
        self.layers = list(getattr(self.body, arch.layers))
        self.heads, self.kv_heads = arch.heads(config)
        self.adapter = adapter
        """The LoRA adapter (peft) this decoder adds to the layers it wraps; None = the plain weights."""
        modules = [m for m in lm.modules() if _lora_base(m) is not None and adapter in m.lora_dropout]
        lora_dropout = [float(getattr(m.lora_dropout[adapter], "p", 0.0)) for m in modules]  # Identity when 0
        self.dropout = max([float(arch.dropout(config)), *lora_dropout])

    @classmethod
    def build(cls, model: nn.Module) -> FastDecoder | None:
        """A decoder for ``model`` (a causal LM, or its trunk without the LM head, or a LoRA agent's
        adapter view of a shared base) when its architecture is in `ARCHITECTURES` and the module is
        one its forward reproduces, else None."""
        adapter = getattr(model, "adapter", None)  # `textzoo.models.lora.AdapterView`: its adapter on the base
        lm = model.get_base_model() if adapter is not None else model
        config = getattr(lm, "config", None)
        arch = ARCHITECTURES.get(getattr(config, "model_type", None))
        if arch is None:
            return None
        try:
            head = getattr(lm, "lm_head", None)
            if arch.exact(getattr(lm, arch.trunk) if head is not None else lm, head, config):
                return cls(model, arch, lm, adapter)
        except AttributeError:  # a module layout this version of transformers does not have
            return None
        return None

    def linear(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        """``layer(x)`` for an `nn.Linear`, or one wrapped by peft's LoRA (this decoder's adapter added)."""
        base = _lora_base(layer)
        out = matmul(x, *self.weights(layer if base is None else base))
        return out if base is None else out + self._lora_delta(x, layer)

    @staticmethod
    def weights(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """The weight and bias of an unwrapped linear layer as `matmul` multiplies by them now: packed
        (`packed_weight`) in a gradient-free bf16 forward on CPU, else in the autocast dtype (or as they
        are); and the weight it came from (``sources`` of `matmul`; none for a packed copy)."""
        packed = packed_weight((layer.weight,))
        if packed is not None:
            return packed, autocast_weight(layer.bias), ()
        return autocast_weight(layer.weight), autocast_weight(layer.bias), (layer.weight,)

    def fused(self, *layers: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]] | None:
        """The weight and bias of ``layers`` (unwrapped `nn.Linear` layers of one input) as one layer,
        their outputs concatenated, for `matmul`: packed (`packed_weight`) or in the autocast dtype
        (`autocast_fused`), with the weights they came from as in `weights`; None when they are not all
        unwrapped (a LoRA wrapper adds its own term), only some have a bias, or nothing is cast (float32
        runs keep one matmul per layer: a float32 concatenation would copy the weights at every call)."""
        if not FUSE_PROJECTIONS or any(type(layer) is not nn.Linear for layer in layers):
            return None
        weights, biases = tuple(layer.weight for layer in layers), tuple(layer.bias for layer in layers)
        if any(b is None for b in biases) and not all(b is None for b in biases):
            return None
        if _fused_dtype(weights) is None:
            return None
        packed = packed_weight(weights)
        weight, sources = (autocast_fused(weights), weights) if packed is None else (packed, ())
        if biases[0] is None:
            return weight, None, sources
        bias = autocast_fused(biases)
        return None if bias is None else (weight, bias, sources)

    def conv(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        """``layer(x)`` ([N, in] -> [N, out]) for GPT-2's `Conv1D` (weight stored (in, out)), or one wrapped by LoRA."""
        base = _lora_base(layer)
        if base is None:
            return torch.addmm(autocast_weight(layer.bias), x, autocast_weight(layer.weight))
        return torch.addmm(autocast_weight(base.bias), x, autocast_weight(base.weight)) + self._lora_delta(x, layer)

    def _lora_delta(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        """The adapter's term B A x * scaling (0 when this decoder's adapter does not wrap ``layer``)."""
        if self.adapter not in layer.lora_A:
            return torch.zeros((), dtype=x.dtype, device=x.device)
        a, b = layer.lora_A[self.adapter], layer.lora_B[self.adapter]
        return F.linear(F.linear(x, a.weight), b.weight) * layer.scaling[self.adapter]

    @property
    def graph_safe(self) -> bool:
        """Whether a decode step has no data-dependent host logic (so it can be captured as a CUDA
        graph): rotary embeddings that rescale with the sequence length do not qualify."""
        rotary = getattr(self.body, "rotary_emb", None)
        kind = str(getattr(rotary, "rope_type", "default"))
        return "dynamic" not in kind and "longrope" not in kind

    @property
    def usable(self) -> bool:
        """Whether this forward is exact now: dropout is only reproduced by the module itself, and
        FSDP-sharded parameters (DTensors) are whole only inside the module's forward (or while unsharded)."""
        if self.model.training and self.dropout > 0:
            return False
        return not isinstance(next(self.model.parameters()), DTensor)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(len(self.layers), capacity)

    # ----------------------------------------------------------------- shared prompts, grouped rows
    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[Prefix, torch.Tensor]:
        """Run U prompts ([U, P], real tokens first, see `first_tokens_first`); return their `Prefix`
        and the final hidden state ([U, d], after the last norm) at each prompt's last token."""
        U, P = ids.shape
        prefix = Prefix([], [], _padding_bias(lengths, P, self._dtype), lengths)
        position = torch.arange(P, device=ids.device).expand(U, P)  # [U, P]
        attend = functools.partial(self._attend_prompts, prefix=prefix)
        hidden = self._hidden(ids, position, attend, rows=LastColumns(lengths - 1))  # [U, 1, d]
        return prefix, self.norm(hidden[:, 0])

    def _attend_prompts(self, i: int, q, k, v, scale: float, prefix: Prefix) -> torch.Tensor:
        """Causal self-attention of U prompts (real tokens first: padding after them changes nothing);
        q [U, P, H, D] (or [U, 1, H, D]: each prompt's last token), k/v [U, P, H_kv, D] -> [U, P or 1, H*D].
        Appends the layer's keys and values ([U, H_kv, P, D]) to ``prefix``."""
        P = k.shape[1]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        prefix.keys.append(k)  # [U, H_kv, P, D]
        prefix.values.append(v)
        gqa = self.kv_heads != self.heads
        if q.shape[2] == 1 < P:  # each prompt's last token: sees its real keys
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix.bias, scale=scale, enable_gqa=gqa)
        elif _matmul_attention(q, P):
            out = causal_attention(q, k, v, scale)  # [U, H, P, D]
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        return out.transpose(1, 2).flatten(2)

    def score(
        self,
        prompts: torch.Tensor,
        lengths: torch.Tensor,
        rows: SharedRows,
        ids: torch.Tensor,
        needed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`prefill` of U prompts ([U, P], real tokens first) and `extend` of the T tokens ``ids`` ([S, T])
        that follow them (row s after prompt ``rows.inverse[s]``) in one pass: each layer multiplies the
        prompts' and the rows' positions by each weight in one matmul, so a backward computes one gradient
        per weight instead of one per pass and adds. Returns the final hidden states (after the last norm)
        at each prompt's last token ([U, d]) and at the rows' positions ([S, T, d]); ``needed`` as `extend`.

        The pass computes the prompts' real tokens and the rows' needed positions (`Pair`)."""
        (U, P), (S, T) = prompts.shape, ids.shape
        device = ids.device
        prefix = Prefix([], [], _padding_bias(lengths, P, self._dtype), lengths)
        shared = self.share(prefix, rows)  # grouped: fills as the prompts' layers run; else gathered per layer
        cache, causal = self.new_cache(), _causal_bias(T, 0, self._dtype, device)

        def attend(i, q, k, v, scale):  # (prompts [U, P, ...], rows [S, T, ...]) -> the same, [..., H*D]
            on_prompts = self._attend_prompts(i, q[0], k[0], v[0], scale, prefix)  # [U, P, H*D]
            if not rows.group:  # one prompt per row
                shared.keys.append(prefix.keys[i].index_select(0, rows.inverse))
                shared.values.append(prefix.values[i].index_select(0, rows.inverse))
            return on_prompts, self._attend_grouped(i, q[1], k[1], v[1], scale, shared, cache, causal)

        real = torch.arange(P, device=device) < lengths[:, None]  # [U, P]
        needed = torch.ones((S, T), dtype=torch.bool, device=device) if needed is None else needed
        position = (
            torch.arange(P, device=device).expand(U, P),
            lengths[rows.inverse, None] + torch.arange(T, device=device),
        )
        layout = Pair(real, needed, last=lengths - 1)
        on_prompts, on_rows = self._hidden((prompts, ids), position, attend, rows=layout)  # [U, 1, d], [S, T, d]
        return self.norm(on_prompts[:, 0]), self.norm(on_rows)

    @staticmethod
    def share(prefix: Prefix, rows: SharedRows) -> Prefix:
        """The prefix of the batch's rows (``prefix`` holds prompts ``rows.first``): grouped when the
        rows are contiguous runs of copies (the same lists of keys and values), else gathered to one
        prompt per row."""
        if rows.group:
            return replace(prefix, group=rows.group)
        inverse = rows.inverse
        return Prefix(
            [k.index_select(0, inverse) for k in prefix.keys],
            [v.index_select(0, inverse) for v in prefix.values],
            prefix.bias.index_select(0, inverse),
            prefix.lengths.index_select(0, inverse),
            1,
        )

    def extend(
        self,
        ids: torch.Tensor,
        position: torch.Tensor,
        prefix: Prefix,
        cache: KVCache,
        keep: int,
        needed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states ([S, keep, d], after the last norm) at the last ``keep`` of T positions
        ``ids`` ([S, T]) that follow ``prefix`` and the tokens already in ``cache`` (which gets the new ones).

        ``needed`` ([S, T] bool, each row's needed positions first): the positions whose outputs are read;
        the layers' matmuls then run on those alone (see `Packed`), and the others come out as 0."""
        S, T = ids.shape
        if prefix.prompts * prefix.group != S:
            raise ValueError(f"{S} rows do not match a prefix of {prefix.prompts} prompts x {prefix.group} rows each")
        causal = _causal_bias(T, cache.get_seq_length(), self._dtype, ids.device)
        attend = functools.partial(self._attend_grouped, prefix=prefix, cache=cache, causal=causal)
        rows = Packed.of(needed) if needed is not None else ALL
        return self.norm(self._hidden(ids, position, attend, rows=rows)[:, -keep:])

    def _attend_grouped(
        self, i: int, q, k, v, scale: float, prefix: Prefix, cache: KVCache, causal: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention of S rows' T new positions (q [S, T, H, D], k/v [S, T, H_kv, D]; row s reads prompt
        s // G of ``prefix``) over their prompt, the positions in ``cache`` before them (which gets the new
        keys/values) and themselves (``causal`` [T, past+T], None for T = 1) -> [S, T, H*D]."""
        S, T, _, D = q.shape
        U, G = prefix.prompts, prefix.group
        H_kv, rep = self.kv_heads, self.heads // self.kv_heads
        k = k.reshape(U, G, T, H_kv, D).permute(0, 3, 1, 2, 4).reshape(U * H_kv, G, T, D)
        v = v.reshape(U, G, T, H_kv, D).permute(0, 3, 1, 2, 4).reshape(U * H_kv, G, T, D)
        kc, vc = cache.update(i, k, v)  # [U*H_kv, G, past+T, D]
        Tc = kc.shape[2]
        kc, vc = kc.view(U, H_kv, G, Tc, D), vc.view(U, H_kv, G, Tc, D)
        kp, vp = prefix.keys[i], prefix.values[i]  # [U, H_kv, P, D]
        P = kp.shape[2]
        if causal is not None and S * self.heads * T * (P + Tc) > GROUPED_SCORES_LIMIT:
            # A long scoring pass: fused attention over each row's copy of its prompt keys keeps no
            # [T, P+Tc] scores for backward (the grouped matmul below would, for every layer).
            return self._attend_rows(q, kp, vp, kc, vc, prefix, causal, scale)
        # Layout [U, H_kv, G, rep, T, D]: a group's queries of one kv head are one matmul batch.
        q = (q * scale).view(U, G, T, H_kv, rep, D).permute(0, 3, 1, 4, 2, 5).reshape(U, H_kv, G * rep * T, D)
        on_prompt = (q @ kp.transpose(-1, -2) + prefix.bias).view(U, H_kv, G, rep * T, P)
        on_completion = q.view(U, H_kv, G, rep * T, D) @ kc.transpose(-1, -2)  # [U, H_kv, G, rep*T, Tc]
        if causal is not None:
            on_completion = (on_completion.view(U, H_kv, G, rep, T, Tc) + causal).view(U, H_kv, G, rep * T, Tc)
        weights = torch.cat([on_prompt, on_completion], -1).softmax(-1, dtype=torch.float32).to(q.dtype)
        out = weights[..., :P].reshape(U, H_kv, G * rep * T, P) @ vp  # [U, H_kv, G*rep*T, D]
        out = out.view(U, H_kv, G, rep * T, D) + weights[..., P:] @ vc  # [U, H_kv, G, rep*T, D]
        return out.view(U, H_kv, G, rep, T, D).permute(0, 2, 4, 1, 3, 5).reshape(S, T, H_kv * rep * D)

    def _attend_rows(self, q, kp, vp, kc, vc, prefix: Prefix, causal, scale) -> torch.Tensor:
        """`extend`'s attention with the prompt's keys/values copied to each of its rows and one sdpa
        call: q [S, T, H, D]; kp/vp [U, H_kv, P, D]; kc/vc [U, H_kv, G, Tc, D] -> [S, T, H*D]."""
        S, T, H, D = q.shape
        U, H_kv, G, Tc, _ = kc.shape
        P = kp.shape[2]

        def rows(t: torch.Tensor) -> torch.Tensor:  # [U, ...] -> [S, ...], row s from prompt s // G
            return t.repeat_interleave(G, 0) if G > 1 else t

        def own(t: torch.Tensor) -> torch.Tensor:  # [U, H_kv, G, Tc, D] -> [S, H_kv, Tc, D]
            return t.transpose(1, 2).reshape(S, H_kv, Tc, D)

        keys, values = torch.cat([rows(kp), own(kc)], 2), torch.cat([rows(vp), own(vc)], 2)  # [S, H_kv, P+Tc, D]
        bias = torch.cat([rows(prefix.bias).expand(S, 1, T, P), causal.expand(S, 1, T, Tc)], -1)  # [S, 1, T, P+Tc]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=bias, scale=scale, enable_gqa=H != H_kv
        )  # [S, H, T, D]
        return out.transpose(1, 2).reshape(S, T, H * D)

    # ------------------------------------------------------------------------------------ layers
    @property
    def _dtype(self) -> torch.dtype:
        return self.body.get_input_embeddings().weight.dtype

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The trunk's final norm ([..., d])."""
        return self.arch.final_norm(self.body, hidden)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states ([..., d] -> [..., V])."""
        if self.lm_head is None:
            raise ValueError("this decoder runs a trunk without an LM head: it has hidden states, not logits")
        return matmul(hidden, *self.weights(self.lm_head))

    def _hidden(self, ids, position, attend, rows: Packed | Pair | None = None):
        """Hidden states ([S, T, d]) of ``ids`` at ``position`` ([S, T] each) before the final norm;
        ``attend(layer, q, k, v, scale)`` mixes positions. With ``rows`` (a `Packed`), the layers compute
        the packed positions only (the others are 0); with a `Pair`, ids, positions and the result are pairs."""
        return self.arch.forward(self, ids, position, attend, rows or ALL)


class Packed:
    """The positions of an [S, T] batch that a pass computes: the matmuls and norms of every layer run
    on these rows of the flattened batch ([N, ...]); attention sees them scattered back into [S, T, ...]
    with zeros elsewhere. Exact for causal attention when each row's computed positions come first (a
    position never attends to a later one). Scoring a batch of completions of different lengths thus
    skips the padding after each row's last scored token, which can be half of its positions.

    A layout of a pass (this class, `LastColumns`, `Pair`) also says where the pass reads outputs: the
    forwards run the last block's queries, attention and MLP on ``last(x)`` (here: every position) and
    unpack them with ``out``; the other positions only give keys and values."""

    PACK_BELOW = 0.9
    """Pack only when fewer than this share of the positions are needed (else the gathers cost more)."""

    def __init__(self, index: torch.Tensor | None, shape: tuple[int, int]) -> None:
        self.index = index  # [N] positions of the flattened [S*T] batch; None = all
        self.shape = shape

    @classmethod
    def of(cls, needed: torch.Tensor) -> Packed:
        """The needed positions (``needed`` [S, T] bool), or all of them when most are needed."""
        if needed.numel() == 0 or float(needed.float().mean()) >= cls.PACK_BELOW:
            return ALL
        return cls(needed.reshape(-1).nonzero().squeeze(1), tuple(needed.shape))

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[S, T, ...] -> [N, ...] (unchanged when every position is computed)."""
        return x if self.index is None else x.reshape(-1, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [S, T, ...], 0 at the positions not computed (unchanged when all are)."""
        if self.index is None:
            return x
        S, T = self.shape
        return x.new_zeros(S * T, *x.shape[1:]).index_copy(0, self.index, x).view(S, T, *x.shape[1:])

    def last(self, x: torch.Tensor) -> torch.Tensor:
        """The positions whose outputs the pass reads, of a packed tensor: all of them."""
        return x

    @property
    def out(self) -> Packed:
        """The layout of `last`'s positions."""
        return self


ALL = Packed(None, (0, 0))
"""Every position computed (no packing)."""


class LastColumns(Packed):
    """Every position of a [U, P] batch computed (prompts: their keys and values), the outputs read at one
    column per row (``columns`` [U]: each prompt's last token), where alone the last block runs."""

    def __init__(self, columns: torch.Tensor) -> None:
        super().__init__(None, (0, 0))
        self.columns = columns

    def last(self, x: torch.Tensor) -> torch.Tensor:
        """[U, P, ...] -> [U, 1, ...] at each row's column."""
        return x[torch.arange(x.shape[0], device=x.device), self.columns][:, None]

    @property
    def out(self) -> Packed:
        return ALL


class Pair:
    """Two batches in one pass: the computed positions of the first ([U, P], e.g. prompts) then of the
    second ([S, T], e.g. the completions that follow them), each packed as `Packed.of` packs it: each
    layer's matmuls run on both at once; `pack` and `unpack` take and give a pair of tensors, and so does
    the pass's ``attend`` (which mixes positions within each batch, and across them as it likes). With
    ``last`` ([U]), the outputs of the first batch are read at that column of each row only (`Packed`)."""

    def __init__(self, first: torch.Tensor, second: torch.Tensor, last: torch.Tensor | None = None) -> None:
        self.parts = (Packed.of(first), Packed.of(second))
        self.shapes = (tuple(first.shape), tuple(second.shape))
        self.keep: torch.Tensor | None = None  # the positions `last` keeps, of the packed pass
        self._out = self
        if last is not None:
            (U, P), index = first.shape, self.parts[0].index
            columns = torch.arange(U, device=last.device) * P + last  # [U] in the flattened first batch
            counts = [m.numel() if p.index is None else len(p.index) for p, m in zip(self.parts, (first, second))]
            ahead = columns if index is None else torch.searchsorted(index, columns)
            self.keep = torch.cat([ahead, torch.arange(counts[0], sum(counts), device=last.device)])
            self._out = copy.copy(self)  # the first batch at `last` only, all of it computed; the second as it is
            self._out.parts, self._out.shapes = (ALL, self.parts[1]), ((U, 1), self.shapes[1])
            self._out.keep, self._out._out = None, self._out

    def pack(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """([U, P, ...], [S, T, ...]) -> [N, ...]."""
        return torch.cat([part.pack(t).reshape(-1, *t.shape[2:]) for part, t in zip(self.parts, x)])

    def unpack(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, ...] -> ([U, P, ...], [S, T, ...]), 0 at the positions not computed."""
        out, start = [], 0
        for part, (S, T) in zip(self.parts, self.shapes):
            n = S * T if part.index is None else len(part.index)
            piece = x[start : start + n]
            out.append(piece.view(S, T, *x.shape[1:]) if part.index is None else part.unpack(piece))
            start += n
        return out[0], out[1]

    def last(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> the positions whose outputs the pass reads."""
        return x if self.keep is None else x.index_select(0, self.keep)

    @property
    def out(self) -> Pair:
        return self._out


# ------------------------------------------------------------------- architectures: one forward each
def gpt2_forward(dec: FastDecoder, ids, position, attend, rows: Packed = ALL) -> torch.Tensor:
    """GPT-2: learned positions, pre-LayerNorm blocks, fused qkv `Conv1D` (weights stored (in, out))."""
    body = dec.body
    ids, position = rows.pack(ids), rows.pack(position)  # [S, T], or packed [N]
    hidden = body.wte(ids) + body.wpe(position)  # [..., d] (padding_idx: 0 grad)
    layout = rows
    for i, block in enumerate(dec.layers):
        lead, d = hidden.shape[:-1], hidden.shape[-1]  # (S, T) or (N,)
        attn, mlp = block.attn, block.mlp
        x = _layer_norm(hidden, block.ln_1).reshape(-1, d)
        qkv = dec.conv(x, attn.c_attn).view(*lead, 3, dec.heads, -1)  # [..., 3, H, D]
        q, k, v = qkv.unbind(-3)
        if i == len(dec.layers) - 1:  # the last block's queries and outputs where the pass reads outputs
            q, hidden, layout = rows.last(q), rows.last(hidden), rows.out
            lead = hidden.shape[:-1]
        out = layout.pack(attend(i, layout.unpack(q), rows.unpack(k), rows.unpack(v), attn.scaling)).reshape(-1, d)
        hidden = hidden + dec.conv(out, attn.c_proj).view(*lead, d)
        x = _layer_norm(hidden, block.ln_2).reshape(-1, d)
        x = mlp.act(dec.conv(x, mlp.c_fc))  # [S*T, 4d]
        hidden = hidden + dec.conv(x, mlp.c_proj).view(*lead, d)
    return layout.unpack(hidden)


def llama_forward(dec: FastDecoder, ids, position, attend, rows: Packed = ALL, qk_norm: bool = False) -> torch.Tensor:
    """Llama / Qwen2 / Mistral: RoPE, RMSNorm, grouped-query attention, SwiGLU MLP (with ``qk_norm``,
    an RMSNorm on each head's queries and keys before RoPE).

    Under autocast, each norm's output and each rotated query/key is cast to the compute dtype once,
    where autocast would cast it at every matmul that reads it: the same values, and keys/values (the
    prompt's and the KV cache's) kept in that dtype instead of cast again at every decode step. The
    elementwise work between the matrix products is three functions (`_add_norm`, `_rope_cast`,
    `_silu_mul`), which a bf16 update pass on CPU runs compiled (`textzoo.decoding.compiled`)."""
    body = dec.body
    ids, position = rows.pack(ids), rows.pack(position)  # [S, T], or packed [N]
    hidden = embed(body.embed_tokens, ids)  # [..., d] (padding_idx keeps a zero gradient)
    cos, sin = body.rotary_emb(hidden, position.reshape(1, -1))  # [1, S*T or N, D] each
    # [..., 1, D]; rotate_half(x) * sin = x.roll(D/2) * signed sin (`_rope`)
    cos, sin = cos.view(*position.shape, 1, -1), _signed_sin(sin).view(*position.shape, 1, -1)
    dtype = _autocast_dtype(hidden)
    layout, delta = rows, None  # delta: the previous layer's MLP output, added by the next norm's region
    for i, layer in enumerate(dec.layers):
        attn, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
        hidden, x = _ADD_NORM(hidden, delta, norm.weight, norm.variance_epsilon, dtype)
        lead = hidden.shape[:-1]  # (S, T) or, packed, (N,)
        qkv = dec.fused(attn.q_proj, attn.k_proj, attn.v_proj)  # one [(H + 2 H_kv) D, d] weight, or None
        if qkv is None:
            q, k, v = (dec.linear(x, proj) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        else:  # one split (its backward is one concatenation, where slices would each zero-fill a gradient)
            nq, nkv = attn.q_proj.out_features, attn.k_proj.out_features
            q, k, v = matmul(x, *qkv).split([nq, nkv, nkv], -1)  # [..., H D], [..., H_kv D] x 2
        q = q.view(*lead, dec.heads, -1)  # [..., H, D]
        k, v = k.view(*lead, dec.kv_heads, -1), v.view(*lead, dec.kv_heads, -1)  # [..., H_kv, D]
        if qk_norm:
            q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
        q, k = _ROPE_CAST(q, k, cos, sin, dtype).split([dec.heads, dec.kv_heads], -2)  # rotated at once
        if i == len(dec.layers) - 1:  # the last block's queries and outputs where the pass reads outputs
            q, hidden, layout = rows.last(q), rows.last(hidden), rows.out
        out = layout.pack(attend(i, layout.unpack(q), rows.unpack(k), rows.unpack(v), attn.scaling))
        norm = layer.post_attention_layernorm
        hidden, x = _ADD_NORM(hidden, dec.linear(out, attn.o_proj), norm.weight, norm.variance_epsilon, dtype)
        gate_up = dec.fused(mlp.gate_proj, mlp.up_proj)  # one [2 I, d] weight, or None
        if gate_up is None:
            gate, up = dec.linear(x, mlp.gate_proj), dec.linear(x, mlp.up_proj)
        else:
            gate, up = matmul(x, *gate_up).chunk(2, -1)  # [..., I] each
        silu = isinstance(mlp.act_fn, _SILU) and not getattr(mlp.act_fn, "inplace", False)
        delta = dec.linear(_SILU_MUL(gate, up) if silu else mlp.act_fn(gate) * up, mlp.down_proj)
    return layout.unpack(hidden + delta)


def _add_norm(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, dtype):
    """``hidden + delta`` (``hidden`` when None) and Llama's RMSNorm of it (`_rms`), cast to ``dtype``
    (None: not cast)."""
    if delta is not None:
        hidden = hidden + delta
    x = _rms(hidden, weight, eps)
    return hidden, x if dtype is None else x.to(dtype)


def _rope_cast(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype) -> torch.Tensor:
    """Queries [..., H, D] and keys [..., H_kv, D] rotated (`_rope`) at once -> [..., H + H_kv, D], cast to
    ``dtype`` (None: not cast)."""
    qk = _rope(torch.cat([q, k], -2), cos, sin)
    return qk if dtype is None else qk.to(dtype)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


_SILU = tuple(t for t in (nn.SiLU, getattr(activations, "SiLUActivation", None)) if t is not None)
_ADD_NORM = compiled.region(_add_norm, fixed=(1, 1, None, None, None))
_ROPE_CAST = compiled.region(_rope_cast, fixed=(2, 2, 2, 2, None))
_SILU_MUL = compiled.region(_silu_mul, fixed=(1, 1))


def _autocast_dtype(like: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype of ``like``'s device; None without autocast."""
    device = like.device.type
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


def qwen3_forward(dec: FastDecoder, ids, position, attend, rows: Packed = ALL) -> torch.Tensor:
    """Qwen3: Llama's blocks with an RMSNorm on each head's queries and keys before RoPE."""
    return llama_forward(dec, ids, position, attend, rows, qk_norm=True)


def _lora_base(layer: nn.Module) -> nn.Module | None:
    """The wrapped layer when ``layer`` is peft's plain LoRA wrapper (unmerged, no DoRA or other variant),
    else None."""
    base = getattr(layer, "base_layer", None)
    if base is None or not all(hasattr(layer, a) for a in ("lora_A", "lora_B", "scaling", "merged")):
        return None
    if layer.merged or getattr(layer, "lora_variant", None) or getattr(layer, "disable_adapters", False):
        return None
    return base


def _plain(layer: nn.Module, kind: type) -> bool:
    """``layer`` is a ``kind`` (`nn.Linear`, `Conv1D`), unwrapped or inside a plain LoRA wrapper."""
    return type(layer) is kind or type(_lora_base(layer)) is kind


def _layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Llama's RMSNorm module ``norm`` applied to ``x`` (`_rms`)."""
    return _rms(x, norm.weight, norm.variance_epsilon)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in float32, scale by the weight in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` ([..., D]) with its first half negated, for `_rope`."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], -1)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``, written as
    ``x * cos + cat(x2, x1) * cat(-sin1, sin2)`` (the same products: a sign moves from one factor to the
    other), so the rotation is one roll instead of two slices, a negation and a concatenation."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


# --------------------------------------------------- which modules each forward reproduces exactly
def _plain_head(head: nn.Module | None) -> bool:
    """No LM head (a trunk) or an unwrapped `nn.Linear` one."""
    return head is None or type(head) is nn.Linear


def _full_attention(config) -> bool:
    """Every layer attends to every earlier position (no sliding window)."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        return False
    return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)


def gpt2_exact(body: nn.Module, head: nn.Module | None, config) -> bool:
    if config.add_cross_attention or not _plain_head(head):
        return False
    for block in body.h:
        convs = (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
        norms = (block.ln_1, block.ln_2)
        if not all(_plain(c, Conv1D) for c in convs) or any(type(n) is not nn.LayerNorm for n in norms):
            return False
    return type(body.ln_f) is nn.LayerNorm


def llama_exact(body: nn.Module, head: nn.Module | None, config, qk_norm: bool = False) -> bool:
    if not _full_attention(config) or not _plain_head(head):
        return False
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(_plain(m, nn.Linear) for m in linears):
            return False
        if set(dict(layer.named_children())) != {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}:
            return False  # extra sub-layers (e.g. q/k norms) this forward does not apply
        norms = {"q_norm", "k_norm"} if qk_norm else set()
        if set(dict(attn.named_children())) != {"q_proj", "k_proj", "v_proj", "o_proj", *norms}:
            return False
        if qk_norm and not all(hasattr(getattr(attn, n), "variance_epsilon") for n in norms):
            return False
    return hasattr(body.norm, "variance_epsilon")


def qwen3_exact(body: nn.Module, head: nn.Module | None, config) -> bool:
    return llama_exact(body, head, config, qk_norm=True)


# ------------------------------------------------------------------------- the architecture table
@dataclass(frozen=True)
class Architecture:
    """How `FastDecoder` reads one family of transformers causal LMs: an entry of `ARCHITECTURES`."""

    trunk: str
    """The causal LM's attribute that holds the trunk (the model without its LM head)."""
    layers: str
    """The trunk's attribute that holds its blocks."""
    forward: Callable[..., torch.Tensor]
    """``(decoder, ids [S, T], position [S, T], attend, rows) -> hidden [S, T, d]`` before the final
    norm; ``attend(layer, q, k, v, scale)`` mixes positions, ``rows`` (a `Packed`) are the positions to
    compute (see `FastDecoder._hidden`)."""
    final_norm: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """``(trunk, hidden) -> hidden`` after the trunk's final norm."""
    heads: Callable[[Any], tuple[int, int]]
    """``config -> (query heads, key/value heads)``."""
    dropout: Callable[[Any], float]
    """``config -> the largest dropout probability`` (train mode with dropout falls back to the module)."""
    exact: Callable[[nn.Module, nn.Module | None, Any], bool]
    """``(trunk, lm_head or None, config) ->`` whether `forward` reproduces this module exactly."""


GPT2 = Architecture(
    trunk="transformer",
    layers="h",
    forward=gpt2_forward,
    final_norm=lambda body, hidden: _layer_norm(hidden, body.ln_f),
    heads=lambda config: (config.n_head, config.n_head),
    dropout=lambda config: max(config.resid_pdrop, config.embd_pdrop, config.attn_pdrop),
    exact=gpt2_exact,
)
LLAMA = Architecture(
    trunk="model",
    layers="layers",
    forward=llama_forward,
    final_norm=lambda body, hidden: _rms_norm(hidden, body.norm),
    heads=lambda config: (config.num_attention_heads, config.num_key_value_heads),
    dropout=lambda config: config.attention_dropout,
    exact=llama_exact,
)
QWEN3 = replace(LLAMA, forward=qwen3_forward, exact=qwen3_exact)  # Llama's layout, q/k norms in the forward
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "qwen2": LLAMA,
    "mistral": LLAMA,
    "qwen3": QWEN3,
}
"""``config.model_type`` -> how the plain-torch decoder runs it; other models run the transformers module."""
