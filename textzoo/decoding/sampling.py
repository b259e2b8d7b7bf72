"""Sampling and scoring arithmetic over a model backend: the distribution, draws, stop strings, texts.

One distribution serves sampling and scoring: ``log_softmax(logits / temperature)`` restricted to the
allowed tokens (an additive bias of 0 / -inf). top-k / top-p only truncate the distribution a token
is *drawn* from; the recorded log-probs are of the full one, so the importance ratio of a fresh
sample is 1 and the scored sequence is the sampled one.

`decode` is the token loop: the backend's ``Decoding.decode(tokens) -> logits`` advances the model,
and a ``choose(logp, rows, step) -> tokens`` function picks each step's tokens (a draw or the argmax).
It runs each row through a script of `Segment`s: forced tokens (written into the context, never
sampled or scored; mask 0) and sampled sections (each with its own budget and stop strings). A plain
sample is a script of one sampled section; the joint actor's structured mode writes every role's
markers itself with forced segments. The scripts become tables (`Plan`), so the loop's state is a
few tensors (each row's cell and offset in its script) whatever the scripts are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedTokenizerBase

from textzoo.decoding.backends import Decoding, HeadInput
from textzoo.decoding.generation import GenerationConfig
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
        logp = logp.masked_fill(logp < nucleus_floor(logp, top_p, renormalise=top_k > 0), float("-inf"))
    # Inverse-CDF sampling: one uniform per row instead of multinomial's V exponentials (~10x
    # faster on CPU, same RNG source). u lies in (0, total], and searchsorted returns the first
    # index with cdf >= u, so a zero-probability token is never drawn. float64 keeps tiny
    # probabilities resolved in the running sum.
    if logp.shape[-1] >= BLOCKED_VOCAB:
        return _blocked_draw(logp.exp(), uniform)
    cdf = logp.double().exp().cumsum(-1)  # [S, V] unnormalised after truncation; u scales by the total
    u = (1.0 - uniform) * cdf[:, -1:]  # [S, 1]
    return torch.searchsorted(cdf, u).squeeze(1)  # [S]


NUCLEUS_K = 256
"""Tokens `nucleus_floor` ranks first in every row; rows whose nucleus is larger rank 16x as many, then
sort the whole vocabulary."""


def nucleus_floor(logp: torch.Tensor, top_p: float, renormalise: bool = False) -> torch.Tensor:
    """[S, 1]: the smallest log-prob top-p keeps in each row of ``logp`` ([S, V]). A token is kept while
    the mass of the tokens more probable than it is below ``top_p``, so the most probable token always
    is, and tokens tied with the least probable kept one are all kept (as top-k keeps its ties).
    ``renormalise``: the row's mass is not 1 (after top-k), so probabilities are divided by it.

    Ranks the `NUCLEUS_K` most probable tokens of each row instead of sorting the whole vocabulary
    (SmolLM2's nucleus at top-p 0.9: 18 of 49,152 tokens at the median, docs/results/retired-nucleus.md); the rows
    whose nucleus is larger rank 16x as many, or sort the vocabulary at once when the tokens ranked so far
    show that their nucleus is larger still (a nearly flat distribution)."""
    S, V = logp.shape
    total = logp.logsumexp(-1, keepdim=True) if renormalise else logp.new_zeros(S, 1)  # [S, 1] log mass
    floor = logp.new_empty(S, 1)
    rows, k = torch.arange(S, device=logp.device), min(NUCLEUS_K, V)
    while len(rows):
        part = logp if len(rows) == S else logp[rows]  # [n, V]
        top = part.sort(dim=-1, descending=True).values if k == V else part.topk(k, dim=-1).values  # [n, k]
        p = (top - total[rows]).exp()  # [n, k] descending
        kept = ((p.cumsum(-1) - p) < top_p).sum(-1, keepdim=True)  # [n, 1] >= 1
        ranked = ((kept < k) | (k == V))[:, 0]  # [n] the first dropped token is among the ranked ones
        floor[rows[ranked]] = top.gather(1, kept - 1)[ranked]
        rows, p = rows[~ranked], p[~ranked]
        if len(rows):  # no token left is more probable than the last ranked one: at least `more` are needed
            more = torch.where(p[:, -1] > 0, (top_p - p.sum(-1)) / p[:, -1], V).clamp(0, V).max()  # []
            wider = 16 * k
            k = V if 2 * wider > V or k + float(more) > wider else wider  # ranking half of V costs a sort
    return floor


BLOCKED_VOCAB = 1 << 13
"""Vocabularies from this size on draw by `_blocked_draw` (a real model's 32k-152k tokens); smaller ones
(the tiny defaults) keep one float64 running sum over the vocabulary, cheap at their size."""
BLOCK = 256
"""Tokens per block of `_blocked_draw`."""


def _blocked_draw(p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw of `draw` over float32 probabilities ``p`` ([S, V], unnormalised, 0 on
    truncated tokens) in two levels: the block of `BLOCK` tokens, from the running sum of the blocks'
    float32 totals, then the token inside it, from a float64 running sum of its own entries scaled to
    that block's total. Each token keeps its probability up to float32 rounding *relative to itself*
    (a float32 running sum over the whole vocabulary would round every token to the resolution of the
    total mass), and a zero-probability token is never drawn, at a fraction of the cost of a float64
    copy and running sum of all [S, V] entries."""
    S, V = p.shape
    if V % BLOCK:
        p = F.pad(p, (0, BLOCK - V % BLOCK))  # zero-probability padding
    blocks = p.view(S, -1, BLOCK)  # [S, B, K]
    totals = blocks.sum(-1).double()  # [S, B]
    ends = totals.cumsum(-1)  # [S, B] running mass at each block's end
    u = (1.0 - uniform) * ends[:, -1:]  # [S, 1] in (0, total]
    block = torch.searchsorted(ends, u).clamp(max=ends.shape[1] - 1)  # [S, 1] first block ending at >= u
    before = torch.where(block > 0, ends.gather(1, (block - 1).clamp(min=0)), 0.0)  # [S, 1]
    rows = torch.arange(S, device=p.device)
    inside = blocks[rows, block[:, 0]].double()  # [S, K] the chosen block's probabilities
    cdf = inside.cumsum(-1)  # [S, K]
    # u - before lies in (0, total of the block]; rescaled to the block's own float64 sum
    rest = (u - before) * (cdf[:, -1:] / totals.gather(1, block))  # [S, 1]
    token = torch.searchsorted(cdf, rest)  # [S, 1]
    last = BLOCK - 1 - (inside > 0).flip(-1).int().argmax(-1, keepdim=True)  # [S, 1] the block's last nonzero token
    return (block * BLOCK + torch.minimum(token, last)).squeeze(1)  # [S]


def token_choice(
    cfg: GenerationConfig, rows: int, greedy: bool = False, generator: torch.Generator | None = None
) -> Choose:
    """The argmax (``greedy``) or a draw per row; a draw takes one uniform for each of the batch's
    ``rows`` rows at every step, so a row's sample does not depend on which other rows are still live."""
    if greedy:

        def argmax(logp: torch.Tensor, live: torch.Tensor, step: int) -> torch.Tensor:
            return logp.argmax(-1)

        argmax.skip = lambda device: None  # nothing random to keep in step
        return argmax

    def choose(logp: torch.Tensor, live: torch.Tensor, step: int) -> torch.Tensor:
        uniform = torch.rand((rows, 1), dtype=torch.float64, device=logp.device, generator=generator)  # [S, 1]
        return draw(logp, cfg.top_k, cfg.top_p, uniform if len(live) == rows else uniform[live])

    def skip(device: torch.device) -> None:
        """A step at which no row samples: take its uniforms all the same, so later draws stay the same."""
        torch.rand((rows, 1), dtype=torch.float64, device=device, generator=generator)

    choose.skip = skip
    return choose


@dataclass(frozen=True)
class Segment:
    """One part of a scripted completion: ``forced`` token ids (written into the context, never sampled
    or scored) or a sampled section of at most ``budget`` tokens that also ends at an EOS id or once its
    text contains one of ``stop_strings``."""

    forced: tuple[int, ...] = ()
    budget: int = 0
    stop_strings: tuple[str, ...] = ()
    after_stop: tuple[int, ...] | None = None
    """Forced tokens to write instead of ``forced`` when the sampled section before this segment ended on
    a stop string (e.g. the section wrote its closing marker itself: write only the next opening one)."""
    eos_is_stop: bool = False
    """A sampled section's EOS counts as a stop string: the next forced segment writes its ``after_stop``
    tokens (e.g. a chat turn that ended itself: write the next turn without closing this one again)."""

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


def sampled_script(cfg: GenerationConfig) -> list[Segment]:
    """The script of a plain sample: one sampled section of ``cfg``'s budget and stop strings."""
    return [Segment(budget=cfg.max_new_tokens, stop_strings=cfg.stop_strings)]


_NEVER = 1 << 62  # the length of a row's end cell: a finished row stays there, emitting padding


class Plan:
    """A batch's scripts as tables the decode loop indexes with each row's current *cell*.

    A cell is (script, segment, variant): variant 1 holds the segment's ``after_stop`` tokens (a forced
    segment written after a section that ended on a stop string), variant 0 the others. After a script's
    segments come its two end cells (a finished row: padding, mask 0, never left). Tables per cell:
    ``sampled``, ``length`` (forced tokens written, or the sampling budget), ``tokens`` (the forced ids),
    ``stop`` (index into ``stop_sets``, -1 for none), ``eos_stop`` (an EOS ends the section as a stop),
    ``variant``, ``end`` and ``next`` ([cells, 2]: the
    cell a row moves to when this one is done, by the variant it moves with; empty segments skipped).
    """

    def __init__(self, scripts: Sequence[Script], pad_id: int, device: torch.device) -> None:
        index: dict[int, int] = {}  # id(script) -> its position in `unique`: rows that share a script share cells
        unique: list[Script] = []
        for script in scripts:
            if id(script) not in index:
                index[id(script)] = len(unique)
                unique.append(script)
        self.stop_sets = list(dict.fromkeys(seg.stop_strings for s in unique for seg in s if seg.stop_strings))
        width = max((len(seg.tokens(v)) for s in unique for seg in s for v in (False, True)), default=0)
        cells: list[tuple] = []
        first = []  # each unique script's first cell
        for script in unique:
            more, start = _script_cells(script, len(cells), width, pad_id, self.stop_sets)
            cells += more
            first.append(start)
        sampled, length, tokens, stop, eos_stop, variant, end, follow = zip(*cells) if cells else [()] * 8
        long = dict(dtype=torch.long, device=device)
        self.sampled = torch.tensor(sampled, dtype=torch.bool, device=device)  # [cells]
        self.length = torch.tensor(length, **long)  # [cells]
        self.tokens = torch.tensor(tokens, **long).view(len(cells), width + 1)  # [cells, width + 1]
        self.stop = torch.tensor(stop, **long)  # [cells]
        self.eos_stop = torch.tensor(eos_stop, dtype=torch.bool, device=device)  # [cells]
        self.any_eos_stop = any(eos_stop)
        self.variant = torch.tensor(variant, **long)  # [cells]
        self.end = torch.tensor(end, dtype=torch.bool, device=device)  # [cells]
        self.next = torch.tensor(follow, **long).view(len(cells), 2)  # [cells, 2]
        self.first = torch.tensor([first[index[id(s)]] for s in scripts], **long)  # [S] each row's first cell
        self.columns = max((sum(map(len, s)) for s in unique), default=0)
        """The most columns a row writes (forced and sampled)."""


def _script_cells(
    script: Script, base: int, width: int, pad_id: int, stop_sets: list[tuple[str, ...]]
) -> tuple[list[tuple], int]:
    """The cells of one script, numbered from ``base`` (two per segment, then the two end cells; see
    `Plan`), and the cell its rows start in."""
    K = len(script)

    def after(k: int, v: int) -> int:
        """The first cell from segment k on, with variant v, that writes anything (an end cell if none)."""
        while k < K and not (script[k].budget or script[k].tokens(bool(v))):
            k += 1
        return base + 2 * k + v

    cells = []
    for k, seg in enumerate(script):
        for v in (0, 1):
            ids = seg.tokens(bool(v))
            stop = stop_sets.index(seg.stop_strings) if seg.stop_strings else -1
            padded = [*ids, *[pad_id] * (width + 1 - len(ids))]
            cells.append(
                (
                    not seg.forced,
                    seg.budget or len(ids),
                    padded,
                    stop,
                    seg.eos_is_stop,
                    v,
                    False,
                    (after(k + 1, 0), after(k + 1, 1)),
                )  # fmt: skip
            )
    for v in (0, 1):  # end cells: padding, never left
        cells.append((False, _NEVER, [pad_id] * (width + 1), -1, False, v, True, (base + 2 * K + v,) * 2))
    return cells, after(0, 0)


@dataclass
class Decoded:
    """The completions of one `decode` call, all [S, C]: sampled tokens and, for scripts, forced ones."""

    completion_ids: torch.Tensor  # [S, C] right-padded with the pad id
    completion_mask: torch.Tensor  # [S, C] 1 on sampled tokens (up to and including each section's last)
    logprobs: torch.Tensor  # [S, C] sampling log-probs, 0 where the mask is 0
    by_stop: torch.Tensor  # [S] the row's last sampled section ended on a stop string
    cells: torch.Tensor  # [S, C + 1] the `Plan` cell each column was written in, then the row's final cell
    plan: Plan

    @staticmethod
    def empty(plan: Plan) -> Decoded:
        """No columns: each row of ``plan`` stays at its first cell."""
        empty = plan.first.new_zeros((len(plan.first), 0))
        return Decoded(empty, empty, empty.float(), empty.bool().any(1), plan.first[:, None], plan)

    @property
    def lengths(self) -> torch.Tensor:
        """[S] the columns each row wrote (forced and sampled)."""
        return (~self.plan.end[self.cells[:, :-1]]).sum(1)

    def sections(self) -> list[list[tuple[int, int, bool]]]:
        """Per row, per sampled section: its [start, end) columns and whether a stop string ended it."""
        cells, plan = self.cells, self.plan
        row, column = (cells[:, 1:] != cells[:, :-1]).nonzero().unbind(1)  # [M] where segments ended, row-major
        after = column.roll(1) + 1  # [M] the column after the previous end
        same_row = row == row.roll(1)  # [M] that end is in the same row
        same_row[:1] = False
        start = torch.where(same_row, after, 0)  # [M] where each ended segment began
        closed = plan.sampled[cells[row, column]]  # [M] a sampled section ended there
        by_stop = plan.variant[cells[row, column + 1]]  # [M] it moved on with variant 1: ended by a stop string
        out: list[list[tuple[int, int, bool]]] = [[] for _ in range(cells.shape[0])]
        picked = torch.stack([row, start, column + 1, by_stop], 1)[closed].tolist()
        for r, a, b, stop in picked:
            out[r].append((a, b, bool(stop)))
        return out


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
    scripts: Sequence[Script] | None = None,
) -> Decoded:
    """Decode every row through its script (default: `sampled_script`): ``choose`` picks a token for each
    row at every step; a row in a forced segment writes the segment's next token instead (in the context,
    mask 0, its log-prob unused), a row in a sampled section keeps the chosen one. A section ends at EOS,
    on a stop string (``tokenizer`` decodes its recent tokens) or at its budget; a row whose script is
    done emits padding. Sampling settings other than budgets and stop strings are ``cfg``'s.

    The script state lives in tensors (each row's `Plan` cell and offset within it). With ``compact``,
    once at most half of the rows the model still runs are live, finished rows are let go
    (`Decoding.retain`), so they stop costing work; results are the same either way. Where the decoding
    takes several tokens per pass (``decode_many``) and ``choose`` can skip a step (``choose.skip``), a run
    of columns in which no row samples (every row writes forced text or padding) is fed in one pass: a joint
    answer's next-role turn costs one forward instead of one per token.
    """
    logits = decoding.logits  # [S, V]
    S, device = logits.shape[0], logits.device
    plan = Plan([sampled_script(cfg)] * S if scripts is None else scripts, pad_id, device)
    eos = torch.tensor(list(eos_ids), device=device)  # [E]
    window = 4 * max((len(x) for stops in plan.stop_sets for x in stops), default=0) + 4
    last = plan.tokens.shape[1] - 1
    cell, offset = plan.first, torch.zeros(S, dtype=torch.long, device=device)  # [S] each row's place in its script
    start = offset  # [S] the column where each row's current segment began
    active = torch.arange(S, device=device)  # [n] the rows the model runs (all S until a compaction)
    # Per-step results go to lists and are stacked once: indexed writes cost more per step.
    tokens, token_logps, cells = [], [], [cell]  # C x [S] each; cells: C + 1
    many = getattr(decoding, "decode_many", None) if hasattr(choose, "skip") else None
    pending: list[torch.Tensor] = []  # columns written but not yet fed (a run in which no row samples)
    for t in range(plan.columns):
        sampled = plan.sampled[cell]  # [S]
        forced = plan.tokens[cell, offset.clamp(max=last)]  # [S] forced / padding
        if logits is None:  # no row samples in this column: its logits are not needed
            choose.skip(device)
            token, token_logp = forced, torch.zeros(S, device=device)  # float32, as `log_probs` gives
        else:
            logp = log_probs(logits, temperature=cfg.temperature, bias=bias)  # [n, V]
            chosen = choose(logp, active, t)  # [n]
            if len(active) == S:
                token_logp = logp.gather(1, chosen[:, None]).squeeze(1)  # [S]
            else:
                token_logp = logp.new_zeros(S).index_copy_(0, active, logp.gather(1, chosen[:, None]).squeeze(1))
                chosen = torch.full((S,), pad_id, dtype=chosen.dtype, device=device).index_copy_(0, active, chosen)
            token = torch.where(sampled, chosen, forced)
        tokens.append(token)
        token_logps.append(token_logp)
        offset = offset + 1
        ended = offset == plan.length[cell]  # [S] the row's segment is done
        at_eos = sampled & (token == eos[0] if len(eos) == 1 else torch.isin(token, eos))  # [S]
        ended = ended | at_eos
        variant = plan.variant[cell]  # [S]
        if plan.stop_sets or plan.any_eos_stop:  # a stop ends a section and picks the next forced segment's variant 1
            hit = at_eos & plan.eos_stop[cell]  # [S]
            if plan.stop_sets:
                sets = plan.stop[cell]  # [S]
                recent = tokens[-window:]
                skip = start - (t + 1 - len(recent))  # [S] recent columns before the section
                hit = hit | stop_hits(tokenizer, plan.stop_sets, sets, recent, skip, sampled & ~at_eos & (sets >= 0))
            ended = ended | hit
            variant = torch.where(sampled, hit.long(), variant)
        cell = torch.where(ended, plan.next[cell, variant], cell)
        offset = offset.masked_fill(ended, 0)
        if plan.stop_sets:
            start = torch.where(ended, t + 1, start)
        cells.append(cell)
        done = plan.end[cell]  # [S]
        if t + 1 == plan.columns or bool(done.all()):
            break
        if compact and len(active) > 1:
            live = (~done[active]).nonzero().squeeze(1)  # [n'] positions in `active` still running
            if 2 * len(live) <= len(active):
                active = active[decoding.retain(live)]
        pending.append(token)
        if many is not None and not bool(plan.sampled[cell[active]].any()):
            logits = None  # the next column is forced (or padding) in every row the model runs: feed it later
            continue
        fed = torch.stack(pending, 1) if len(pending) > 1 else token[:, None]  # [S, k]
        fed = fed if len(active) == S else fed[active]
        logits = decoding.decode(fed[:, 0]) if fed.shape[1] == 1 else many(fed)  # [n, V]
        pending = []
    if not tokens:
        return Decoded.empty(plan)
    cells = torch.stack(cells, 1)  # [S, C + 1]
    mask = plan.sampled[cells[:, :-1]]  # [S, C]
    logprobs = torch.stack(token_logps, 1).masked_fill(~mask, 0.0)  # [S, C]
    by_stop = plan.variant[cell].bool()  # [S] every row ends in an end cell: variant 1 after a stop
    return Decoded(torch.stack(tokens, 1), mask.long(), logprobs, by_stop, cells, plan)


def stop_hits(
    tokenizer: PreTrainedTokenizerBase | None,
    stop_sets: Sequence[tuple[str, ...]],
    sets: torch.Tensor,
    recent: list[torch.Tensor],
    skip: torch.Tensor,
    check: torch.Tensor,
) -> torch.Tensor:
    """Rows (among ``check``, [S] bool) whose current section's text contains one of its stop strings
    (``stop_sets[sets[row]]``): the ``recent`` columns (each [S]) decoded by ``tokenizer`` after each row's
    first ``skip`` ([S]) of them, which precede its section."""
    hit = torch.zeros_like(check)
    rows = check.nonzero().squeeze(1)  # [R]
    if len(rows) == 0:
        return hit
    tail = torch.stack(recent, 1)[rows]  # [R, W]
    found = torch.cat([tail, skip[rows, None].clamp(min=0), sets[rows, None]], 1).tolist()  # one transfer
    texts = tokenizer.batch_decode([row[row[-2] : -2] for row in found], skip_special_tokens=True)
    hits = [r for r, row, text in zip(rows.tolist(), found, texts) if any(x in text for x in stop_sets[row[-1]])]
    if hits:
        hit[hits] = True
    return hit


def section_texts(
    tokenizer: PreTrainedTokenizerBase, decoded: Decoded, scripts: Sequence[Script], eos_ids: Sequence[int]
) -> list[list[str]]:
    """Per row, the text of each sampled section: its tokens decoded without a final EOS, cut before
    the first stop string when one ended it."""
    eos = set(eos_ids)
    rows = decoded.completion_ids.tolist()
    out = []
    for r, spans in enumerate(decoded.sections()):
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


LOGITS_CHUNK = 1 << 24
"""Logit elements (positions x vocabulary) one chunk of `selected_log_probs` computes at a time:
64 MiB in float32, e.g. 110 positions of a 151,936-token vocabulary, 341 of a 49,152-token one (a
micro-batch of 8 x 32 completion tokens in one piece), all positions of a tiny one. Smaller chunks
cost time where the head is large: each checkpointed chunk recomputes its logits in backward, and
computes and adds a whole [V, d] weight gradient of its own (SmolLM2's head: ~25% of an update at
85 positions a chunk)."""


BLOCKED_TOKEN_LOGP = True
"""Score half-precision logits with `_TokenLogProb` (off: autograd's float32 log_softmax and gather)."""
TOKEN_LOGP_ROWS = 16
"""Positions per block of `_TokenLogProb`: a [16, V] float32 temporary (3 MiB at 49,152 tokens)."""


class _TokenLogProb(torch.autograd.Function):
    """``log_probs(logits, temperature, bias).gather(1, tokens[:, None])[:, 0]`` for half-precision logits
    ([n, V] -> [n] float32), a block of `TOKEN_LOGP_ROWS` positions at a time: the float32 log-softmax
    never exists for all positions, and backward computes ``(onehot(token) - softmax) * grad / T`` per
    block straight into a half-precision logits gradient (saving only the logits), where autograd would
    keep the [n, V] float32 log-probs, zero-fill and scatter an [n, V] gradient for the gather and cast it.
    The same formula as that path, to float32 rounding."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, temperature: float, bias: torch.Tensor | None):
        ctx.save_for_backward(logits, tokens)
        ctx.temperature, ctx.bias = temperature, bias
        out = logits.new_empty(tokens.shape, dtype=torch.float32)  # [n]
        for start in range(0, logits.shape[0], TOKEN_LOGP_ROWS):
            block = slice(start, start + TOKEN_LOGP_ROWS)
            logp = log_probs(logits[block], temperature, bias)  # [r, V] float32
            out[block] = logp.gather(1, tokens[block, None]).squeeze(1)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, tokens = ctx.saved_tensors
        out = torch.empty_like(logits)  # [n, V] in the logits' dtype
        for start in range(0, logits.shape[0], TOKEN_LOGP_ROWS):
            block = slice(start, start + TOKEN_LOGP_ROWS)
            g = grad[block, None].float()  # [r, 1]
            d = log_probs(logits[block], ctx.temperature, ctx.bias).exp_().mul_(-g)  # -softmax * grad
            d.scatter_add_(1, tokens[block, None], g)  # + grad at the selected token
            if ctx.temperature != 1.0:
                d.div_(ctx.temperature)
            out[block] = d
        return out, None, None, None


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
        logits = inputs.head(h)  # [n, V]
        if BLOCKED_TOKEN_LOGP and not return_entropy and logits.dtype in (torch.bfloat16, torch.float16):
            return _TokenLogProb.apply(logits, t, temperature, bias), logits.new_zeros(0)
        logp = log_probs(logits, temperature, bias)  # [n, V]
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
