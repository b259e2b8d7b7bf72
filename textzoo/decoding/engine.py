"""Rollout engines: where an agent's samples come from, a whole request at a time.

A `RolloutEngine` takes prompt token ids (after prompt formatting: nothing is re-tokenized) and one
`SamplingSettings` (the agent's budget, temperature, top-p, top-k, stop strings, EOS set, allowed
tokens, greedy) and returns one `Completion` per prompt: the completion ids, the engine's sampling
log-prob of each, and the text. Two engines implement it:

- `LocalEngine`: the policy's own decoder (`textzoo.decoding.sampling` over its backends), today's path.
  A policy without an engine (``Policy.engine`` None, the default) samples with exactly this.
- `textzoo.decoding.vllm_engine.VLLMEngine`: one in-process vLLM ``LLM`` (``--agent.engine.kind vllm``).

`EngineClient` binds a policy to an engine (and, for a LoRA agent, to its adapter on the engine's
shared base): `Policy.generate_ids` and `Policy.generate_script` hand their requests to it, so every
rollout path (multi-turn tasks, held-out evaluation, ReMax's greedy baseline, the joint actor's
structured decoding) runs on the engine. A structured script runs as a chain of requests: each
sampled section is one request that ends at a stop string, an EOS id or its budget; the forced tokens
are appended to the context and the next section continues from it (prefix caching makes the
repeated prefix cheap).

The engine's log-probs are not the trainer's (other kernels, bf16). The client scores every sampled
completion with the trainer's model at once (no gradients, eval mode) and hands the losses the
trainer's log-probs as the behaviour policy's, so the loss arithmetic is the local path's. The engine's
log-probs stay with the sample (``Generation.engine_logprobs``): the policy-gradient losses weigh each
token by min(π_trainer/π_engine, C) (truncated importance sampling, ``agent.engine.tis``), and
`textzoo.runners.engines.engine_metrics` logs the gap (`rlmath.engine_gap`) and the mean weight.
Greedy requests (evaluation, ReMax's baseline) keep the engine's log-probs: nothing learns from them.

Engines are built, synced and closed by `textzoo.runners.engines`. After every optimizer step the
trainer syncs them: a fully fine-tuned agent's weights go to
its engine as tensors (no disk); a LoRA agent's adapter is written to a private folder and becomes a
new adapter request. Each engine holds a weight version per agent (the learner's step count).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from textzoo.decoding.generation import Generation, GenerationConfig, left_padded
from textzoo.decoding.inference import Scorer, score_no_grad
from textzoo.decoding.sampling import Segment
from textzoo.decoding.settings import ENGINES
from textzoo.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ENGINES", "Completion", "EngineClient", "LocalEngine", "RolloutEngine", "Sampler", "SamplingSettings"]


class Sampler(Scorer, Protocol):
    """What an engine reads of the policy it samples for (`textzoo.models.policy.Policy` is one)."""

    name: str
    tokenizer: Any
    generation: GenerationConfig
    pad_id: int
    eos_ids: tuple[int, ...]
    engine: Any

    def prepare_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts as the policy's decoder reads them (cut to its prompt budget)."""
        ...

    def decode_ids(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        generation: GenerationConfig | None = None,
        greedy: bool = False,
        generator: Any = None,
    ) -> Generation:
        """One completion per prompt, sampled by the policy's own decoder with ``generation``'s settings."""
        ...


@dataclass(frozen=True)
class SamplingSettings:
    """One request's sampling settings, as every engine takes them."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_strings: tuple[str, ...] = ()
    eos_ids: tuple[int, ...] = ()
    allowed_tokens: tuple[int, ...] | None = None
    """The ids a sample may use besides the EOS ids (None = all)."""
    greedy: bool = False

    @classmethod
    def of(cls, policy: Sampler, greedy: bool = False, **changes: Any) -> SamplingSettings:
        """The settings of ``policy``'s `GenerationConfig` and EOS set (``changes`` override fields)."""
        g = policy.generation
        values = dict(
            max_tokens=g.max_new_tokens,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            stop_strings=tuple(g.stop_strings),
            eos_ids=tuple(policy.eos_ids),
            allowed_tokens=g.allowed_tokens,
            greedy=greedy,
        )
        return cls(**{**values, **changes})


@dataclass
class Completion:
    """One sampled completion: its ids (the last one the EOS id or stop-string token that ended it, if
    any), the engine's log-prob of each under the sampling distribution, and the decoded text."""

    ids: list[int]
    logprobs: list[float]
    text: str = ""
    by_stop: bool = False
    """The completion ended on one of its stop strings."""


class RolloutEngine(Protocol):
    """Whole requests in, completions out (module docstring)."""

    def complete(
        self, prompts: Sequence[Sequence[int]], settings: SamplingSettings, adapter: Any = None
    ) -> list[Completion]:
        """One completion per prompt (token ids); ``adapter`` selects a LoRA adapter where the engine has them."""
        ...


class LocalEngine:
    """The policy's own decoder as a `RolloutEngine` (the same samples `Policy.generate_ids` draws)."""

    def __init__(self, policy: Sampler, generator: torch.Generator | None = None):
        self.policy = policy
        self.generator = generator

    def complete(
        self, prompts: Sequence[Sequence[int]], settings: SamplingSettings, adapter: Any = None
    ) -> list[Completion]:
        policy = self.policy
        if tuple(settings.eos_ids) != tuple(policy.eos_ids):
            raise ConfigError(f"the local decoder ends samples at policy {policy.name!r}'s EOS ids {policy.eos_ids}")
        ids, mask = (t.to(policy.device) for t in left_padded(prompts, policy.pad_id))
        generation = dataclasses.replace(
            policy.generation,
            max_new_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            stop_strings=settings.stop_strings,
            allowed_tokens=settings.allowed_tokens,
        )
        gen = policy.decode_ids(ids, mask, generation=generation, greedy=settings.greedy, generator=self.generator)
        out = []
        for row, m, lp, text in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist(), gen.logprobs, gen.texts):
            n = int(sum(m))
            written = policy.tokenizer.decode(row[:n], skip_special_tokens=True) if settings.stop_strings else ""
            by_stop = any(s in written for s in settings.stop_strings)
            out.append(Completion(row[:n], lp[:n].tolist(), text, by_stop and not (n and row[n - 1] in policy.eos_ids)))
        return out


# ---- a policy's requests on an engine -------------------------------------------------------------
@dataclass
class EngineStats:
    """What a client recorded since the trainer last read it (`EngineClient.drain`): per sampled request
    batch, the trainer's and the engine's log-probs of the sampled tokens and their mask ([S, C] each)."""

    trainer: list[torch.Tensor] = field(default_factory=list)
    engine: list[torch.Tensor] = field(default_factory=list)
    mask: list[torch.Tensor] = field(default_factory=list)


class EngineClient:
    """One policy's view of an engine: its requests, its adapter there (LoRA agents) and its weight version."""

    def __init__(
        self,
        engine: Any,
        adapter_key: str | None = None,
        tis_cap: float = 2.0,
        sync_timeout: float = 120.0,
        tis: bool = True,
    ):
        self.engine = engine
        self.adapter_key = adapter_key
        """The agent's adapter name on a shared base (None: the engine runs this policy's whole weights)."""
        self.tis = tis
        """The policy-gradient losses weigh this engine's samples by min(π_trainer/π_engine, tis_cap) per token
        (`textzoo.algorithms.family.engine_token_weights`; ``agent.engine.tis``)."""
        self.tis_cap = tis_cap
        self.sync_timeout = sync_timeout
        self.version = 0
        """The trainer weight version (optimizer steps) the engine samples with."""
        self.sync_s = 0.0
        """Seconds the last weight sync took."""
        self.sync_gap: float | None = None
        """Mean |Δ log p| per token of the engine's and the trainer's log-probs of a fixed probe after the last
        verified sync (engines that verify their syncs, a server's; None before one)."""
        self.restarts = 0
        """How often the engine was found to have lost its weights (a restarted server) and got them again."""
        self.stats = EngineStats()

    @property
    def open(self) -> bool:
        """Whether the engine still serves requests (`close` ends that; the policy then samples itself)."""
        return self.engine is not None

    def close(self) -> None:
        """Shut the engine down (a shared engine may already be: closing twice is harmless) and let go of it."""
        engine, self.engine = self.engine, None
        close = getattr(engine, "close", None)
        if callable(close):
            close()

    def __deepcopy__(self, memo: dict) -> None:
        """A copied policy (a frozen reference, a comparator) samples with its own decoder: no engine."""
        return None

    # ---- sampling ----------------------------------------------------------------------------
    def _complete(self, prompts: list[list[int]], settings: SamplingSettings) -> list[Completion]:
        adapter = self.engine.adapter(self.adapter_key) if self.adapter_key is not None else None
        return self.engine.complete(prompts, settings, adapter)

    def generate_ids(self, policy: Sampler, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, greedy: bool):
        """`Policy.generate_ids` on the engine: the `Generation`, with the trainer's log-probs (module docstring)."""
        ids, mask = policy.prepare_prompts(prompt_ids, prompt_mask)
        rows = prompt_rows(ids, mask)
        settings = SamplingSettings.of(policy, greedy)
        done = self._complete(rows, settings) if rows else []
        gen = to_generation(
            ids,
            mask,
            [c.ids for c in done],
            [c.logprobs for c in done],
            [[1] * len(c.ids) for c in done],
            policy.pad_id,
            [plain_text(policy, c, settings.stop_strings) for c in done],
        )
        return self._rescore(policy, gen, greedy)

    def generate_script(
        self,
        policy: Sampler,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        scripts: Sequence[Sequence[Segment]],
        greedy: bool,
    ) -> tuple[Generation, list[list[str]]]:
        """`Policy.generate_script` on the engine: each sampled section a request, the forced tokens appended."""
        ids, mask = policy.prepare_prompts(prompt_ids, prompt_mask)
        rows = prompt_rows(ids, mask)
        base = SamplingSettings.of(policy, greedy)
        written, sections = run_scripts(lambda r, s: self._complete(r, s), rows, scripts, base, policy)
        texts = policy.tokenizer.batch_decode([w[0] for w in written], skip_special_tokens=True)
        gen = to_generation(
            ids, mask, [w[0] for w in written], [w[1] for w in written], [w[2] for w in written], policy.pad_id, texts
        )
        return self._rescore(policy, gen, greedy), sections

    def _rescore(self, policy: Sampler, gen: Generation, greedy: bool) -> Generation:
        """Replace the engine's log-probs by the trainer's (sampled requests), keep the engine's as
        ``gen.engine_logprobs`` (what truncated importance sampling reads) and record the gap."""
        if greedy or len(gen) == 0 or not bool(gen.completion_mask.any()):
            return gen
        engine = gen.logprobs
        trainer = score_no_grad(policy, gen).to(engine.device)
        self.stats.trainer.append(trainer.detach().cpu())
        self.stats.engine.append(engine.detach().cpu())
        self.stats.mask.append(gen.completion_mask.detach().cpu().to(engine.dtype))
        return dataclasses.replace(gen, logprobs=trainer, engine_logprobs=engine)

    def drain(self) -> EngineStats:
        """The statistics recorded since the last call (and start afresh)."""
        stats, self.stats = self.stats, EngineStats()
        return stats

    # ---- weights -----------------------------------------------------------------------------
    def attach(self, policy: Sampler, verify: bool = True) -> None:
        """Give a new engine what it needs before it samples for ``policy``: the agent's adapter on a shared
        base, or the whole weights to an engine that does not start from a copy of them (a server); then
        `verify` it (unless ``verify`` is False: a data-parallel run checks once every process has pushed)."""
        if self.adapter_key is not None or not getattr(self.engine, "starts_with_weights", True):
            self.sync(policy, self.version, force=True)
            if verify:
                self.verify(policy)

    def sync(
        self, policy: Sampler, version: int, force: bool = False, weights: dict[str, torch.Tensor] | None = None
    ) -> bool:
        """Give the engine ``policy``'s current weights as ``version`` (``weights``: its whole state dict where
        the model is sharded); False when it has them already (unless ``force``)."""
        if version == self.version and not force:
            return False
        start = time.perf_counter()
        if self.adapter_key is None:
            self.engine.load_weights(weights if weights is not None else policy.model, self.sync_timeout, version)
        else:
            self.engine.update_adapter(self.adapter_key, policy.model, version, self.sync_timeout)
        self.version = version
        self.sync_s = time.perf_counter() - start
        logger.info("engine of %s: weights version %d synced in %.2f s", policy.name, version, self.sync_s)
        return True

    def verify(self, policy: Sampler) -> None:
        """Check the last sync on an engine that verifies syncs (`VLLMServerEngine.verify`): its log-probs of a
        fixed probe must be the trainer's within its precision, else `EngineError`."""
        check = getattr(self.engine, "verify", None)
        if not callable(check):
            return

        def trainer(prompt: list[int], completion: list[int]) -> list[float]:
            ids, mask = (t.to(policy.device) for t in left_padded([prompt], policy.pad_id))
            n = len(completion)
            gen = to_generation(ids, mask, [completion], [[0.0] * n], [[1] * n], policy.pad_id)
            return score_no_grad(policy, gen)[0, :n].tolist()

        adapter = self.engine.adapter(self.adapter_key) if self.adapter_key is not None else None
        computes = policy.autocast or next(policy.model.parameters()).dtype
        self.sync_gap = check(trainer, policy.tokenizer, adapter, computes in (torch.bfloat16, torch.float16))

    def lost(self) -> bool:
        """Whether the engine lost what it was given (a restarted server forgot its adapters and weights)."""
        stale = getattr(self.engine, "stale", None)
        return bool(callable(stale) and stale())

    def resend(self, policy: Sampler, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Give an engine that lost them the current weights or adapter again (then `verify` it)."""
        self.restarts += 1
        logger.warning(
            "the engine of %s lost its weights (the server at %s restarted?): sending version %d again",
            policy.name,
            getattr(self.engine, "url", "?"),
            self.version,
        )
        self.sync(policy, self.version, force=True, weights=weights)


def prompt_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's real prompt ids (left-padded ``ids`` [S, P] under ``mask``)."""
    return [[t for t, m in zip(r, mr) if m] for r, mr in zip(ids.tolist(), mask.tolist())]


def to_generation(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    ids: list[list[int]],
    logprobs: list[list[float]],
    masks: list[list[int]],
    pad_id: int,
    texts: list[str] | None = None,
) -> Generation:
    """A `Generation` of per-row completions (right-padded with ``pad_id``; log-probs 0 off the mask) and
    their ``texts``."""
    S, C = len(ids), max((len(r) for r in ids), default=0)
    device = prompt_ids.device
    completion = torch.full((S, C), pad_id, dtype=torch.long)
    mask = torch.zeros((S, C), dtype=torch.long)
    lp = torch.zeros((S, C), dtype=torch.float32)
    for i, (r, l, m) in enumerate(zip(ids, logprobs, masks)):
        if r:
            completion[i, : len(r)] = torch.tensor(r)
            mask[i, : len(m)] = torch.tensor(m)
            lp[i, : len(l)] = torch.tensor(l, dtype=torch.float32)
    lp = lp.masked_fill(mask == 0, 0.0)
    return Generation(prompt_ids, prompt_mask, completion.to(device), mask.to(device), lp.to(device), texts or [])


def plain_text(policy: Sampler, c: Completion, stop_strings: Sequence[str]) -> str:
    """A plain sample's text as the local decoder writes it: no final EOS, cut after the first stop string."""
    ids = c.ids[:-1] if c.ids and c.ids[-1] in policy.eos_ids else c.ids
    text = policy.tokenizer.decode(ids, skip_special_tokens=True)
    if c.by_stop:
        ends = [text.find(s) + len(s) for s in stop_strings if s in text]
        if ends:
            text = text[: min(ends)]
    return text


def section_text(policy: Sampler, ids: list[int], by_stop: bool, stop_strings: Sequence[str]) -> str:
    """A structured section's text: no final EOS, cut before the first stop string when one ended it."""
    ids = ids[:-1] if ids and ids[-1] in policy.eos_ids else ids
    text = policy.tokenizer.decode(ids, skip_special_tokens=True)
    if by_stop:
        cut = [text.find(s) for s in stop_strings if s in text]
        text = text[: min(cut)] if cut else text
    return text


def run_scripts(
    complete: Any,
    prompts: list[list[int]],
    scripts: Sequence[Sequence[Segment]],
    base: SamplingSettings,
    policy: Sampler,
) -> tuple[list[tuple[list[int], list[float], list[int]]], list[list[str]]]:
    """Every row through its script (`textzoo.decoding.sampling.Segment`s) with ``complete(rows, settings)``:
    forced segments are appended (mask 0), each sampled section is one request of the rows at that point
    (those with the same budget and stop strings together). Returns per row (completion ids, log-probs,
    mask) and its section texts."""
    S = len(prompts)
    ids: list[list[int]] = [[] for _ in range(S)]
    lps: list[list[float]] = [[] for _ in range(S)]
    masks: list[list[int]] = [[] for _ in range(S)]
    texts: list[list[str]] = [[] for _ in range(S)]
    at = [0] * S  # each row's next segment
    after_stop = [False] * S
    while True:
        for r in range(S):  # forced segments up to the next sampled section
            while at[r] < len(scripts[r]) and scripts[r][at[r]].forced:
                forced = list(scripts[r][at[r]].tokens(after_stop[r]))
                ids[r] += forced
                lps[r] += [0.0] * len(forced)
                masks[r] += [0] * len(forced)
                at[r] += 1
        waiting = [r for r in range(S) if at[r] < len(scripts[r])]
        if not waiting:
            break
        groups: dict[tuple, list[int]] = {}
        for r in waiting:
            seg = scripts[r][at[r]]
            groups.setdefault((seg.budget, seg.stop_strings), []).append(r)
        for (budget, stops), rows in groups.items():
            settings = SamplingSettings(**{**base.__dict__, "max_tokens": budget, "stop_strings": stops})
            done = complete([prompts[r] + ids[r] for r in rows], settings)
            for r, c in zip(rows, done):
                ids[r] += c.ids
                lps[r] += c.logprobs
                masks[r] += [1] * len(c.ids)
                texts[r].append(section_text(policy, c.ids, c.by_stop, stops))
                eos = scripts[r][at[r]].eos_is_stop and bool(c.ids) and c.ids[-1] in policy.eos_ids
                after_stop[r] = c.by_stop or eos
                at[r] += 1
    return list(zip(ids, lps, masks)), texts
