"""The blocked draw of large vocabularies: the float64 inverse-CDF draw's tokens, never a zero-probability one."""

import pytest
import torch

from textzoo.decoding.sampling import BLOCK, BLOCKED_VOCAB, NUCLEUS_K, draw, nucleus_floor


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


def _mass_above(logp: torch.Tensor) -> torch.Tensor:
    """[S, V]: in float64, the mass of the tokens ranked above each rank of a row sorted by probability."""
    p = logp.double().sort(-1, descending=True).values.softmax(-1)
    return p.cumsum(-1) - p


def _check_nucleus(logp: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens `nucleus_floor` keeps per row and the float64 nucleus sizes ([S] each), after checking
    that they agree up to the float32 running sum's rounding: the last kept token has less than top_p above
    it and the first dropped one at least top_p, and a flat row's boundary moves by two tokens at most."""
    V = logp.shape[1]
    above = _mass_above(logp)
    kept = (logp >= nucleus_floor(logp, top_p)).sum(-1)  # [S] (no ties among float32 normals)
    want = (above < top_p).sum(-1)  # [S] the float64 nucleus
    last, first_out = above.gather(1, kept[:, None] - 1), above.gather(1, kept.clamp(max=V - 1)[:, None])
    assert (last < top_p + 1e-5).all() and ((first_out >= top_p - 1e-5) | (kept[:, None] == V)).all()
    assert ((kept - want).abs() <= 2).all(), (kept - want).tolist()
    return kept, want


def test_nucleus_floor_keeps_the_nucleus_at_every_size():
    g = torch.Generator().manual_seed(3)
    V = 5 * BLOCKED_VOCAB  # 40,960: nuclei past the first (256) and second (4,096) ranking rounds
    scale = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.3, 0.05, 6.0, 0.5])[:, None]  # peaked ... nearly flat rows
    logp = torch.log_softmax(scale * torch.randn(8, V, generator=g), -1)
    for top_p in (0.3, 0.9, 0.99):
        kept, want = _check_nucleus(logp, top_p)
        assert torch.equal(kept[[0, 1, 6]], want[[0, 1, 6]])  # peaked rows: far from rounding, exact
    # at top-p 0.99 the nuclei range from a handful of tokens to most of the vocabulary
    assert want.min() < NUCLEUS_K and want.max() > 16 * NUCLEUS_K, want.tolist()
    assert ((want > NUCLEUS_K) & (want <= 16 * NUCLEUS_K)).any(), want.tolist()


def test_nucleus_floor_ranks_more_tokens_before_it_sorts(monkeypatch):
    # rows whose nuclei are hundreds to thousands of tokens: no flat row sends the batch to a sort at once
    calls = []
    topk, sort = torch.Tensor.topk, torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "topk", lambda t, k, *a, **kw: calls.append(k) or topk(t, k, *a, **kw))
    monkeypatch.setattr(torch.Tensor, "sort", lambda t, *a, **kw: calls.append("sort") or sort(t, *a, **kw))
    g = torch.Generator().manual_seed(4)
    scale = torch.tensor([5.0, 4.0, 3.5, 3.0])[:, None]
    logp = torch.log_softmax(scale * torch.randn(4, 5 * BLOCKED_VOCAB, generator=g), -1)
    paths = {}
    for top_p in (0.9, 0.99):
        calls.clear()
        nucleus_floor(logp, top_p)
        paths[top_p] = list(calls)
        _check_nucleus(logp, top_p)
    # 0.9: every nucleus within the second round (1,764-1,969 tokens at most); 0.99: the 3.0 row's 10k
    # tokens need the sort after it
    assert paths == {0.9: [NUCLEUS_K, 16 * NUCLEUS_K], 0.99: [NUCLEUS_K, 16 * NUCLEUS_K, "sort"]}, paths


def test_nucleus_floor_by_hand_keeps_ties_and_renormalises_after_top_k():
    # probabilities 0.5, 0.2, 0.2, 0.1 in a vocabulary of 600 (the rest impossible)
    logp = torch.full((1, 600), float("-inf"))
    logp[0, [7, 300, 301, 599]] = torch.tensor([0.5, 0.2, 0.2, 0.1]).log()
    # top-p 0.6: 0.5 above each 0.2 token, below 0.6, so both tied tokens stay; 0.9 above the 0.1 token
    assert nucleus_floor(logp, 0.6).item() == pytest.approx(torch.tensor(0.2).log().item())
    # top-p 0.45: 0.5 above the 0.2 tokens, so only the most probable token stays
    assert nucleus_floor(logp, 0.45).item() == pytest.approx(torch.tensor(0.5).log().item())
    u = torch.linspace(0, 0.999, 200, dtype=torch.float64)[:, None]
    assert set(draw(logp.expand(200, -1), 0, 0.6, u).tolist()) == {7, 300, 301}
    # top-k 2 keeps 0.5 and both 0.2 tokens (as top-k keeps ties), mass 0.9: renormalised, 0.5 / 0.9 = 0.56
    # lies above each 0.2 token, so top-p 0.6 keeps three tokens and top-p 0.52 one; without top-k, 0.5 is
    # below 0.52, so top-p 0.52 keeps three: only `draw`'s renormalising after top-k tells the two apart
    assert set(draw(logp.expand(200, -1), 2, 0.6, u).tolist()) == {7, 300, 301}
    assert set(draw(logp.expand(200, -1), 2, 0.52, u).tolist()) == {7}
    assert set(draw(logp.expand(200, -1), 0, 0.52, u).tolist()) == {7, 300, 301}
    # without renormalising, 0.5 < 0.6 would keep the 0.2 tokens: renormalise must be what changes it
    truncated = logp.masked_fill(logp < torch.tensor(0.5).log(), float("-inf"))
    assert nucleus_floor(truncated, 0.55, renormalise=False).item() < -1.0
    assert nucleus_floor(truncated, 0.55, renormalise=True).item() == pytest.approx(torch.tensor(0.5).log().item())
