"""The blocked draw of large vocabularies: the float64 inverse-CDF draw's tokens, never a zero-probability one."""

import pytest
import torch

from textzoo.models.sampling import BLOCK, BLOCKED_VOCAB, draw


def _reference(logp: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One float64 running sum over the whole vocabulary (what small vocabularies use)."""
    cdf = logp.double().exp().cumsum(-1)
    return torch.searchsorted(cdf, (1.0 - uniform) * cdf[:, -1:]).squeeze(1)


@pytest.mark.parametrize("vocab", [BLOCKED_VOCAB, BLOCKED_VOCAB + 77])  # the second pads its last block
def test_blocked_draw_picks_the_float64_draws_tokens(vocab):
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(3 * torch.randn(512, vocab, generator=g), -1)
    uniform = torch.rand(512, 1, dtype=torch.float64, generator=g)
    got, want = draw(logp, 0, 1.0, uniform), _reference(logp, uniform)
    # a draw may differ only where u falls within float32 rounding of a token boundary: none of 512 here
    assert torch.equal(got, want)


def test_blocked_draw_never_picks_a_masked_token_at_block_edges():
    V = BLOCKED_VOCAB + 5
    logp = torch.full((6, V), float("-inf"))
    kept = [0, BLOCK - 1, BLOCK, 3 * BLOCK + 7, V - 1]  # first and last tokens of blocks, the last real token
    logp[:, kept] = torch.log_softmax(torch.tensor([0.0, -30.0, 2.0, -60.0, -1.0]), -1)
    extremes = torch.tensor([0.0, 1e-300, 0.5, 1 - 1e-16, 1 - 2**-53, 0.999999])[:, None].double()
    for _ in range(3):
        tokens = draw(logp, 0, 1.0, extremes)
        assert set(tokens.tolist()) <= set(kept)
    many = torch.rand(4000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tokens = draw(logp[:1].expand(4000, V), 0, 1.0, many)
    assert set(tokens.tolist()) <= set(kept)
    counts = torch.bincount(tokens, minlength=V)[kept].double() / 4000
    p = logp[0, kept].exp().double()
    # frequencies within 5 standard errors of the probabilities (by hand: 0.114, 0.000, 0.844, 0.000, 0.042)
    assert torch.all((counts - p).abs() <= 5 * (p * (1 - p) / 4000).sqrt() + 1e-12)


def test_blocked_draw_truncates_like_top_k_and_top_p():
    g = torch.Generator().manual_seed(2)
    logp = torch.log_softmax(2 * torch.randn(64, BLOCKED_VOCAB, generator=g), -1)
    uniform = torch.rand(64, 1, dtype=torch.float64, generator=g)
    top = logp.topk(5, -1).indices
    assert (draw(logp, 5, 1.0, uniform)[:, None] == top).any(1).all()
    assert torch.equal(draw(logp, 1, 1.0, uniform), logp.argmax(-1))
    assert torch.equal(draw(logp, 0, 1e-9, uniform), logp.argmax(-1))
