"""GPU engine figures for a pair of agents of a real model's shape (Qwen2.5-0.5B by default): decode and
update tokens/s against the machine's own limits, eager vs CUDA-graph decoding side by side, peak memory.

    python benchmarks/gpu.py                    # Qwen2.5-0.5B shape, random bf16 weights, 2 agents, 64 rows, 256 tokens
    python benchmarks/gpu.py --precision bf16-mixed
    python benchmarks/gpu.py --shape smollm2-135m --agents 1   # the real model of the CPU figures (Llama)
    OMP_NUM_THREADS=1 python benchmarks/gpu.py --tiny   # the same script on CPU with a tiny model (seconds)

Each agent is a model of Qwen2.5-0.5B's shape (24 layers, width 896, 14 heads / 2 KV heads, vocab
151,936, tied embeddings; 494M parameters) or SmolLM2-135M's (`--shape smollm2-135m`: Llama, 30 layers,
width 576, 9 / 3 heads, vocab 49,152, tied; 135M) with random weights, saved to a temporary folder and
loaded through textzoo's own builder (`build_policy`, the agent's `precision`). Its rows are
B prompts of `textzoo/Writing-v0` (byte-tokenized, cut to `prompt_tokens`) x G samples.

Measured in this run, before the models:
  copy bandwidth   a `copy_` of a large buffer: bytes read + written / time
  matmul peak      a square matmul in the compute dtype: 2 n^3 FLOPs / time

Per agent and decode mode (`Policy.decode_mode`: "dynamic" = eager steps over a growing cache with
the prompts grouped, "static" = eager steps over the static cache, "graph" = the static cache's steps
replayed as CUDA graphs, CUDA only):
  decode tokens/s  B x G x new tokens / time of the token loop (after the prefill; EOS disabled, so
                   every row runs all `max_new_tokens`): the median of `--rounds` calls (default 3) that
                   alternate between the modes after a warm-up call of each, with its min and max;
                   `vs_<first mode>` is the speed over the first mode, taken round by round
  of HBM bound     that rate / the rate at which one step could just read what it must: every weight
                   once plus the rows' keys/values at the mean length (bytes / copy bandwidth)
  ms per step      the token loop's time / new tokens
  greedy as first  the fraction of greedy (argmax) tokens equal to the first mode's (64 per row): 1.0
                   on CPU in float32, where the modes decode alike; in bf16 a random model's small
                   logit gaps let rounding flip some argmaxes (a 2-layer Qwen shape on CPU: 0.87).
                   Sampled tokens are no check at all: a random model's distribution is nearly flat,
                   so rounding moves most draws (the same CPU model: 5% of sampled tokens equal)
  greedy logp gap  the largest difference between that mode's and the first mode's log-prob of the
                   same greedy token, over the columns before a row's first differing token (float32
                   on CPU: ~1e-6; a position or cache error shows here before it flips an argmax)
Per agent, the update (`run_job` of REINFORCE over the sampled rows, `micro_batch_size` rows per
backward, chunked selected-token log-probs):
  update tokens/s  prompt + completion tokens forwarded and back-propagated / time; a prompt counts
                   once per micro-batch, where its G rows share its forward (`forwarded_tokens`)
  MFU              6 N FLOPs per token (N = parameters, the tied head once; attention not counted) per
                   second / the matmul peak
  with --logp-blocks ROWS:CHUNK ...: update tokens/s with that log-prob blocking too, timed in calls
                   alternating with the default's (16 positions per block, 2^24 logit elements per chunk)
Peak memory: `torch.cuda.max_memory_allocated` of each phase (CPU: the process's peak RSS so far).
With --profile, torch.profiler tables of 16 decode steps per mode and of one update (top ops by device
time and by CPU time on CUDA, by CPU time on CPU), each with its wall time and the device's busy time.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
import tyro
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from textzoo.config import AgentConfig
from textzoo.decoding import fastlm, sampling
from textzoo.decoding.generation import Generation
from textzoo.decoding.precision import autocast
from textzoo.envs import make
from textzoo.models.build import build_policy
from textzoo.models.tokenizer import byte_tokenizer
from textzoo.runners.build import build_learner
from textzoo.runners.update import UpdateConfig, run_job

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
                  tie_word_embeddings=True)  # fmt: skip
"""Qwen2.5-0.5B's shape (random weights here)."""
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)  # fmt: skip
"""SmolLM2-135M-Instruct's shape (random weights here)."""
SHAPES = {"qwen2-0.5b": (Qwen2Config, QWEN2_0_5B), "smollm2-135m": (LlamaConfig, SMOLLM2_135M)}
TINY = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip


@dataclass
@harness.defaults(batch_prompts=16, max_new_tokens=256)
class Args(harness.Common, harness.Rollouts):
    """GPU engine benchmark settings (`rounds`: timed decode calls per agent and mode, alternating between the
    modes after one warm-up call each, and timed update calls per log-prob blocking; medians;
    `batch_prompts` x `group_size` rows per agent, each decoding `max_new_tokens` with EOS off)."""

    tiny: bool = False
    """A tiny model on CPU (checks the script; its figures mean little)."""
    shape: str = "qwen2-0.5b"
    """The agents' shape: qwen2-0.5b | smollm2-135m (ignored with --tiny)."""
    agents: int = 2
    """Agents measured one after the other (each its own random weights)."""
    precision: str = "bf16-weights"
    """The agents' precision (AgentConfig.precision): bf16-weights = random bf16 weights; bf16-mixed; fp32."""
    prompt_tokens: int = 128
    """Prompt budget (Writing-v0 prompts are cut to their last tokens)."""
    micro_batch_size: int = 16
    """Rows per backward in the update."""
    modes: tuple[str, ...] = ()
    """Decode modes to compare (default: dynamic, static, and graph on CUDA)."""
    out: str = ""
    """Also write the figures as JSON here."""
    profile: bool = False
    """Print torch.profiler tables of 16 decode steps per mode and of one update."""
    logp_blocks: tuple[str, ...] = ()
    """Also time the update with other log-prob blocking, each "ROWS:CHUNK" (`sampling.TOKEN_LOGP_ROWS`
    positions per block, `Policy.logits_chunk` logit elements per chunk), in calls alternating with the
    default's; e.g. 4096:268435456 scores a whole 1 GiB float32 chunk of logits per block."""


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_call(fn) -> float:
    """Seconds of one call of ``fn``, the device synchronized before and after."""
    synchronize()
    with harness.Clock() as clock:
        fn()
        synchronize()
    return clock.wall


def fastest(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (seconds)."""
    return min(timed_call(fn) for _ in range(repeats))


def copy_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second a `copy_` moves (read + write) on ``device``."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = fastest(lambda: dst.copy_(src), 5)
    return 2 * src.numel() / seconds


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """FLOPs per second of an n x n x n matmul in ``dtype`` on ``device``."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    seconds = fastest(lambda: a @ b, 5)
    return 2 * n**3 / seconds


def save_model(config_class: type, shape: dict, path: str, seed: int) -> None:
    """A random model of ``shape`` with the byte tokenizer's special ids, saved with the tokenizer."""
    tokenizer = byte_tokenizer(model_max_length=shape["max_position_embeddings"])
    config = config_class(
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


def prompts(policy, a: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """B Writing-v0 prompts x G rows each, encoded by the agent ([B*G, P])."""
    env = make("textzoo/Writing-v0")
    texts = [env.reset(seed=0, options={"index": i})[0]["summary"] for i in range(a.batch_prompts)]
    env.close()
    return policy.encode([t for t in texts for _ in range(a.group_size)])


def peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return harness.peak_rss_mib() / 1024


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


GREEDY_STEPS = 64
"""Greedy tokens per row compared across decode modes."""
PROFILED_STEPS = 16
"""Decode steps under the profiler (per mode)."""


def profiled(title: str, fn) -> None:
    """Run ``fn`` once under torch.profiler; print its top ops and how busy the device was."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]  # not the ops that launch them
    busy = f"{sum(e.self_device_time_total for e in kernels) / 1e6:.3f} s" if cuda else "n/a (CPU)"
    print(f"--- profile: {title}: wall {wall:.3f} s (profiled), device busy {busy}")
    for sort in ["self_device_time_total"] * cuda + ["self_cpu_time_total"]:
        print(events.table(sort_by=sort, row_limit=15, max_name_column_width=60))


def decoder(policy, ids, mask, mode: str, generator_seed: int = 0):
    """``run(tokens, greedy) -> (seconds, decoded)``: one prefill and ``tokens`` decode steps of one agent in
    ``mode``, timing the token loop; and the prompt mask the loop runs with."""
    policy.decode_mode = mode
    cfg = policy.generation
    ids, mask = policy.prepare_prompts(ids, mask)
    backend = policy.backend()
    rows = ids.shape[0]

    def run(tokens: int = cfg.max_new_tokens, greedy: bool = False) -> tuple[float, sampling.Decoded]:
        run_cfg = replace(cfg, max_new_tokens=min(tokens, cfg.max_new_tokens))
        generator = torch.Generator(ids.device).manual_seed(generator_seed)
        with torch.no_grad(), autocast(ids.device, policy.autocast):
            decoding = backend.prefill(ids, mask, run_cfg.max_new_tokens)
            synchronize()
            start = time.perf_counter()
            choose = sampling.token_choice(run_cfg, rows, greedy=greedy, generator=generator)
            out = sampling.decode(decoding, choose, run_cfg, eos_ids=(-1,), pad_id=policy.pad_id, bias=None)
            synchronize()
            return time.perf_counter() - start, out

    return run, mask


def hbm_bound(policy, mask: torch.Tensor, bandwidth: float) -> float:
    """Decode tokens/s if a step only read what it must: every weight once plus the rows' keys/values at the
    mean length, at the measured copy bandwidth."""
    model, config = policy.model, policy.model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = config.hidden_size // config.num_attention_heads
    kv_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2  # per token, bf16
    mean_length = int(mask.sum(1).float().mean()) + policy.generation.max_new_tokens / 2
    return mask.shape[0] * bandwidth / (weight_bytes + mask.shape[0] * mean_length * kv_bytes)


def decode_phase(policy, ids, mask, a: Args, modes: tuple[str, ...], bandwidth: float) -> dict:
    """Every mode's token loop, timed in alternating rounds after one warm-up call each: its tokens/s (median,
    min, max over the rounds) and the median's fraction of the HBM bound, its speed over the first mode's
    (round by round), the peak memory of its first timed call, and how far its greedy decoding of
    `GREEDY_STEPS` tokens is from the first mode's."""
    runs, masks, memory = {}, {}, {}
    for mode in modes:
        runs[mode], masks[mode] = decoder(policy, ids, mask, mode)
        runs[mode]()  # warm-up: kernel choice, graph capture, allocator

    def timed(mode: str):
        def call() -> dict:
            policy.decode_mode = mode
            first = mode not in memory
            if first:
                reset_peak()
            seconds, decoded = runs[mode]()
            if first:
                memory[mode] = peak_memory_gib()
            completions = decoded.completion_ids  # [S, C]; EOS disabled: every row samples every token
            return {"tokens_per_s": completions.numel() / seconds, "ms_per_step": 1e3 * seconds / completions.shape[1]}

        return call

    alt = harness.alternate({mode: timed(mode) for mode in modes}, a.rounds)
    out: dict = {}
    for mode in modes:
        policy.decode_mode = mode
        if a.profile:  # a few steps: a profile of every step of a long decode takes minutes to build
            profiled(f"decode, {mode}, {PROFILED_STEPS} steps", partial(runs[mode], PROFILED_STEPS))
        rate, bound = alt.spread(mode, "tokens_per_s"), hbm_bound(policy, masks[mode], bandwidth)
        speed = alt.ratio("tokens_per_s", mode, modes[0])
        out.update({f"{mode}/decode_tokens_per_s": rate.median, f"{mode}/decode_tokens_per_s_min": rate.low,
                    f"{mode}/decode_tokens_per_s_max": rate.high, f"{mode}/of_hbm_bound": rate.median / bound,
                    f"{mode}/hbm_bound_tokens_per_s": bound, f"{mode}/vs_{modes[0]}": speed.median,
                    f"{mode}/vs_{modes[0]}_min": speed.low, f"{mode}/vs_{modes[0]}_max": speed.high,
                    f"{mode}/ms_per_step": alt.spread(mode, "ms_per_step").median,
                    f"{mode}/decode_peak_memory_gib": memory[mode]})  # fmt: skip
    greedy = {}
    for mode in modes:
        policy.decode_mode = mode
        greedy[mode] = runs[mode](GREEDY_STEPS, greedy=True)[1]
        out.update({f"{mode}/{k}": v for k, v in agreement(greedy[mode], greedy[modes[0]]).items()})
    return out


def agreement(greedy: sampling.Decoded, first: sampling.Decoded) -> dict:
    """How far a mode's greedy decoding is from the first mode's: the share of equal tokens, and the largest
    gap between the two modes' log-probs of the same token, over each row's columns before its first
    differing token (where both decoded the same context)."""
    same = greedy.completion_ids == first.completion_ids  # [S, C]
    shared = same.long().cumprod(1).bool()  # [S, C] columns before the row's first difference
    gap = (greedy.logprobs - first.logprobs).abs().masked_fill(~shared, 0.0)  # [S, C]
    return {"greedy_as_first": float(same.float().mean()), "greedy_logp_gap": float(gap.max())}


def forwarded_tokens(gen: Generation, micro_batch_size: int) -> int:
    """The tokens an update's forward computes over ``gen``'s rows in micro-batches of ``micro_batch_size``
    contiguous rows: each micro-batch's distinct prompts once (their rows share the prompt's forward), and
    every completion token."""
    prompt_tokens = 0
    for rows in torch.arange(len(gen), device=gen.prompt_ids.device).split(micro_batch_size):
        ids, mask = gen.prompt_ids[rows], gen.prompt_mask[rows]
        prompt_tokens += int(mask[fastlm.shared_rows(ids, mask).first].sum())
    return prompt_tokens + int(gen.completion_mask.sum())


def logp_blocking(spec: str) -> tuple[int, int]:
    """A ROWS:CHUNK string -> (positions per log-prob block, logit elements per chunk)."""
    try:
        rows, chunk = (int(x) for x in spec.split(":"))
        if rows < 1 or chunk < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--logp-blocks takes ROWS:CHUNK pairs of positive integers, got {spec!r}") from None
    return rows, chunk


def update_phase(policy, learner, gen: Generation, a: Args, peak_flops: float, params: int) -> dict:
    """`run_job` of REINFORCE over the agent's rows: tokens/s and MFU (medians over `Args.rounds` timed calls),
    for the default log-prob blocking and each of `Args.logp_blocks`, alternating round by round."""
    advantages = torch.linspace(-1, 1, len(gen), device=gen.prompt_ids.device)
    job = Job("agent", SampleBatch(gen, advantages), partial(reinforce_loss, policy, ReinforceConfig()),
              max_new_tokens=a.max_new_tokens)  # fmt: skip
    cfg = UpdateConfig(micro_batch_size=a.micro_batch_size)
    tokens = forwarded_tokens(gen, a.micro_batch_size)
    default = (sampling.TOKEN_LOGP_ROWS, policy.logits_chunk)
    blockings = {"default": default} | {spec: logp_blocking(spec) for spec in a.logp_blocks}
    memory: list[float] = []

    def timed(blocking: tuple[int, int]):
        def call() -> dict:
            sampling.TOKEN_LOGP_ROWS, policy.logits_chunk = blocking
            if not memory:
                reset_peak()
            seconds = timed_call(lambda: run_job(job, learner, cfg))
            if not memory:
                memory.append(peak_memory_gib())
            return {"tokens_per_s": tokens / seconds}

        return call

    try:
        for blocking in blockings.values():  # warm-up
            sampling.TOKEN_LOGP_ROWS, policy.logits_chunk = blocking
            run_job(job, learner, cfg)
        alt = harness.alternate({name: timed(blocking) for name, blocking in blockings.items()}, a.rounds)
    finally:
        sampling.TOKEN_LOGP_ROWS, policy.logits_chunk = default
    if a.profile:
        profiled("update", lambda: run_job(job, learner, cfg))
    rate = alt.spread("default", "tokens_per_s")
    figures = {"update_tokens_per_s": rate.median, "update_tokens_per_s_min": rate.low,
               "update_tokens_per_s_max": rate.high, "update_mfu": 6 * params * rate.median / peak_flops,
               "update_peak_memory_gib": memory[0]}  # fmt: skip
    for spec, (rows, chunk) in list(blockings.items())[1:]:
        figures[f"update_logp_{rows}_{chunk}/tokens_per_s"] = alt.spread(spec, "tokens_per_s").median
        figures[f"update_logp_{rows}_{chunk}/vs_default"] = alt.ratio("tokens_per_s", spec, "default").median
    return figures


def main(a: Args | None = None) -> dict:
    """Measure, print the table, and return the figures (the `--out` JSON's content)."""
    a = a if a is not None else tyro.cli(Args)
    cuda = torch.cuda.is_available()
    if not a.tiny and not cuda:
        raise SystemExit("no GPU visible: run with --tiny to check the script on CPU")
    if not cuda:
        harness.setup(a.threads)
    device = torch.device("cuda" if cuda else "cpu")
    if a.shape not in SHAPES:
        raise SystemExit(f"--shape must be one of {sorted(SHAPES)}, got {a.shape!r}")
    for spec in a.logp_blocks:  # before any model is built
        logp_blocking(spec)
    config_class, shape = (Qwen2Config, TINY) if a.tiny else SHAPES[a.shape]
    new_tokens = min(a.max_new_tokens, 16) if a.tiny else a.max_new_tokens
    a.max_new_tokens = new_tokens
    modes = a.modes or (("dynamic", "static", "graph") if cuda else ("dynamic", "static"))
    compute = torch.float32 if a.precision == "fp32" else torch.bfloat16
    start = time.perf_counter()
    bandwidth = copy_bandwidth(device, 64 if a.tiny else 2048)
    peak = matmul_peak(device, compute, 512 if a.tiny else 8192)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="textzoo-gpu-") as tmp:
        for i in range(a.agents):
            agent_id = f"agent{i}"
            folder = os.path.join(tmp, agent_id)
            save_model(config_class, shape, folder, seed=i)
            agent = AgentConfig(model=folder, precision=a.precision, max_new_tokens=new_tokens,
                                max_prompt_tokens=a.prompt_tokens, lr=1e-5, device=str(device))  # fmt: skip
            policy = build_policy(agent, seed=i, device=device)
            params = sum(p.numel() for p in policy.model.parameters())
            ids, mask = prompts(policy, a)
            row = decode_phase(policy, ids, mask, a, modes, bandwidth)
            policy.decode_mode = "auto"
            with torch.random.fork_rng(devices=[device] if cuda else []):
                torch.manual_seed(i)
                gen = policy.generate_ids(ids, mask)
            learner = build_learner(policy.model, agent, total_steps=10)
            row.update(update_phase(policy, learner, gen, a, peak, params))
            results[agent_id] = row
            del policy, learner, gen
            if cuda:
                torch.cuda.empty_cache()
    header = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "shape": "tiny" if a.tiny else a.shape,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params_per_agent": params,
        "precision": a.precision,
        "rows_per_agent": a.batch_prompts * a.group_size,
        "new_tokens": new_tokens,
        "copy_bandwidth_gb_per_s": round(bandwidth / 1e9, 2),
        "matmul_peak_tflops": round(peak / 1e12, 3),
        "total_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(header))
    agents = sorted(results)
    print("| figure | " + " | ".join(agents) + " |")
    print("| --- |" + " --- |" * len(agents))
    for key in results[agents[0]]:
        print(f"| {key} | " + " | ".join(f"{results[x][key]:.4g}" for x in agents) + " |")
    figures = {**header, "agents": results}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main()
