"""Supervised warm-up: fit a `Policy` to (prompt, completion) pairs before RL.

Loss: token-level cross-entropy on the completion tokens only, the mean over every completion
token of the batch; prompt tokens and padding contribute nothing. Each completion is followed by
EOS (so the warmed-up policy learns to stop). Prompts go through the agent's prompt format (the chat
template of an instruct model, raw text otherwise) and log-probs come from `Policy.score`, the function
RL scores samples with, so the context, positions under left padding, temperature and an allowed-token
restriction are the ones the agent later samples in. Each step is one update job run by the trainer's
update path (`textzoo.runners.update.run_job`, AdamW from `textzoo.runners.build.build_learner`).

Python: ``losses = sft(policy, pairs, steps=100, lr=1e-3, batch_size=16)``.
CLI: ``textzoo sft --pairs pairs.jsonl --out OUT`` (one JSON object per line with ``prompt`` and
``completion``), then ``textzoo train --agent-overrides '{"sender": {"model": "OUT"}}'``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.algorithms.rlmath import BatchNorm
from textzoo.config import AgentConfig, SFTArgs, UpdateConfig
from textzoo.decoding.generation import Generation
from textzoo.decoding.modes import eval_mode
from textzoo.errors import ConfigError
from textzoo.jsonl import read_jsonl
from textzoo.models.build import build_policy, prompt_format, resolve_device
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.runners.build import build_learner
from textzoo.runners.update import run_job

Pair = tuple[str, str]


def load_pairs(path: str | Path) -> list[Pair]:
    """(prompt, completion) pairs from a JSONL file with `prompt` and `completion` string fields."""
    pairs: list[Pair] = []
    for n, row in read_jsonl(path, "pairs file", ConfigError):
        if not isinstance(row.get("prompt"), str) or not isinstance(row.get("completion"), str):
            raise ConfigError(f'pairs file {str(path)!r}, line {n}: needs string fields "prompt" and "completion"')
        pairs.append((row["prompt"], row["completion"]))
    if not pairs:
        raise ConfigError(f"pairs file {str(path)!r} holds no pairs")
    return pairs


def save_pairs(pairs: Sequence[Pair], path: str | Path) -> None:
    """Write pairs as the JSONL file `load_pairs` reads."""
    lines = [json.dumps({"prompt": p, "completion": c}) for p, c in pairs]
    Path(path).write_text("\n".join(lines) + "\n")


def completion_ids(policy: Policy, pairs: Sequence[Pair], add_eos: bool = True) -> list[list[int]]:
    """Token ids of each completion (+ EOS), checked against the policy's allowed tokens."""
    allowed = policy.generation.allowed_tokens
    allowed_set = None if allowed is None else {*allowed, *policy.eos_ids}
    rows = []
    for i, (_, completion) in enumerate(pairs):
        ids = policy.tokenizer.encode(completion, add_special_tokens=False) + ([policy.eos_id] if add_eos else [])
        if not ids:
            raise ConfigError(f"pair {i} has an empty completion and add_eos=False: there is no token to learn")
        if allowed_set is not None and not allowed_set.issuperset(ids):
            bad = sorted(set(ids) - allowed_set)
            raise ConfigError(
                f"pair {i}: completion {completion!r} uses token ids {bad} outside the policy's allowed tokens; "
                "they have probability 0, so fix the completion or the allowed outputs"
            )
        rows.append(ids)
    return rows


def sft_loss(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> torch.Tensor:
    """Mean negative log-likelihood of the completion tokens (a scalar with gradient)."""
    gen = Generation(prompt_ids, prompt_mask, completion_ids, completion_mask, torch.zeros_like(completion_ids), [])
    return completion_nll(policy, SampleBatch(gen, torch.zeros(len(gen))), BatchNorm.of(completion_mask, 1))[0].sum()


def completion_nll(policy: Policy, batch: SampleBatch, norm: BatchNorm) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sample shares [S] of the batch's mean completion-token NLL (an update job's loss function)."""
    gen = batch.gen
    logprobs = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)  # [S, C]
    mask = gen.completion_mask.to(logprobs.dtype)  # [S, C]
    return -(logprobs * mask).sum(-1) / norm.num_tokens, {}


def sft(
    policy: Policy,
    pairs: Sequence[Pair],
    *,
    steps: int = 100,
    lr: float = 1e-3,
    batch_size: int = 16,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    add_eos: bool = True,
    seed: int = 0,
    prompt_format: PromptFormat | None = None,
) -> list[float]:
    """Train `policy` in place on `pairs` for `steps` AdamW steps; return the loss of each step.

    Prompts are formatted by `prompt_format` (default: "auto" for the policy's tokenizer). Batches are
    drawn from shuffled passes over the pairs (seeded by `seed`, global RNG untouched).
    """
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"sft needs steps >= 1 and batch_size >= 1, got steps={steps}, batch_size={batch_size}")
    if not lr > 0:
        raise ConfigError(f"sft lr must be > 0, got {lr}")
    if not pairs:
        raise ConfigError("sft needs at least one (prompt, completion) pair")
    fmt = prompt_format or PromptFormat.resolve(policy.tokenizer)
    prompts = [p for p, _ in pairs]
    targets = completion_ids(policy, pairs, add_eos)
    device = policy.device
    settings = AgentConfig(lr=lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
    learner = build_learner(policy.model, settings, steps)
    update = UpdateConfig(micro_batch_size=batch_size)  # one forward per step, as one batch
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses: list[float] = []
    with eval_mode(policy.model, training=True):
        for _ in range(steps):
            if len(order) < min(batch_size, len(pairs)):
                order += torch.randperm(len(pairs), generator=generator).tolist()
            rows, order = order[:batch_size], order[batch_size:]
            # The prompt is prepared exactly as `generate` prepares it (formatted, left-aligned, an empty
            # prompt gets a start token), so the scored context is the one the policy will sample in.
            prompt_ids, prompt_mask = policy.prepare_prompts(*fmt.encode(policy, [prompts[r] for r in rows]))  # [S, P]
            C = max(len(targets[r]) for r in rows)
            comp = torch.full((len(rows), C), policy.pad_id, dtype=torch.long)  # [S, C]
            comp_mask = torch.zeros((len(rows), C), dtype=torch.long)  # [S, C]
            for i, r in enumerate(rows):
                comp[i, : len(targets[r])] = torch.tensor(targets[r])
                comp_mask[i, : len(targets[r])] = 1
            gen = Generation(prompt_ids, prompt_mask, comp.to(device), comp_mask.to(device), comp.to(device) * 0.0, [])
            job = Job(
                "sft", SampleBatch(gen, torch.zeros(len(rows))), partial(completion_nll, policy), max_new_tokens=C
            )
            losses.append(run_job(job, learner, update)["loss"])
    return losses


def run_sft(args: SFTArgs) -> list[float]:
    """Build the policy `args` describe, warm it up on the pairs file, save it to `args.out`."""
    pairs = load_pairs(args.pairs)
    policy = build_policy(args, args.seed, resolve_device(args.device))  # SFTArgs is the agent's AgentConfig
    losses = sft(
        policy,
        pairs,
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        add_eos=args.add_eos,
        seed=args.seed,
        prompt_format=prompt_format(args, policy),
    )
    out = Path(args.out)
    policy.save_pretrained(out)
    summary = {"args": asdict(args), "pairs": len(pairs), "loss_first": losses[0], "loss_last": losses[-1]}
    (out / "sft.json").write_text(json.dumps(summary, indent=2) + "\n")
    return losses
