"""The shipped benchmark grids: every cell's config is valid, and the real-model grid runs end to end
with tiny models in place of its model (benchmarks/grid_smoke.py), writing its table and curves."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

from textzoo.runners.bench import load_grid, run_grid, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted((ROOT / "benchmarks" / "grids").glob("*.toml"))


def smoke_module():
    spec = importlib.util.spec_from_file_location("grid_smoke", ROOT / "benchmarks" / "grid_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", GRIDS, ids=[p.stem for p in GRIDS])
def test_every_grid_cell_is_a_valid_config(path):
    grid = load_grid(path)
    assert grid.cells and all(c.config.env == grid.tasks[c.task] for c in grid.cells)


def test_real_model_grid_covers_the_tasks_and_modes():
    grid = load_grid(ROOT / "benchmarks" / "grids" / "cpu-smollm2.toml")
    envs = set(grid.tasks.values())
    assert envs == {"textzoo/Debate-v0", "textzoo/ReasoningGym-v0", "textzoo/PlanPath-v0", "textzoo/Sudoku-v0"}
    assert {(c.algo, c.collaboration) for c in grid.cells} == {
        (algo, mode) for algo in ("magrpo", "atgrpo") for mode in ("decentralized", "centralized")
    }
    assert all(c.config.reinforce.tree_rollout == (c.algo == "atgrpo") for c in grid.cells)
    assert grid.metric == "eval/greedy/reward/solved"
    gpu = load_grid(ROOT / "benchmarks" / "grids" / "gpu-qwen3-1.7b.toml")
    assert {c.config.agent.model for c in gpu.cells} == {"Qwen/Qwen3-1.7B"}
    assert {c.algo for c in gpu.cells} == {"magrpo", "atgrpo"}


def test_real_model_grid_tasks_are_the_presets():
    """Each task of cpu-smollm2.toml has its preset's env arguments and budgets (`PRESETS` of its module)."""
    from textzoo.envs.debate_v0 import PRESETS as DEBATE
    from textzoo.envs.planpath_v0 import PRESETS as PLANPATH
    from textzoo.envs.reasoning_gym_v0 import PRESETS as REASONING_GYM
    from textzoo.envs.sudoku_v0 import PRESETS as SUDOKU

    presets = {
        "debate": DEBATE["one-digit-sums"],
        "chainsum": REASONING_GYM["chain-sum-team"],
        "arithmetic": REASONING_GYM["basic-arithmetic-team"],
        "planpath": PLANPATH["open-4x4"],
        "sudoku": SUDOKU["4x4-2-blanks"],
    }
    grid = load_grid(ROOT / "benchmarks" / "grids" / "cpu-smollm2.toml")
    assert set(grid.tasks) == set(presets)
    for cell in grid.cells:
        preset, cfg = presets[cell.task], cell.config
        assert cfg.env_kwargs == preset.env_kwargs, cell.task
        fields = preset.train_fields(cell.collaboration)
        if cell.collaboration == "centralized":
            assert cfg.joint_max_new_tokens == fields["joint_max_new_tokens"] and cfg.agent_overrides == {}
            assert cfg.credit == "shared"
        else:
            assert cfg.agent_overrides == fields["agent_overrides"], cell.task


def test_real_model_grid_runs_with_tiny_models(tmp_path):
    smoke = smoke_module()
    args = smoke.Args(grid=str(ROOT / "benchmarks" / "grids" / "cpu-smollm2.toml"), out_dir=str(tmp_path), steps=1)
    grid = smoke.tiny_grid(load_grid(args.grid), args)
    keep = {("planpath", "decentralized"), ("debate", "centralized")}
    grid.cells = [c for c in grid.cells if (c.task, c.collaboration) in keep]
    assert all(c.config.agent.model == "tiny" and c.config.agent.lora.rank == 16 for c in grid.cells)
    grid.cells = [c for c in grid.cells if c.algo == "magrpo"]
    assert {c.task for c in grid.cells} == {"planpath", "debate"}
    planpath = next(c for c in grid.cells if c.task == "planpath")
    assert planpath.config.agent_overrides == {"tool": {"max_new_tokens": 16}, "plan": {"max_new_tokens": 16}}
    results = run_grid(grid, log=lambda line: None)
    assert not any("error" in s for s in results.values()), results
    for cell in grid.cells:
        rows = [json.loads(line) for line in (cell.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert (
            rows[0]["step"] == 0 and "eval/greedy/reward/solved" in rows[0] and "eval/greedy/reward/solved" in rows[-1]
        )
    md = write_report(grid, results).read_text()
    assert "## planpath (`textzoo/PlanPath-v0`)" in md and "| magrpo | centralized | 1/1 |" in md
    assert (tmp_path / "curves-debate.png").is_file()


def test_the_smoke_replaces_a_grids_precision_and_legacy_dtype(tmp_path):
    """A grid's bf16 precision (or the legacy dtype it migrated from) becomes fp32 for the tiny models."""
    from textzoo.config import AgentConfig, LoRAConfig, TrainConfig

    smoke = smoke_module()
    args = smoke.Args(grid="unused")
    for agent in (
        AgentConfig(precision="bf16-weights"),
        AgentConfig(precision="bf16-weights", lora=LoRAConfig(rank=4)),
        AgentConfig(precision="bf16-mixed"),
    ):
        cfg = TrainConfig(agent=agent, agent_overrides={"summary": {"precision": "bf16-mixed", "lr": 1e-4}})
        tiny = smoke.tiny_config(cfg, args, tmp_path)
        assert tiny.agent.precision == "fp32"
        assert tiny.agent_config("summary").precision == "fp32" and tiny.agent_config("summary").lr == 1e-4
    legacy = TrainConfig(agent_overrides={"summary": {"dtype": "bfloat16", "lr": 1e-4}})  # an old grid's key
    assert smoke.tiny_config(legacy, args, tmp_path).agent_config("summary").precision == "fp32"


@pytest.mark.parametrize("path", GRIDS, ids=[p.stem for p in GRIDS])
def test_every_grid_smokes_with_tiny_models(path, tmp_path, capsys):
    """benchmarks/grid_smoke.py on each shipped grid: every cell's tiny config is built, and the first cell of
    each algorithm trains one step end to end (the README's check before a real run)."""
    smoke = smoke_module()
    args = smoke.Args(
        grid=str(path), out_dir=str(tmp_path), steps=1, batch_prompts=1, eval_prompts=1, one_per_algo=True
    )
    smoke.main(args)  # exits 1 when a cell fails
    out = capsys.readouterr().out
    assert "results: " in out and (tmp_path / "results.md").is_file()
    algos = {c.algo for c in load_grid(path).cells}
    assert len([line for line in out.splitlines() if line.startswith("grid time")]) == 1
    assert f"({len(algos)} cells, tiny models)" in out
