"""Peak memory of one update with and without `per_sample_backward`, and how far the gradients differ.

    OMP_NUM_THREADS=1 python benchmarks/memory.py                      # tiny and a 4x256 GPT-2, CPU
    python benchmarks/memory.py --arch qwen2 --n-layer 24 --n-embd 896 --n-head 14 --samples 32 --tokens 256  # GPU

One update = `run_job` over S samples of P prompt + C completion tokens (random ids, REINFORCE with
seq_sum aggregation). Each mode runs in a fresh subprocess so that one mode's allocations do not
hide the other's, once per round, the modes alternating (`--rounds`, default 3): the table gives each
figure's median [min, max] over the rounds and the ratio to the batched mode, taken round by round.
Figures per mode:
  saved activations  the most bytes autograd held for backward at one time (saved-tensor hooks;
                     weights it saves are not counted): what per-sample backward is meant to shrink
  peak delta         CPU: peak RSS above the level before the update (sampled every millisecond);
                     GPU: torch.cuda.max_memory_allocated above the allocation before the update
Then both modes run here on one batch and the largest |gradient difference| is printed.

The Qwen-vocabulary case (`--preset qwen-vocab`, part of the default run) measures the selected-token
log-probs (`textzoo.decoding.sampling.selected_log_probs`) with a vocabulary of V = 151,936 on a narrow
2-layer Qwen2 model (width 64, so it runs on CPU): the peak of a scoring pass (no gradients) and of a
forward + backward, each with all [S, C, V] logits at once (naive, `Policy.logits_chunk = 0`) and in
chunks of positions (`Policy.logits_chunk`, the default), each in a fresh subprocess; then the largest
log-prob and gradient differences between the two, computed here (the four runs alternate in rounds
too). Its CPU workers run with glibc's
`MALLOC_MMAP_THRESHOLD_` fixed at 1 MiB, so that every large tensor is mapped on its own and returned
to the system when freed: peak RSS then follows the tensors alive (with glibc's adaptive threshold, the
16 MiB chunks are carved from the heap, which small tensors fragment, and RSS keeps freed chunks).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from functools import partial
from pathlib import Path

import torch

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from textzoo.decoding import sampling
from textzoo.decoding.generation import Generation
from textzoo.models.policy import Policy
from textzoo.runners.update import Learner, UpdateConfig, run_job

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

MODES = ["batched", "per_sample", "per_sample_shared"]
"""batched: micro-batches of all samples; per_sample: one sample per backward, each running its
prompt; per_sample_shared: one sample per backward, the G samples of a prompt sharing its forward
(`Policy.prompt_cache`, what the trainer uses)."""
PRESETS = {
    "tiny": dict(arch="gpt2", n_layer=2, n_embd=64, n_head=2, samples=8, group=4, prompt=16, tokens=32),
    "small": dict(arch="gpt2", n_layer=4, n_embd=256, n_head=4, samples=32, group=4, prompt=64, tokens=64),
}
MIB = 2**20
QWEN_VOCAB = dict(vocab=151936, n_layer=2, n_embd=64, n_head=4, samples=16, group=4, prompt=16, tokens=32)
"""The Qwen-vocabulary case: Qwen2.5's vocabulary on a narrow model."""
LOGITS_RUNS = ["score:naive", "score:chunked", "train:naive", "train:chunked"]


def build(args: argparse.Namespace, device: torch.device) -> tuple[Policy, Job]:
    policy = Policy.tiny(
        args.arch,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=args.n_head,
        n_positions=args.prompt + args.tokens + 8,
        seed=0,
        device=device,
    )
    vocab = len(policy.tokenizer)
    g = torch.Generator().manual_seed(0)
    S, P, C = args.samples, args.prompt, args.tokens
    prompts = torch.randint(3, vocab, (S // args.group, P), generator=g)  # [S/G, P]
    gen = Generation(
        prompt_ids=prompts.repeat_interleave(args.group, 0).to(device),  # [S, P] G copies of each prompt
        prompt_mask=torch.ones(S, P, dtype=torch.long, device=device),  # [S, P]
        completion_ids=torch.randint(3, vocab, (S, C), generator=g).to(device),  # [S, C]
        completion_mask=torch.ones(S, C, dtype=torch.long, device=device),  # [S, C]
        logprobs=torch.zeros(S, C, device=device),  # [S, C] old log-probs (unused without clipping)
        texts=[""] * S,
    )
    advantages = torch.randn(S, generator=g).to(device)  # [S]
    job = Job("a", SampleBatch(gen, advantages), partial(reinforce_loss, policy, ReinforceConfig()), max_new_tokens=C)
    return policy, job


def update(policy: Policy, job: Job, mode: str) -> list[torch.Tensor]:
    """One run_job that leaves the weights as they were (SGD, lr 0) and returns the gradients."""
    learner = Learner(policy.model, torch.optim.SGD(policy.model.parameters(), lr=0.0), max_grad_norm=None)
    job.prompt_cache = policy.prompt_cache if mode == "per_sample_shared" else None
    cfg = UpdateConfig(micro_batch_size=len(job.batch)) if mode == "batched" else UpdateConfig(per_sample_backward=True)
    policy.model.zero_grad(set_to_none=True)
    run_job(job, learner, cfg)
    return [p.grad.detach().clone() for p in policy.model.parameters()]


class SavedBytes:
    """Bytes of the tensors autograd holds for backward (weights excluded); `peak` is the most at
    once. A saved tensor counts from when the forward saves it until autograd lets it go."""

    def __init__(self, model: torch.nn.Module):
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.live: dict[int, list[int]] = {}  # storage pointer -> [times held, bytes]
        self.current, self.peak = 0, 0

    def pack(self, t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.weights:
            return t
        entry = self.live.setdefault(ptr, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.current += entry[1]
            self.peak = max(self.peak, self.current)
        entry[0] += 1
        return _Held(self, ptr, t)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[ptr]


class _Held:
    """A saved tensor; autograd dropping it (after backward) releases its bytes."""

    def __init__(self, owner: SavedBytes, ptr: int, tensor: torch.Tensor):
        self.owner, self.ptr, self.tensor = owner, ptr, tensor

    def __del__(self) -> None:
        self.owner.release(self.ptr)


class PeakMemory:
    """The peak memory above the level at entry: CPU peak RSS (sampled every millisecond) or
    `torch.cuda.max_memory_allocated`; `delta` (bytes) and `seconds` are set on exit."""

    def __init__(self, device: torch.device):
        self.device = device
        self.delta, self.seconds = 0, 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            import psutil

            self.proc = psutil.Process()
            self.base = self.proc.memory_info().rss
            self.peak_rss = self.base
            self.stop = threading.Event()
            self.sampler = threading.Thread(target=self._sample, daemon=True)
            self.sampler.start()
        self.start = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.seconds = time.perf_counter() - self.start
            self.delta = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.seconds = time.perf_counter() - self.start
            self.stop.set()
            self.sampler.join()
            self.delta = max(self.peak_rss, self.proc.memory_info().rss) - self.base


def worker(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    policy, job = build(args, device)
    saved = SavedBytes(policy.model)
    with PeakMemory(device) as peak, torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        update(policy, job, args.mode)
    params = sum(p.numel() for p in policy.model.parameters())
    return {
        "mode": args.mode,
        "params": params,
        "saved_mib": saved.peak / MIB,
        "peak_mib": peak.delta / MIB,
        "seconds": peak.seconds,
    }


def flags(args: argparse.Namespace, keys) -> list[str]:
    """The command-line flags of ``args``'s fields in ``keys`` (and the device), for a worker process."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in keys or k == "device"]


def run_preset(args: argparse.Namespace) -> None:
    command = [sys.executable, __file__, *flags(args, PRESETS["tiny"])]
    sides = {mode: lambda mode=mode: harness.run_json([*command, "--worker", mode], args.threads) for mode in MODES}
    alt = harness.alternate(sides, args.rounds)
    policy, job = build(args, torch.device(args.device))
    grads = {mode: update(policy, job, mode) for mode in MODES}
    scale = max(float(a.abs().max()) for a in grads["batched"])
    diffs = [max(float((a - b).abs().max()) for a, b in zip(grads[m], grads["batched"])) for m in MODES]
    labels = {"saved_mib": "saved activations (MiB)", "peak_mib": "peak delta (MiB)", "seconds": "seconds"}
    header, rows = harness.compare(alt, labels, reference="batched")
    rows.append(["max abs grad diff vs batched", *(f"{d:.1e}" for d in diffs), "", ""])
    params = alt.values("batched", "params")[0]
    title = (
        f"{args.arch} n_layer={args.n_layer} n_embd={args.n_embd}: {params / 1e6:.2f}M params, {args.samples} "
        f"samples (groups of {args.group} sharing a prompt) x ({args.prompt} prompt + {args.tokens} completion) "
        f"tokens, {args.device}, {args.threads} thread(s)"
    )
    notes = [alt.note(), f"largest gradient entry {scale:.3e}"]
    name = f"memory-{args.arch}-{args.n_layer}x{args.n_embd}"
    harness.report(args.results, name, title, header, rows, alt.to_json(), notes)


def build_vocab_case(args: argparse.Namespace, device: torch.device) -> tuple[Policy, Generation, torch.Tensor]:
    """The narrow Qwen2 policy with a 151,936-token vocabulary, a batch of random ids and advantages."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from textzoo.models.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=4 * args.n_embd,
        num_hidden_layers=args.n_layer, num_attention_heads=args.n_head, num_key_value_heads=args.n_head,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    policy = Policy(model.to(device), tokenizer)
    g = torch.Generator().manual_seed(0)
    S, P, C = args.samples, args.prompt, args.tokens
    prompts = torch.randint(3, args.vocab, (S // args.group, P), generator=g)  # [S/G, P]
    gen = Generation(
        prompt_ids=prompts.repeat_interleave(args.group, 0).to(device),  # [S, P]
        prompt_mask=torch.ones(S, P, dtype=torch.long, device=device),
        completion_ids=torch.randint(3, args.vocab, (S, C), generator=g).to(device),  # [S, C]
        completion_mask=torch.ones(S, C, dtype=torch.long, device=device),
        logprobs=torch.zeros(S, C, device=device),
    )
    return policy, gen, torch.randn(S, generator=g).to(device)


def logits_pass(policy: Policy, gen: Generation, advantages: torch.Tensor, phase: str, mode: str):
    """One scoring pass (``phase`` "score", no gradients) or forward + backward ("train") of the
    batch, with all logits at once (``mode`` "naive") or in chunks; the log-probs and gradients."""
    policy.logits_chunk = 0 if mode == "naive" else sampling.LOGITS_CHUNK
    policy.model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(phase == "train"):
        logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)  # [S, C]
        if phase == "train":
            (-(logp.sum(1) * advantages).sum()).backward()
    grads = [p.grad.detach().clone() for p in policy.model.parameters() if p.grad is not None]
    return logp.detach(), grads


def logits_worker(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    policy, gen, advantages = build_vocab_case(args, device)
    phase, mode = args.worker_logits.split(":")
    with PeakMemory(device) as peak:
        logits_pass(policy, gen, advantages, phase, mode)
    return {"run": args.worker_logits, "peak_mib": peak.delta / MIB, "seconds": peak.seconds}


def run_vocab_case(args: argparse.Namespace) -> None:
    command = [sys.executable, __file__, *flags(args, QWEN_VOCAB)]
    env = {"MALLOC_MMAP_THRESHOLD_": str(MIB)}
    sides = {
        run: lambda run=run: harness.run_json([*command, "--worker-logits", run], args.threads, env)
        for run in LOGITS_RUNS
    }
    alt = harness.alternate(sides, args.rounds)
    policy, gen, advantages = build_vocab_case(args, torch.device(args.device))
    S, C, V = args.samples, args.tokens, args.vocab
    title = (
        f"Qwen vocabulary: V={V}, qwen2 n_layer={args.n_layer} n_embd={args.n_embd}, {S} samples x ({args.prompt} "
        f"prompt + {C} completion) tokens, {args.device}, {args.threads} thread(s); all logits in float32: "
        f"{S * C * V * 4 / MIB:.0f} MiB; chunks of {sampling.LOGITS_CHUNK // V} positions"
    )
    header = ["pass", "naive peak (MiB)", "chunked peak (MiB)", "chunked / naive", "naive s", "chunked s",
              "max abs log-prob diff", "max abs grad diff (largest grad entry)"]  # fmt: skip
    rows = []
    for phase in ("score", "train"):
        naive_logp, naive_grads = logits_pass(policy, gen, advantages, phase, "naive")
        chunked_logp, chunked_grads = logits_pass(policy, gen, advantages, phase, "chunked")
        logp_diff = float((naive_logp - chunked_logp).abs().max())
        grads = "n/a"
        if phase == "train":
            diff = max(float((a - b).abs().max()) for a, b in zip(naive_grads, chunked_grads))
            grads = f"{diff:.1e} ({max(float(g.abs().max()) for g in naive_grads):.2e})"
        naive, chunked = f"{phase}:naive", f"{phase}:chunked"
        rows.append([
            "scoring (no grad)" if phase == "score" else "forward + backward",
            alt.spread(naive, "peak_mib").format(), alt.spread(chunked, "peak_mib").format(),
            alt.ratio("peak_mib", chunked, naive).format("x"),
            alt.spread(naive, "seconds").format(), alt.spread(chunked, "seconds").format(),
            f"{logp_diff:.1e}", grads,
        ])  # fmt: skip
    harness.report(args.results, "memory-qwen-vocab", title, header, rows, alt.to_json(), [alt.note()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--preset", choices=[*PRESETS, "qwen-vocab", "all"], default=None, help="default: all, unless sizes are given"
    )
    parser.add_argument("--arch", default="gpt2", choices=["gpt2", "llama", "qwen2"])
    parser.add_argument("--n-layer", type=int)
    parser.add_argument("--n-embd", type=int)
    parser.add_argument("--n-head", type=int)
    parser.add_argument("--samples", type=int, help="B*G samples in the update")
    parser.add_argument("--group", type=int, help="G: samples per prompt (samples must be a multiple)")
    parser.add_argument("--prompt", type=int, help="prompt tokens per sample")
    parser.add_argument("--tokens", type=int, help="completion tokens per sample")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB["vocab"], help="vocabulary of the qwen-vocab case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each measuring process")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the modes (median and range)")
    parser.add_argument("--results", default="", help="also write dated results entries (markdown, JSON) here")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--worker-logits", choices=LOGITS_RUNS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds takes 1 or more")
    harness.setup(args.threads)
    custom = {k: getattr(args, k) for k in PRESETS["tiny"] if k != "arch" and getattr(args, k) is not None}
    common = {k: getattr(args, k) for k in ("device", "threads", "rounds", "results")}
    vocab_case = argparse.Namespace(**{**QWEN_VOCAB, **custom, "vocab": args.vocab, **common})
    if args.worker_logits:
        vocab_case.worker_logits = args.worker_logits
        print(json.dumps(logits_worker(vocab_case)))
        return
    if args.worker:
        args.mode = args.worker
        print(json.dumps(worker(args)))
        return
    if args.preset == "qwen-vocab":
        run_vocab_case(vocab_case)
        return
    everything = args.preset in (None, "all") and not custom
    for name in list(PRESETS) if everything else [args.preset or "small"]:
        preset = {**PRESETS[name], **custom}
        if custom:
            preset["arch"] = args.arch
        run_preset(argparse.Namespace(**preset, **common))
    if everything:
        run_vocab_case(vocab_case)


if __name__ == "__main__":
    main()
