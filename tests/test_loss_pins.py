"""Pinned training steps: fixed seeds give these exact losses, metrics and weights, one case per algorithm.

Each case trains a tiny two-agent team on the default task for two seeded steps in fp32 on CPU and
compares every metric the steps logged (losses, gradient norms, KL, rewards, critic values, DPO
margins, reward-model fits; `time/*` aside) and a checksum of every trained model's weights with
``tests/data/loss_pins.json``, written by the code as it stood before issue 24's redesign. A
refactor that moves code between files must keep them: a mismatch means it changed what is learned.

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


if __name__ == "__main__":  # regenerate the pins: only for a change meant to alter training
    names = sys.argv[1:] or ALGOS
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
    pins.update({algo: _record(algo) for algo in names})
    PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS} ({', '.join(names)})")
