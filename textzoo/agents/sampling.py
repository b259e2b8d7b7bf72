"""Sampling and scoring arithmetic over a model backend: the distribution, draws, stop strings, texts.

One distribution serves sampling and scoring: ``log_softmax(logits / temperature)`` restricted to the
allowed tokens (an additive bias of 0 / -inf). top-k / top-p only truncate the distribution a token
is *drawn* from; the recorded log-probs are of the full one, so the importance ratio of a fresh
sample is 1 and the scored sequence is the sampled one.

`decode` is the token loop: the backend's ``Decoding.decode(tokens) -> logits`` advances the model,
and a ``choose(logp, rows, step) -> tokens`` function picks each step's tokens (a draw or the argmax).
`decode_script` runs each row through a script of `Segment`s: forced tokens (written into the context,
never sampled or scored; mask 0) and sampled sections (each with its own budget and stop strings),
what the joint actor's structured mode uses to write every role's markers itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedTokenizerBase

from textzoo.agents.backends import Decoding, HeadInput
from textzoo.agents.generation import GenerationConfig
from textzoo.errors import ConfigError

Choose = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""``choose(logp [S', V], rows [S'], step) -> tokens [S']``: the tokens of the rows ``rows`` (indices
into the batch) at completion position ``step``, given the sampling distribution's log-probs."""


def allowed_bias(
    allowed: Sequence[int] | None, eos_ids: Sequence[int], vocab: int, device: torch.device, name: str = "policy"
) -> torch.Tensor | None:
    """0 on allowed ids (and EOS), -inf elsewhere ([V]); None when every token is allowed."""
    if allowed is None:
        return None
    ids = sorted({*allowed, *eos_ids})
    if ids[-1] >= vocab:
        raise ConfigError(f"generation.allowed_tokens contains id {ids[-1]}, but policy {name!r} has {vocab} logits")
    bias = torch.full((vocab,), float("-inf"), device=device)  # [V]
    bias[ids] = 0.0
    return bias


def log_probs(logits: torch.Tensor, temperature: float, bias: torch.Tensor | None) -> torch.Tensor:
    """The sampling/scoring distribution: log_softmax(logits / T), restricted by ``bias`` ([..., V])."""
    logits = logits.float()  # [..., V]
    if temperature != 1.0:
        logits = logits / temperature
    if bias is not None:
        logits = logits + bias
    return torch.log_softmax(logits, dim=-1)  # [..., V]


def draw(logp: torch.Tensor, top_k: int, top_p: float, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logp`` ([S, V]) after top-k / top-p truncation, by inverse CDF at
    ``uniform`` ([S, 1] float64 in [0, 1))."""
    if top_k > 0 and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # [S, 1]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # [S, V]
        sorted_p = sorted_logp.softmax(-1)  # [S, V] renormalised after top-k
        # Keep a token while the mass ranked above it is below top_p (so the top token is kept).
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # [S, V]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)  # [S, V] in vocab order
        logp = logp.masked_fill(drop, float("-inf"))
    # Inverse-CDF sampling: one uniform per row instead of multinomial's V exponentials (~10x
    # faster on CPU, same RNG source). u lies in (0, total], and searchsorted returns the first
    # index with cdf >= u, so a zero-probability token is never drawn. float64 keeps tiny
    # probabilities resolved in the running sum.
    cdf = logp.double().exp().cumsum(-1)  # [S, V] unnormalised after truncation; u scales by the total
    u = (1.0 - uniform) * cdf[:, -1:]  # [S, 1]
    return torch.searchsorted(cdf, u).squeeze(1)  # [S]


def token_choice(
    cfg: GenerationConfig, rows: int, greedy: bool = False, generator: torch.Generator | None = None
) -> Choose:
    """The argmax (``greedy``) or a draw per row; a draw takes one uniform for each of the batch's
    ``rows`` rows at every step, so a row's sample does not depend on which other rows are still live."""
    if greedy:
        return lambda logp, live, step: logp.argmax(-1)

    def choose(logp: torch.Tensor, live: torch.Tensor, step: int) -> torch.Tensor:
        uniform = torch.rand((rows, 1), dtype=torch.float64, device=logp.device, generator=generator)  # [S, 1]
        return draw(logp, cfg.top_k, cfg.top_p, uniform if len(live) == rows else uniform[live])

    return choose


@dataclass
class Decoded:
    """The completions of one `decode` call, all [S, C]."""

    completion_ids: torch.Tensor  # [S, C] right-padded with the pad id
    completion_mask: torch.Tensor  # [S, C] 1 on every token up to and including the one that ended the row
    logprobs: torch.Tensor  # [S, C] sampling log-probs, 0 where the mask is 0
    by_stop: torch.Tensor  # [S] the row ended on a stop string


def decode(
    decoding: Decoding,
    choose: Choose,
    cfg: GenerationConfig,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    bias: torch.Tensor | None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    compact: bool = True,
) -> Decoded:
    """Sample up to ``cfg.max_new_tokens`` tokens per row: a row ends at EOS, on a stop string
    (``tokenizer`` decodes its recent tokens) or at the budget; finished rows emit padding.

    With ``compact``, once at most half of the rows the model still runs are live, finished rows are
    let go (`Decoding.retain`), so they stop costing work; results are the same either way.
    """
    logits = decoding.logits  # [S, V]
    S, device = logits.shape[0], logits.device
    eos = torch.tensor(list(eos_ids), device=device)  # [E]
    done = torch.zeros(S, dtype=torch.bool, device=device)  # [S]
    by_stop = torch.zeros(S, dtype=torch.bool, device=device)  # [S]
    stop_window = 4 * max((len(s) for s in cfg.stop_strings), default=0) + 4
    active = torch.arange(S, device=device)  # [n] the rows the model runs (all S until a compaction)
    # Per-step results go to lists and are stacked once: indexed writes cost more per step.
    tokens, token_logps, done_after = [], [], []  # each C x [S]
    N = cfg.max_new_tokens
    for t in range(N):
        logp = log_probs(logits, cfg.temperature, bias)  # [n, V]
        if len(active) == S:
            token = choose(logp, active, t).masked_fill(done, pad_id)  # [S] finished rows emit padding
            token_logp = logp.gather(1, token[:, None]).squeeze(1)  # [S]
        else:
            chosen = choose(logp, active, t).masked_fill(done[active], pad_id)  # [n]
            token = torch.full((S,), pad_id, dtype=chosen.dtype, device=device).index_copy_(0, active, chosen)
            token_logp = logp.new_zeros(S).index_copy_(0, active, logp.gather(1, chosen[:, None]).squeeze(1))
        tokens.append(token)
        token_logps.append(token_logp)
        done = done | (token == eos[0] if len(eos) == 1 else torch.isin(token, eos))
        if cfg.stop_strings:
            tail = torch.stack(tokens[-stop_window:], 1)  # [S, W]
            hit = stop_hits(tokenizer, cfg.stop_strings, tail, ~done)  # [S]
            by_stop |= hit
            done = done | hit
        done_after.append(done)
        if bool(done.all()) or t + 1 == N:
            break
        if compact and len(active) > 1:
            live = (~done[active]).nonzero().squeeze(1)  # [n'] positions in `active` still running
            if 2 * len(live) <= len(active):
                active = active[decoding.retain(live)]
        logits = decoding.decode(token if len(active) == S else token[active])  # [n, V]
    completion = torch.stack(tokens, 1)  # [S, C]
    # A token is scored iff its row was not done before it: every sampled token up to and
    # including the one that ended the sample.
    done_before = torch.stack([torch.zeros_like(done), *done_after[:-1]], 1)  # [S, C]
    logprobs = torch.stack(token_logps, 1).masked_fill(done_before, 0.0)  # [S, C]
    return Decoded(completion, (~done_before).long(), logprobs, by_stop)


@dataclass(frozen=True)
class Segment:
    """One part of a scripted completion: ``forced`` token ids (written into the context by the caller,
    never sampled or scored) or a sampled section of at most ``budget`` tokens that also ends at an
    EOS id or once its text contains one of ``stop_strings``."""

    forced: tuple[int, ...] = ()
    budget: int = 0
    stop_strings: tuple[str, ...] = ()
    after_stop: tuple[int, ...] | None = None
    """Forced tokens to write instead of ``forced`` when the sampled section before this segment ended on
    a stop string (e.g. the section wrote its closing marker itself: write only the next opening one)."""

    def __post_init__(self) -> None:
        if bool(self.forced) == (self.budget > 0):
            raise ValueError(f"a segment has either forced tokens or a sampling budget > 0, got {self!r}")

    def __len__(self) -> int:
        return max(len(self.forced), len(self.after_stop or ())) or self.budget

    def tokens(self, after_stop: bool) -> tuple[int, ...]:
        """The forced tokens to write (``after_stop``: the previous section ended on a stop string)."""
        return self.after_stop if after_stop and self.after_stop is not None else self.forced


Script = Sequence[Segment]
"""A row's completion plan: its segments in order (the row ends after the last one)."""


@dataclass
class ScriptDecoded:
    """The completions of one `decode_script` call: forced tokens sit in ``completion_ids`` with mask 0."""

    completion_ids: torch.Tensor  # [S, C] right-padded with the pad id
    completion_mask: torch.Tensor  # [S, C] 1 on sampled tokens only
    logprobs: torch.Tensor  # [S, C] sampling log-probs, 0 where the mask is 0
    lengths: list[int]  # per row, the columns its script wrote (forced and sampled)
    sections: list[list[tuple[int, int, bool]]]  # per row, per sampled segment: [start, end) columns, ended by stop


def decode_script(
    decoding: Decoding,
    choose: Choose,
    scripts: Sequence[Script],
    *,
    temperature: float,
    eos_ids: Sequence[int],
    pad_id: int,
    bias: torch.Tensor | None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> ScriptDecoded:
    """Decode every row through its script: forced segments feed their tokens to the model (its logits
    there are not used), sampled segments draw with ``choose`` until EOS, a stop string (``tokenizer``
    decodes the section's recent tokens) or their budget; a row whose script is done emits padding.

    The backend's decode step takes the tokens either way, so forced tokens are context exactly like
    sampled ones; only sampled tokens have mask 1 and a log-prob, so scoring treats forced ones as
    context too.
    """
    S = len(scripts)
    device = decoding.logits.device
    eos = set(eos_ids)
    every = torch.arange(S, device=device)  # [S]
    window = 4 * max((len(x) for sc in scripts for seg in sc for x in seg.stop_strings), default=0) + 4
    segment = [0] * S  # index of each row's current segment
    offset = [0] * S  # tokens written into it so far
    start = [0] * S  # column where it began
    written: list[list[int]] = [[] for _ in range(S)]
    sections: list[list[tuple[int, int, bool]]] = [[] for _ in range(S)]
    stopped = [False] * S  # the row's last sampled section ended on a stop string
    done = [False] * S

    def advance(r: int) -> None:  # to the row's next segment that writes anything (after_stop may be empty)
        segment[r] += 1
        script = scripts[r]
        while segment[r] < len(script) and script[segment[r]].forced and not script[segment[r]].tokens(stopped[r]):
            segment[r] += 1
        done[r] = segment[r] == len(script)

    for r in range(S):
        segment[r] = -1
        advance(r)
    tokens, masks, token_logps = [], [], []  # each C x [S]
    logits = decoding.logits  # [S, V]
    for t in range(max((sum(map(len, sc)) for sc in scripts), default=0)):
        logp = log_probs(logits, temperature, bias)  # [S, V]
        drawn = choose(logp, every, t).tolist()  # [S]
        now = [None if done[r] else scripts[r][segment[r]] for r in range(S)]  # each row's segment
        sampled = [seg is not None and not seg.forced for seg in now]
        token = [
            drawn[r] if sampled[r] else pad_id if seg is None else seg.tokens(stopped[r])[offset[r]]
            for r, seg in enumerate(now)
        ]
        for r, seg in enumerate(now):
            if seg is not None:
                written[r].append(token[r])
                offset[r] += 1
        token_t = torch.tensor(token, device=device)  # [S]
        mask_t = torch.tensor(sampled, device=device)  # [S]
        tokens.append(token_t)
        masks.append(mask_t)
        token_logps.append(logp.gather(1, token_t[:, None]).squeeze(1).masked_fill(~mask_t, 0.0))
        checks = [r for r, seg in enumerate(now) if sampled[r] and seg.stop_strings and token[r] not in eos]
        tails = tokenizer.batch_decode([written[r][start[r] :][-window:] for r in checks]) if checks else []
        hits = {r for r, text in zip(checks, tails) if any(x in text for x in now[r].stop_strings)}
        for r, seg in enumerate(now):
            if seg is None:
                continue
            if seg.forced:
                finished = offset[r] == len(seg.tokens(stopped[r]))
            else:
                finished = token[r] in eos or offset[r] == seg.budget or r in hits
                if finished:
                    sections[r].append((start[r], t + 1, r in hits))
                    stopped[r] = r in hits
            if finished:
                offset[r], start[r] = 0, t + 1
                advance(r)
        if all(done):
            break
        logits = decoding.decode(token_t)  # [S, V]
    if not tokens:
        empty = torch.zeros((S, 0), dtype=torch.long, device=device)
        return ScriptDecoded(empty, empty, empty.float(), [0] * S, sections)
    return ScriptDecoded(
        torch.stack(tokens, 1),  # [S, C]
        torch.stack(masks, 1).long(),  # [S, C]
        torch.stack(token_logps, 1),  # [S, C]
        [len(w) for w in written],
        sections,
    )


def section_texts(
    tokenizer: PreTrainedTokenizerBase, decoded: ScriptDecoded, scripts: Sequence[Script], eos_ids: Sequence[int]
) -> list[list[str]]:
    """Per row, the text of each sampled section: its tokens decoded without a final EOS, cut before
    the first stop string when one ended it."""
    eos = set(eos_ids)
    rows = decoded.completion_ids.tolist()
    out = []
    for r, spans in enumerate(decoded.sections):
        stops = [seg.stop_strings for seg in scripts[r] if not seg.forced]
        ids = [rows[r][a:b] for a, b, _ in spans]
        ids = [x[:-1] if x and x[-1] in eos else x for x in ids]
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True) if ids else []
        for k, (_, _, by_stop) in enumerate(spans):
            if by_stop:
                cut = [texts[k].find(x) for x in stops[k] if x in texts[k]]
                texts[k] = texts[k][: min(cut)] if cut else texts[k]
        out.append(texts)
    return out


def stop_hits(
    tokenizer: PreTrainedTokenizerBase, stop_strings: Sequence[str], tail: torch.Tensor, live: torch.Tensor
) -> torch.Tensor:
    """Rows (among ``live``) whose recent tokens ``tail`` ([S, W]) contain a stop string."""
    hit = torch.zeros_like(live)
    rows = live.nonzero().squeeze(1).tolist()
    if rows:
        texts = tokenizer.batch_decode(tail[rows].tolist(), skip_special_tokens=True)
        for row, text in zip(rows, texts):
            hit[row] = any(s in text for s in stop_strings)
    return hit


def completion_texts(
    tokenizer: PreTrainedTokenizerBase,
    decoded: Decoded,
    eos_ids: Sequence[int],
    stop_strings: Sequence[str],
) -> list[str]:
    """Decode the scored tokens of each row, dropping the final EOS and cutting after a stop string."""
    completion, mask = decoded.completion_ids, decoded.completion_mask
    lengths = mask.sum(1)  # [S]
    last = completion.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)  # [S]
    ends_eos = torch.isin(last, torch.tensor(list(eos_ids), device=completion.device)) & (lengths > 0)  # [S]
    keep = (lengths - ends_eos.long()).tolist()
    rows = [row[:n] for row, n in zip(completion.tolist(), keep)]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    for i in decoded.by_stop.nonzero().squeeze(1).tolist():
        ends = [texts[i].find(s) + len(s) for s in stop_strings if s in texts[i]]
        if ends:
            texts[i] = texts[i][: min(ends)]
    return texts


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last axis; tokens outside the allowed set (log-prob -inf) add 0 to the
    value and to the gradient (``entr(p)`` would give them an infinite slope, so NaN gradients)."""
    finite = logp.masked_fill(torch.isneginf(logp), 0.0)
    return -(logp.exp() * finite).sum(-1)


LOGITS_CHUNK = 1 << 22
"""Logit elements (positions x vocabulary) one chunk of `selected_log_probs` computes at a time:
16 MiB in float32, e.g. 27 positions of a 151,936-token vocabulary, all positions of a tiny one."""


def selected_log_probs(
    inputs: HeadInput,
    tokens: torch.Tensor,
    temperature: float,
    bias: torch.Tensor | None,
    *,
    return_entropy: bool = False,
    chunk: int = LOGITS_CHUNK,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ([S, C]) of ``tokens`` ([S, C]) under the sampling distribution at each position, and
    with ``return_entropy`` that distribution's entropy ([S, C]; else None).

    The LM head runs on ``chunk // V`` positions at a time (``chunk`` = 0: all at once), so the
    [S, C, V] logits never exist together: with gradients on, each chunk is checkpointed (its logits
    are recomputed in backward, one chunk at a time), which gives the same gradients exactly. With
    ``mask`` ([S, C] bool), the head runs at the masked-in positions only (the others get 0): padding
    and forced tokens cost no LM head.
    """
    S, C = tokens.shape
    hidden = inputs.hidden.reshape(S * C, -1)  # [S*C, d]
    flat = tokens.reshape(S * C)  # [S*C]
    where = None
    if mask is not None and not bool(mask.all()):
        where = mask.reshape(S * C).nonzero().squeeze(1)  # [N] the positions that are scored
        hidden, flat = hidden.index_select(0, where), flat.index_select(0, where)  # [N, d], [N]
    n = flat.shape[0]
    rows = max(1, chunk // max(inputs.vocab_size, 1)) if chunk > 0 else max(n, 1)

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = log_probs(inputs.head(h), temperature, bias)  # [n, V]
        token_logp = logp.gather(1, t[:, None]).squeeze(1)  # [n]
        return token_logp, entropy_of(logp) if return_entropy else token_logp.new_zeros(0)

    if rows >= n:
        token_logp, entropy = piece(hidden, flat)
    else:
        checkpointed = torch.is_grad_enabled()
        parts = [
            checkpoint(piece, h, t, use_reentrant=False) if checkpointed else piece(h, t)
            for h, t in zip(hidden.split(rows), flat.split(rows))
        ]
        token_logp = torch.cat([p[0] for p in parts])  # [N]
        entropy = torch.cat([p[1] for p in parts])
    if where is not None:  # back to every position, 0 where nothing was scored
        token_logp = token_logp.new_zeros(S * C).index_put((where,), token_logp)  # [S*C]
        if return_entropy:
            entropy = entropy.new_zeros(S * C).index_put((where,), entropy)
    return token_logp.view(S, C), entropy.view(S, C) if return_entropy else None
