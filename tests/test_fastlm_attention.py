"""The matmul form of causal prompt attention (bf16 prompts on CPU) is sdpa's attention."""

import pytest
import torch
import torch.nn.functional as F

from textzoo.decoding.fastlm import causal_attention


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_causal_attention_is_sdpa(heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 9, heads, 16, dtype=torch.float64, generator=g).transpose(
        1, 2
    )  # a transposed view, as in prefill
    k, v = (torch.randn(3, kv_heads, 9, 16, dtype=torch.float64, generator=g) for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=heads != kv_heads)
    torch.testing.assert_close(causal_attention(q, k, v, 0.3), want, rtol=1e-10, atol=1e-10)
    # the first query sees its own key only
    torch.testing.assert_close(
        causal_attention(q, k, v, 0.3)[:, :, 0], v.repeat_interleave(heads // kv_heads, 1)[:, :, 0]
    )


def test_bf16_prompt_gradients_match_sdpa():
    g = torch.Generator().manual_seed(1)
    leaves = [torch.randn(2, h, 12, 8, generator=g).bfloat16().requires_grad_() for h in (6, 3, 3)]
    grads = []
    for attend in (
        causal_attention,
        lambda q, k, v, s: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s, enable_gqa=True),
    ):
        for t in leaves:
            t.grad = None
        out = attend(*leaves, 0.35)
        (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([out.float(), *(t.grad.float() for t in leaves)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)
