"""Recipe: learn textzoo/Relay-v0 with a supervised warm-up of the sender and a restricted receiver.

From random tiny models, plain GRPO stays at chance on Relay: neither side gets a signal until the
other is consistent. The recipe breaks the tie in three steps:
1. pick an arbitrary code, one short lowercase word per symbol, unrelated to the symbol (e.g.
   secret "A" -> message "xq"), so the receiver cannot answer by copying a letter;
2. warm up the sender on (sender prompt, code word) pairs built from the env (`sft`), save it;
3. train the team with the Trainer: the sender loads the saved model, the receiver is restricted to
   the env's symbols (`allowed_outputs`) and learns the code from the team reward alone.

Run:  OMP_NUM_THREADS=1 python benchmarks/relay_recipe.py [--steps 200] [--algo magrpo] [--help]
Prints the warm-up loss, the reward curve (step, reward) and the wall time; writes RUN_DIR with
metrics.jsonl and curve.png.
"""

from __future__ import annotations

import dataclasses
import random
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import tyro

from textzoo.algorithms.reinforce.family import ReinforceConfig
from textzoo.config import AgentConfig, TrainConfig
from textzoo.envs import make
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.runners.sft import Pair, sft
from textzoo.runners.trainer import Trainer

ENV = "textzoo/Relay-v0"


@dataclass
class RecipeArgs:
    """Relay-v0 recipe settings."""

    symbols: int = 4
    """K, the number of secret symbols (chance = 1/K)."""
    code_len: int = 2
    """Characters of each code word."""
    sft_steps: int = 60
    """Supervised warm-up steps of the sender."""
    sft_lr: float = 3e-3
    """Warm-up learning rate."""
    steps: int = 200
    """RL steps of the team."""
    algo: str = "magrpo"
    """Any algorithm `textzoo train` knows. maac solves Relay with the warmed-up sender frozen
    (--no-sender-trainable: greedy eval 1.0 from step 60, 0.97 sampled at 200); with the sender trained
    too its messages drift off the code and the team stays near 0.5."""
    batch_prompts: int = 8
    """Prompts per RL step (B)."""
    group_size: int = 8
    """Samples per prompt (G)."""
    lr: float = 1e-3
    """Receiver learning rate."""
    sender_lr: float = 1e-3
    """Sender learning rate during RL."""
    sender_trainable: bool = True
    """False freezes the warmed-up sender: only the receiver learns."""
    advantage_scale: str = "std"
    """reinforce.advantage_scale: std | none."""
    std_floor: float = 0.0
    """reinforce.std_floor: lower bound on the group std when scaling."""
    kl_coef: float = 0.1
    """reinforce.kl_coef: β of the KL to the initial (warmed-up) weights; it keeps the sender's code."""
    kl_in: str = "loss"
    """reinforce.kl_in: loss | reward. In the reward, the KL differences of an all-fail group are
    scaled up by the tiny group std into full-size advantages (measured: the receiver collapsed)."""
    eval_every: int = 20
    """Held-out evaluation every k steps."""
    seed: int = 0
    """Seed of the code, the models, data order and sampling."""
    run_dir: str = "runs/relay-recipe"
    """Output folder (the warmed-up sender goes to RUN_DIR/sender-sft)."""
    threads: int = 1
    """torch intra-op threads."""
    progress: bool = False
    """Show the trainer's progress bar."""


def relay_code(symbols: list[str], length: int, seed: int) -> dict[str, str]:
    """A random lowercase word per symbol, using no letter of any symbol.

    Words share no letter when the alphabet allows it: a tiny receiver tells apart words with
    disjoint letters much sooner than words that differ in one position.
    """
    rng = random.Random(seed)
    pool = [c for c in string.ascii_lowercase if c not in "".join(symbols).lower()]
    if len(pool) >= length * len(symbols):
        letters = rng.sample(pool, length * len(symbols))
        return {s: "".join(letters[i * length : (i + 1) * length]) for i, s in enumerate(symbols)}
    # Too many symbols for disjoint words: distinct words, each avoiding its own symbol's letters.
    code: dict[str, str] = {}
    for s in symbols:
        letters = [c for c in string.ascii_lowercase if c not in s.lower()]
        if len(letters) ** length <= len(code):
            raise ConfigError(f"code_len={length} is too short for {len(symbols)} distinct code words; raise it")
        word = "".join(rng.choice(letters) for _ in range(length))
        while word in code.values():
            word = "".join(rng.choice(letters) for _ in range(length))
        code[s] = word
    return code


def warmup_pairs(env: Any, code: dict[str, str]) -> list[Pair]:
    """(sender prompt, code word of its secret) for every item of `env`."""
    pairs = []
    for i in range(env.num_items()):
        obs, _ = env.reset(options={"index": i})
        pairs.append((obs["sender"], code[env.secret]))
    return pairs


def code_kept(sender: Policy, pairs: list[Pair]) -> float:
    """Fraction of prompts where the sender's greedy message is still exactly its code word."""
    gen = sender.generate([p for p, _ in pairs], greedy=True)
    return sum(text == word for text, (_, word) in zip(gen.texts, pairs)) / len(pairs)


def train_config(args: RecipeArgs, sender_dir: str, symbols: list[str], code_len: int) -> TrainConfig:
    """The team's TrainConfig: warmed-up sender from `sender_dir`, receiver restricted to `symbols`."""
    answer_tokens = max(len(s.encode()) for s in symbols)  # byte tokenizer: one token per byte
    return TrainConfig(
        env=ENV,
        env_kwargs={"num_symbols": args.symbols},
        algo=args.algo,
        agent=AgentConfig(lr=args.lr),
        agent_overrides={
            "sender": {
                "model": sender_dir,
                "lr": args.sender_lr,
                "max_new_tokens": code_len + 1,
                "trainable": args.sender_trainable,
            },
            # One answer's worth of tokens: a longer output could only spell a non-symbol.
            "receiver": {"allowed_outputs": list(symbols), "max_new_tokens": answer_tokens},
        },
        steps=args.steps,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        seed=args.seed,
        run_dir=args.run_dir,
        overwrite=True,  # a rerun starts over (the warmed-up sender in sender-sft/ is not the run's: it stays)
        eval_every=args.eval_every,
        threads=args.threads,
        progress=args.progress,
        reinforce=ReinforceConfig(
            advantage_scale=args.advantage_scale, std_floor=args.std_floor, kl_coef=args.kl_coef, kl_in=args.kl_in
        ),
    )


def run(args: RecipeArgs) -> dict[str, Any]:
    """Warm up, train, and return the history plus timings and code retention."""
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    env = make(ENV, num_symbols=args.symbols, split="all")
    code = relay_code(env.symbols, args.code_len, args.seed)
    pairs = warmup_pairs(env, code)
    sender = Policy.tiny(seed=args.seed)
    losses = sft(sender, pairs, steps=args.sft_steps, lr=args.sft_lr, batch_size=len(pairs), seed=args.seed)
    kept_before = code_kept(sender, pairs)
    sender_dir = str(Path(args.run_dir) / "sender-sft")
    sender.save_pretrained(sender_dir)
    t_sft = time.perf_counter() - t0

    trainer = Trainer(train_config(args, sender_dir, env.symbols, args.code_len))
    history = trainer.train()
    t_total = time.perf_counter() - t0
    kept_after = code_kept(next(a.policy for a in trainer.actors if a.id == "sender"), pairs)
    return {
        "code": code,
        "sft_losses": losses,
        "history": history,
        "time_sft": t_sft,
        "time_total": t_total,
        "code_kept_before": kept_before,
        "code_kept_after": kept_after,
        "run_dir": str(trainer.run_dir),
    }


def curve(history: list[dict[str, Any]], every: int = 20, window: int = 10) -> list[tuple[int, float, float]]:
    """(step, reward, mean reward of the last `window` steps) at step 1, every `every` steps and the end."""
    rows = [r for r in history if r["step"] > 0]
    out = []
    for i, row in enumerate(rows):
        if row["step"] == 1 or row["step"] % every == 0 or i == len(rows) - 1:
            recent = [r["reward/mean"] for r in rows[max(0, i - window + 1) : i + 1]]
            out.append((row["step"], row["reward/mean"], sum(recent) / len(recent)))
    return out


def main() -> None:
    args = tyro.cli(RecipeArgs, description=__doc__.split("\n\n")[0])
    result = run(args)
    hist = result["history"]
    settings = {k: v for k, v in dataclasses.asdict(args).items() if k not in ("run_dir", "progress", "threads")}
    print(f"settings: {settings}")
    print(f"code: {result['code']}")
    sft_losses = result["sft_losses"]
    print(
        f"sender warm-up: loss {sft_losses[0]:.3f} -> {sft_losses[-1]:.4f} in {len(sft_losses)} steps, "
        f"{result['time_sft']:.1f} s; greedy messages = code on {result['code_kept_before']:.0%} of prompts"
    )
    print(f"chance: {1 / args.symbols:.3f}")
    print(" step  reward  mean10  eval_greedy")
    evals = {r["step"]: r.get("eval/greedy/reward/mean") for r in hist}
    for step, reward, mean in curve(hist):
        ev = evals.get(step)
        print(f"{step:5d}  {reward:6.3f}  {mean:6.3f}  {'' if ev is None else f'{ev:.3f}'}")
    print(f"greedy messages = code at the end on {result['code_kept_after']:.0%} of prompts")
    print(f"wall time: {result['time_total']:.1f} s (warm-up {result['time_sft']:.1f} s)")
    print(f"run dir: {result['run_dir']} (curve.png)")


if __name__ == "__main__":
    main()
