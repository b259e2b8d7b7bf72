"""The Relay-v0 recipe (benchmarks/relay_recipe.py), shortened and seeded: the team learns the code."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from textzoo.errors import ConfigError

torch.set_num_threads(1)

RECIPE = Path(__file__).resolve().parents[1] / "benchmarks" / "relay_recipe.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("relay_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_code_is_unrelated_to_the_symbols_and_pairs_cover_every_item():
    recipe = load_recipe()
    from textzoo.envs import make

    env = make(recipe.ENV, split="all")
    code = recipe.relay_code(env.symbols, 2, seed=0)
    assert sorted(code) == env.symbols and len(set(code.values())) == 4
    assert all(len(w) == 2 and w.islower() and not set(w) & set("abcd") for w in code.values())
    pairs = recipe.warmup_pairs(env, code)
    assert len(pairs) == env.num_items() == 20
    assert ("Secret: C\nSend a short message so your partner can tell the secret.\nMessage:", code["C"]) in pairs
    many = recipe.relay_code([f"S{i}" for i in range(30)], 2, seed=0)  # more letters than the alphabet has
    assert len(set(many.values())) == 30 and all("s" not in w for w in many.values())
    with pytest.raises(ConfigError, match="code_len=1"):
        recipe.relay_code([f"S{i}" for i in range(30)], 1, seed=0)


def test_short_recipe_rises_clearly_above_chance(tmp_path):
    recipe = load_recipe()
    # Two symbols and a slow sender learn within a CI budget; the full recipe (4 symbols) is the benchmark.
    args = recipe.RecipeArgs(symbols=2, steps=70, sender_lr=1e-4, eval_every=0, seed=0, run_dir=str(tmp_path / "run"))
    result = recipe.run(args)
    assert result["sft_losses"][-1] < 0.2 and result["code_kept_before"] == 1.0
    rewards = [row["reward/mean"] for row in result["history"] if row["step"] > 0]
    chance = 1 / args.symbols
    means = [sum(rewards[i - 10 : i]) / 10 for i in range(10, len(rewards) + 1)]  # 10-step moving averages
    start, best, end = means[0], max(means), means[-1]
    assert start < chance + 0.1, f"the receiver should start near chance ({chance}), got {start:.2f}"
    # Short runs oscillate once the receiver reads the code, so the peak carries the claim; the end
    # must still be well above chance.
    assert best > 0.75 and end > chance + 0.1, f"reward {start:.2f} -> best {best:.2f} -> end {end:.2f}"
    assert (tmp_path / "run" / "curve.png").is_file() and (tmp_path / "run" / "sender-sft" / "config.json").is_file()
