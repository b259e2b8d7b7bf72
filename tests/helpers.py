"""Shared test factories: the CPU-sized `TrainConfig` most training tests start from, a run's metrics
rows, and the gradients of a tiny Llama scored in a given precision.

`tiny_config(**fields)` is `TINY` (two steps of 2 prompts x 2 samples, 2 held-out prompts, tiny agents
writing 8 tokens, no progress bar or plot) with `fields` on top, so a test names only what it is about.
A test that needs a field at `TrainConfig`'s own default (e.g. `eval_prompts=16`) passes it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from os import PathLike
from pathlib import Path
from typing import Any

import torch

from textzoo.config import AgentConfig, TrainConfig

TINY: dict[str, Any] = {
    "steps": 2,
    "batch_prompts": 2,
    "group_size": 2,
    "eval_prompts": 2,
    "progress": False,
    "plot": False,
}
"""The fields every tiny run shares (the agent is `AgentConfig(max_new_tokens=8)` unless given)."""


def tiny_config(**fields: Any) -> TrainConfig:
    """`TINY` with `fields` on top; a `run_dir` path becomes a str."""
    if isinstance(fields.get("run_dir"), PathLike):
        fields["run_dir"] = str(fields["run_dir"])
    return TrainConfig(**{**TINY, "agent": AgentConfig(max_new_tokens=8), **fields})


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl`` rows without their ``time/*`` fields (what an exact resume reproduces)."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def tiny_llama_grads(autocast: torch.dtype | None):
    """A 2-layer tiny-llama's fp32 samples of three prompts (two alike), scored under ``autocast`` (None:
    float32) and back-propagated with weights -1..1 over the positions: (generation, log-probs,
    gradients by parameter name, policy)."""
    from textzoo.models.build import build_policy

    policy = build_policy(AgentConfig(model="tiny-llama", n_layer=2, n_embd=64, n_head=2), 0, torch.device("cpu"))
    gen = policy.generate(["hello there", "hello there", "abc"], generator=torch.Generator().manual_seed(0))
    policy.autocast = autocast
    policy.model.train()
    logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
    grads = {name: p.grad.clone() for name, p in policy.model.named_parameters()}
    return gen, logp.detach(), grads, policy


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module (registered in ``sys.modules``: its dataclasses
    resolve their annotations through it)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
