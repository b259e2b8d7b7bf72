"""Pinned training steps: fixed seeds give these exact losses, metrics and weights, one case per algorithm.

Each case trains a tiny two-agent team on the default task for two seeded steps in fp32 on CPU and
compares every metric the steps logged (losses, gradient norms, KL, rewards, critic values, DPO
margins, reward-model fits; `time/*` aside) and a checksum of every trained model's weights with
``tests/data/loss_pins.json``. How the pins were derived: `_record` below (this file's ``__main__``)
run by the code as it stood before issue 24's redesign, on randomly initialised tiny GPT-2s, so they are
regression pins, not hand values (the equations have those in test_rlmath.py). A refactor that moves
code between files must keep them: a mismatch means it changed what is learned. One pinned value is
also derived independently of the training code (`test_the_pinned_grpo_loss_is_the_objective_in_float64`):
MAGRPO's first loss and advantage size, from the step's rewards and the initial model run in float64.

When a change is meant to alter training (a fixed bug, a new default), regenerate the pins
(``python tests/test_loss_pins.py``) in the same commit and say in its message which cases moved and
why. A metric that was renamed or removed fails here too: re-pin and say so. New metrics are not
checked until the pins are rewritten.
"""

import json
import math
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from textzoo.config import AgentConfig, PreferenceConfig, ReinforceConfig, TrainConfig
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)

PINS = Path(__file__).parent / "data" / "loss_pins.json"
ALGOS = ("magrpo", "marloo", "maremax", "mareinforce", "atgrpo", "iac", "maac", "ippo", "mappo", "madpo", "marlhf")
STEPS = 2
# Tolerances: what differs between CPUs (AVX2 vs AVX-512 matmul kernels sum in other orders), measured on
# an AVX2-only EPYC against pins written on an AVX-512 one, with ~3x or more room: weights' checksums
# within 2.1e-7 relative; metrics within 9e-5 relative or 3.8e-6 absolute (a loss is a float32 sum of
# terms that cancel); a Bradley-Terry reward model's reward level (its loss is blind to a shift) 1.3e-3.
WEIGHTS_REL = 1e-6
REL, ABS = 3e-4, 2e-5
RM_LEVEL_ABS = 1e-2
RM_LEVELS = ("reward/rm", "reward/mean")
"""Metrics that read a reward model's level (with the per-role `role/<role>/reward*`), where it rewards."""


# where the shared set-up would leave a case's own code idle:
CASES = {
    # the tiny model's greedy completions score 0 on the default task, which makes ReMax's baseline 0
    # (= REINFORCE's): restricted outputs give the greedy rollout a reward
    "maremax": {"agent": AgentConfig(max_new_tokens=6, precision="fp32", allowed_outputs=("the cat sat",))},
    # one turn makes AT-GRPO's (state, agent, turn) groups MAGRPO's: a two-turn debate on a tree rollout
    "atgrpo": {"env": "textzoo/Debate-v0", "env_kwargs": {"turns": 2}, "reinforce": ReinforceConfig(tree_rollout=True)},
    # early stopping keeps the untrained reward model at this size (equal rewards, no RL signal)
    "marlhf": {"preference": PreferenceConfig(rm_early_stopping=False, rm_epochs=2)},
}


def _config(algo: str) -> TrainConfig:
    return TrainConfig(
        **{
            "algo": algo,
            "steps": STEPS,
            "batch_prompts": 2,
            "group_size": 2,
            "seed": 3,
            "threads": 1,
            "progress": False,
            "plot": False,
            "eval_prompts": 1,
            "log_completions": 0,
            "agent": AgentConfig(max_new_tokens=6, precision="fp32"),
            **CASES.get(algo, {}),
        }
    )


def _checksum(module: torch.nn.Module) -> list[float]:
    """Sum, sum of squares and a position-weighted sum of every weight, in float64."""
    total = squares = weighted = 0.0
    for p in module.parameters():
        x = p.detach().double().flatten()
        total += x.sum().item()
        squares += x.square().sum().item()
        weighted += (x * torch.arange(1, x.numel() + 1, dtype=torch.float64).reciprocal()).sum().item()
    return [total, squares, weighted]


def _record(algo: str) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(_config(algo), run_dir=run_dir)
        rows = [trainer.train_step() for _ in range(STEPS)]
        trainer.collector.close()
    metrics = [{k: float(v) for k, v in row.items() if not k.startswith("time/")} for row in rows]
    weights = {name: _checksum(learner.model) for name, learner in trainer.learners.items()}
    return {"metrics": metrics, "weights": weights}


def _close(got: float, want: float, rel: float = REL, abs_tol: float = ABS) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)


def _metric_close(algo: str, key: str, got: float, want: float) -> bool:
    """`_close`, with a reward model's reward level (marlhf) to `RM_LEVEL_ABS`: its spread is pinned tightly."""
    per_role = key.startswith("role/") and key.endswith(("/reward", "/reward/rm"))
    level = algo == "marlhf" and (key in RM_LEVELS or per_role)
    return _close(got, want, abs_tol=RM_LEVEL_ABS) if level else _close(got, want)


@pytest.mark.parametrize("algo", ALGOS)
def test_training_steps_match_pins(algo):
    want = json.loads(PINS.read_text())[algo]
    got = _record(algo)
    for step, (got_row, want_row) in enumerate(zip(got["metrics"], want["metrics"], strict=True), 1):
        missing = sorted(set(want_row) - set(got_row))
        assert not missing, f"{algo} step {step}: metrics no longer logged: {missing}"
        off = {k: (got_row[k], v) for k, v in want_row.items() if not _metric_close(algo, k, got_row[k], v)}
        assert not off, f"{algo} step {step}: (got, pinned) {off}"
    assert sorted(got["weights"]) == sorted(want["weights"]), f"{algo}: trained models changed"
    for name, sums in want["weights"].items():
        close = [_close(g, w, rel=WEIGHTS_REL, abs_tol=0.0) for g, w in zip(got["weights"][name], sums, strict=True)]
        assert all(close), f"{algo} {name}: weights {got['weights'][name]} != {sums}"


def test_the_pinned_grpo_loss_is_the_objective_in_float64():
    """MAGRPO's pinned step-1 loss and mean |advantage| of each agent, derived again outside the trainer:
    A_s = (R_s − mean of its group's R) / (unbiased std + 1e-6) from the episodes' team rewards, log-probs
    of each sampled completion from the initial weights run in float64 on the whole unpadded sequence,
    loss = −Σ_s A_s Σ_t log π(c_st) / S (seq_sum, on-policy)."""
    import copy

    pinned = json.loads(PINS.read_text())["magrpo"]["metrics"][0]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(_config("magrpo"), run_dir=run_dir)
        initial = {a.id: copy.deepcopy(a.policy.model).double().eval() for a in trainer.actors}
        trainer.train_step()
        trainer.collector.close()
    rollout = trainer.rollouts["train"]
    G = rollout.group_size
    for actor in trainer.actors:
        samples = rollout.samples(actor.id, actor.policy.pad_id)
        gen = samples.gen
        rewards = rollout.team_rewards[:, 0].double()  # [E]: every role of Writing-v0 gets the team reward
        groups = rewards.view(-1, G)
        mean, std = groups.mean(1), groups.std(1, unbiased=True)
        e = samples.env_ids
        adv = (rewards[e] - mean[e // G]) / (std[e // G] + 1e-6)  # [S]
        logp = []
        for s in range(len(gen)):
            prompt = gen.prompt_ids[s][gen.prompt_mask[s].bool()].tolist()
            completion = gen.completion_ids[s][gen.completion_mask[s].bool()].tolist()
            with torch.no_grad():
                logits = initial[actor.id](torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            logp.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).sum())
        loss = -(adv * torch.stack(logp)).sum() / len(gen)
        assert float(adv.abs().mean()) == pytest.approx(pinned[f"agent/{actor.id}/advantage_abs"], rel=1e-5)
        assert float(loss) == pytest.approx(pinned[f"agent/{actor.id}/loss"], rel=1e-4, abs=1e-6)


if __name__ == "__main__":  # regenerate the pins: only for a change meant to alter training
    names = sys.argv[1:] or ALGOS
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
    pins.update({algo: _record(algo) for algo in names})
    PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS} ({', '.join(names)})")
