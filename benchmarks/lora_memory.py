"""Memory of N agents: full fine-tuning vs one LoRA adapter per agent, with and without a shared base.

    OMP_NUM_THREADS=1 python benchmarks/lora_memory.py                          # GPT-2 shape, 6 x 512, N = 1 2 4 8
    OMP_NUM_THREADS=1 python benchmarks/lora_memory.py --n-layer 12 --n-embd 768 --n-head 12 --agents 1 4

Each (mode, N) runs in a fresh process: it builds N agents from an `AgentConfig` (Refine-v0 roles),
gives each a learner, and runs one training step per agent (generate, score, backward, AdamW step),
so gradients and optimizer moments exist. Modes:
- `full`: every agent its own model, all weights trained (`lora.rank=0`);
- `lora-separate`: every agent its own copy of the base plus one adapter (no sharing);
- `lora-shared`: one base shared by all agents, one adapter each (`lora.rank>0`, textzoo's builder).
Columns: `weights MiB` = bytes of every distinct parameter storage (base copies counted once each);
`train MiB` = gradients + AdamW moments; `RSS MiB` = the process's resident memory after the step
minus its resident memory before building (on CUDA, `cuda MiB` = peak allocated there).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from dataclasses import dataclass

import psutil
import torch
import tyro

MODES = ("full", "lora-separate", "lora-shared")


@dataclass
class Args:
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

    torch.set_num_threads(1)
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


def main() -> None:
    args = tyro.cli(Args)
    if args.one:
        mode, n = args.one.split(":")
        print(json.dumps(measure(args, mode, int(n))))
        return
    rows = []
    for n in args.agents:
        for mode in MODES:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                f"{mode}:{n}",
                "--n-layer",
                str(args.n_layer),
                "--n-embd",
                str(args.n_embd),
                "--n-head",
                str(args.n_head),
                "--rank",
                str(args.rank),
                "--device",
                args.device,
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{mode} N={n} failed:\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    cuda = args.device.startswith("cuda")
    print(f"\nGPT-2 shape {args.n_layer} x {args.n_embd}, LoRA rank {args.rank}, device {args.device}\n")
    print(
        "| N | mode | params (M) | trained (M) | weights MiB | grads+Adam MiB | RSS MiB |"
        + (" cuda MiB |" if cuda else "")
    )
    print("|---|---|---|---|---|---|---|" + ("---|" if cuda else ""))
    for r in rows:
        line = (
            f"| {r['N']} | {r['mode']} | {r['params_M']:.2f} | {r['trained_M']:.3f} | {r['weights_MiB']:.0f} | "
            f"{r['train_MiB']:.1f} | {r['rss_MiB']:.0f} |"
        )
        print(line + (f" {r['cuda_MiB']:.0f} |" if cuda else ""))


if __name__ == "__main__":
    main()
