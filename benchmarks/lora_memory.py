"""Memory of N agents: full fine-tuning vs one LoRA adapter per agent, with and without a shared base.

    OMP_NUM_THREADS=1 python benchmarks/lora_memory.py                          # GPT-2 shape, 6 x 512, N = 1 2 4 8
    OMP_NUM_THREADS=1 python benchmarks/lora_memory.py --n-layer 12 --n-embd 768 --n-head 12 --agents 1 4

Each (mode, N) runs in a fresh process, once per round, the modes of an N alternating (`--rounds`,
default 3; the table gives medians [min, max] and the ratio to full fine-tuning round by round): it
builds N agents from an `AgentConfig` (Refine-v0 roles), gives each a learner, and runs one training
step per agent (generate, score, backward, AdamW step), so gradients and optimizer moments exist. Modes:
- `full`: every agent its own model, all weights trained (`lora.rank=0`);
- `lora-separate`: every agent its own copy of the base plus one adapter (no sharing);
- `lora-shared`: one base shared by all agents, one adapter each (`lora.rank>0`, textzoo's builder).
Columns: `weights MiB` = bytes of every distinct parameter storage (base copies counted once each);
`train MiB` = gradients + AdamW moments; `RSS MiB` = the process's resident memory after the step
minus its resident memory before building (on CUDA, `cuda MiB` = peak allocated there).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

MODES = ("full", "lora-separate", "lora-shared")


@dataclass
class Args(harness.Common):
    agents: tuple[int, ...] = (1, 2, 4, 8)
    """Team sizes N (N - 1 refiners + 1 generator)."""
    n_layer: int = 6
    """Layers of the GPT-2-shaped model built from its config."""
    n_embd: int = 512
    """Width of the model."""
    n_head: int = 8
    """Attention heads."""
    rank: int = 8
    """LoRA rank."""
    device: str = "cpu"
    """cpu or cuda."""
    one: str = ""
    """Internal: measure one "mode:N" in this process and print its JSON."""


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def measure(args: Args, mode: str, n: int) -> dict:
    from textzoo.config import AgentConfig, LoRAConfig, TrainConfig
    from textzoo.models.build import build_policy, generation_config
    from textzoo.models.lora import SharedBase
    from textzoo.runners.build import build_actors, build_learner

    harness.setup(args.threads)
    device = torch.device(args.device)
    proc = psutil.Process()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rss0 = proc.memory_info().rss
    agent = AgentConfig(
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=args.n_head,
        max_new_tokens=8,
        lora=LoRAConfig(rank=0 if mode == "full" else args.rank),
        device=args.device,
    )
    roles = [f"refiner_{i}" for i in range(n - 1)] + ["generator"]
    if mode == "lora-separate":
        policies = []
        for i, role in enumerate(roles):
            shared = SharedBase(build_policy(agent, i, device))
            generation = generation_config(agent, shared.tokenizer, shared.base)
            policies.append(shared.add(role, agent.lora.rank, agent.lora.alpha, generation=generation, seed=i))
    else:
        cfg = TrainConfig(env="textzoo/Refine-v0", agent=agent)
        policies = [a.policy for a in build_actors(cfg, roles)]
    learners = [build_learner(p.model, agent, 1) for p in policies]
    for policy, learner in zip(policies, learners):
        gen = policy.generate(["Write one sentence about the old harbor."] * 4)
        logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        (-logp.sum()).backward()
        learner.optimizer.step()
    gc.collect()
    params = [p for policy in policies for p in policy.model.parameters()]
    if mode != "full":  # a view lists only its adapter: add the base(s) it runs on
        params += [p for policy in policies for _, p in policy.model.shared.base_parameters()]
    trained = [p for learner in learners for p in learner.params]
    moments = [
        v
        for learner in learners
        for s in learner.optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]
    out = {
        "mode": mode,
        "N": n,
        "params_M": sum(p.numel() for p in {id(p): p for p in params}.values()) / 1e6,
        "trained_M": sum(p.numel() for p in trained) / 1e6,
        "weights_MiB": _storage_bytes(params) / 2**20,
        "train_MiB": (_storage_bytes([p.grad for p in trained if p.grad is not None]) + _storage_bytes(moments))
        / 2**20,
        "rss_MiB": (proc.memory_info().rss - rss0) / 2**20,
    }
    if device.type == "cuda":
        out["cuda_MiB"] = torch.cuda.max_memory_allocated() / 2**20
    return out


FIGURES = {
    "params_M": "params (M)",
    "trained_M": "trained (M)",
    "weights_MiB": "weights MiB",
    "train_MiB": "grads+Adam MiB",
    "rss_MiB": "RSS MiB",
    "cuda_MiB": "cuda MiB",
}


def main() -> None:
    args = tyro.cli(Args)
    if args.one:
        mode, n = args.one.split(":")
        print(json.dumps(measure(args, mode, int(n))))
        return
    figures = dict(FIGURES) if args.device.startswith("cuda") else {k: v for k, v in FIGURES.items() if k != "cuda_MiB"}
    header, rows, entries = [], [], {}
    for n in args.agents:
        commands = {
            m: [sys.executable, __file__, *harness.cli_flags(dataclasses.replace(args, one=f"{m}:{n}"))] for m in MODES
        }
        sides = {mode: lambda c=command: harness.run_json(c, args.threads) for mode, command in commands.items()}
        alt = harness.alternate(sides, args.rounds)
        header, table = harness.compare(alt, figures, reference="full", ratios=("weights_MiB", "train_MiB", "rss_MiB"))
        rows += [[f"N={n}: {row[0]}", *row[1:]] for row in table]
        entries[n] = alt.to_json()
        note = alt.note()
    title = f"GPT-2 shape {args.n_layer} x {args.n_embd}, LoRA rank {args.rank}, device {args.device}"
    harness.report(args.results, "lora_memory", title, header, rows, entries, [note])


if __name__ == "__main__":
    main()
