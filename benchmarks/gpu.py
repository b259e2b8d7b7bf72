"""GPU throughput of the real runner on a ~0.5B model: generation and update tokens/s, MFU, peak memory.

    python benchmarks/gpu.py                  # Qwen2.5-0.5B shape, random bf16 weights, 2 agents, G=4, 256 new tokens
    python benchmarks/gpu.py --tiny           # the same script on CPU with a tiny model (seconds)

Sized for a 10-minute GPU session (a few minutes here, most of it building and saving the models).
The model is built from a config (Qwen2.5-0.5B's shape: 24 layers, width 896, 14 heads / 2 KV heads,
vocab 151,936, tied embeddings; 494M parameters), with random weights in bf16, and saved to a
temporary folder that `TrainConfig.agent.model` points at, so the run goes through textzoo's own
builders, placement, `Collector` and `run_job`. Prompts come from `textzoo/Writing-v0`, tokenized by
the byte tokenizer; sampling is restricted to printable bytes (the other 151k logits are still
computed), so a sample ends at EOS (probability ~1/100 per token) or at the budget.

Phases, each on fresh rollouts of `batch_prompts` x G samples per agent: `warmup` steps, then
`steps` steps with batched backward (`micro_batch_size` samples per backward) and `steps` with
per-sample backward (one sample's activations at a time, same gradient).

Figures: generation tokens/s = sampled tokens / time in `generate`; update tokens/s = sequence
tokens (prompt + completion) forwarded and back-propagated per second of update; MFU = model FLOPs
/ (time x `peak_tflops`), with 2·N FLOPs per token for generation and 6·N for the update (N = the
parameters, the tied embedding counted once as the LM head; attention FLOPs ignored, so MFU is
slightly understated); peak memory = `torch.cuda.max_memory_allocated` in each phase.
"""

from __future__ import annotations

import json
import os
import string
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import tyro
from transformers import AutoModelForCausalLM, Qwen2Config

from textzoo.agents.tokenizer import byte_tokenizer
from textzoo.runners.config import AgentConfig, TrainConfig
from textzoo.runners.trainer import Trainer
from textzoo.runners.update import UpdateConfig

QWEN2_0_5B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
"""Qwen2.5-0.5B's shape (random weights here)."""
TINY = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


@dataclass
class Args:
    """GPU benchmark settings."""

    tiny: bool = False
    """A tiny model on CPU (for testing the script); figures are then only a smoke check."""
    group_size: int = 4
    """Samples per prompt (G)."""
    batch_prompts: int = 8
    """Prompts per step (B); B x G samples per agent."""
    max_new_tokens: int = 256
    """Completion budget."""
    micro_batch_size: int = 8
    """Samples per backward in the batched phase."""
    steps: int = 2
    """Measured steps per phase."""
    warmup: int = 1
    """Unmeasured steps first (kernel selection, allocator warm-up)."""
    peak_tflops: float = 989.0
    """Dense bf16 peak of the accelerator for MFU (H100/H200 SXM: 989)."""
    out: str = ""
    """Also write the figures as JSON here."""


def save_model(shape: dict, path: str, seed: int) -> int:
    """Build a random bf16 Qwen2-shaped model with the byte tokenizer's ids, save it; return its size."""
    tokenizer = byte_tokenizer(model_max_length=shape["max_position_embeddings"])
    config = Qwen2Config(
        **shape,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def phase(trainer: Trainer, steps: int, update: UpdateConfig, params: int, peak_flops: float | None) -> dict:
    """Run `steps` training steps with `update`; generation/update throughput, MFU and peak memory."""
    trainer.cfg.update = update
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    gen_s = update_s = gen_tokens = seq_tokens = 0.0
    for _ in range(steps):
        row = trainer.train_step()
        gen_s += row["time/generate"]
        update_s += row["time/update"]
        gen_tokens += row["tokens_generated"]
        seq_tokens += trainer.family.sequence_tokens()
    out = {
        "generate_tokens_per_s": gen_tokens / gen_s,
        "update_tokens_per_s": seq_tokens / update_s,
        "generate_s_per_step": gen_s / steps,
        "update_s_per_step": update_s / steps,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    if peak_flops:
        out["generate_mfu"] = 2 * params * gen_tokens / gen_s / peak_flops
        out["update_mfu"] = 6 * params * seq_tokens / update_s / peak_flops
    return out


class RecordingFamily:
    """Wraps the run's algorithm family and keeps each step's jobs (to count the tokens an update trains on)."""

    def __init__(self, family):
        self.family = family
        self.last_jobs: list = []

    def __getattr__(self, name: str):
        return getattr(self.family, name)

    def jobs(self, rollout):
        self.last_jobs, stats = self.family.jobs(rollout)
        return self.last_jobs, stats

    def sequence_tokens(self) -> int:
        """Prompt + completion tokens of the last step's jobs, once per epoch."""
        return sum(
            int(job.batch.gen.prompt_mask.sum() + job.batch.gen.completion_mask.sum()) * job.epochs
            for job in self.last_jobs
        )


def main() -> None:
    a = tyro.cli(Args)
    cuda = torch.cuda.is_available()
    if not a.tiny and not cuda:
        raise SystemExit("no GPU visible: run with --tiny to check the script on CPU")
    if a.tiny:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    shape = TINY if a.tiny else QWEN2_0_5B
    max_new = min(a.max_new_tokens, 16) if a.tiny else a.max_new_tokens
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="textzoo-gpu-") as tmp:
        params = 0
        for i in range(2):
            params = save_model(shape, os.path.join(tmp, f"agent{i}"), seed=i)
        agent = AgentConfig(
            model=os.path.join(tmp, "agent0"),
            dtype="bfloat16",
            lr=1e-5,
            max_new_tokens=max_new,
            allowed_outputs=(string.ascii_letters + string.digits + string.punctuation + " ",),
        )
        cfg = TrainConfig(
            env="textzoo/Writing-v0",
            env_kwargs={"terms": {"length_ratio": 1.0}},
            algo="magrpo",
            agent=agent,
            agent_overrides={"elaboration": {"model": os.path.join(tmp, "agent1")}},
            steps=a.warmup + 2 * a.steps,
            batch_prompts=a.batch_prompts,
            group_size=a.group_size,
            devices="auto" if cuda else "cpu",
            progress=False,
            plot=False,
            run_dir=os.path.join(tmp, "run"),
        )
        trainer = Trainer(cfg)
        trainer.family = RecordingFamily(trainer.family)
        built_s = time.perf_counter() - start
        peak = a.peak_tflops * 1e12 if cuda else None
        batched = UpdateConfig(micro_batch_size=a.micro_batch_size)
        phase(trainer, a.warmup, batched, params, peak)
        results = {
            "batched_backward": phase(trainer, a.steps, batched, params, peak),
            "per_sample_backward": phase(trainer, a.steps, UpdateConfig(per_sample_backward=True), params, peak),
        }
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    header = {
        "device": device,
        "params_per_agent": params,
        "agents": 2,
        "B": a.batch_prompts,
        "G": a.group_size,
        "max_new_tokens": max_new,
        "build_s": round(built_s, 1),
        "total_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(header))
    print("| figure | batched backward | per-sample backward |")
    print("| --- | --- | --- |")
    for key in results["batched_backward"]:
        values = [results[mode][key] for mode in ("batched_backward", "per_sample_backward")]
        print(f"| {key} | " + " | ".join("n/a" if v is None else f"{v:.4g}" for v in values) + " |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({**header, **results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
