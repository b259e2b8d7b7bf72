"""benchmarks/real_teams.py without training: each cell's config, the bootstrap interval against values
worked out by hand, the report's row from result files, and the skip of a cell whose result is present."""

import dataclasses
import json
from pathlib import Path

import pytest
import tyro
from helpers import load_benchmark

bench = load_benchmark("real_teams")


@pytest.mark.parametrize("cell", bench.CELLS)
def test_each_cell_config_is_its_algorithm_mode_and_the_presets_settings(cell):
    args = bench.Args(runs="runs-x", steps=60)
    algo, mode = cell.split(":")
    for task in ("debate", "refine"):
        env, preset = bench.preset_of(task)
        cfg = bench.cell_config(args, "some-model", task, algo, mode, seed=2, steps=60)
        assert (cfg.env, cfg.algo, cfg.collaboration, cfg.seed, cfg.steps) == (env, algo, mode, 2, 60)
        assert cfg.agent.temperature == preset.temperature and cfg.agent.lora.rank == 16
        assert cfg.reinforce.tree_rollout == (algo == "atgrpo")
        assert cfg.preference.rm_max_tokens == args.max_prompt_tokens  # a joint text whole: a Refine one is ~350
        assert cfg.eval_prompts == 200 and cfg.eval_modes == ("greedy",)
        if mode == "centralized":  # each role's section keeps its decentralized budget
            assert cfg.joint_section_tokens == preset.max_new_tokens and cfg.credit == "shared"
        else:
            budgets = {role: o["max_new_tokens"] for role, o in cfg.agent_overrides.items()}
            assert budgets == preset.max_new_tokens
            assert cfg.credit == ("per_agent" if task == "debate" else "shared")
        assert cfg.run_dir.endswith(f"{task}/{algo}-{mode}-s2")


def test_the_single_agent_row_silences_the_partner():
    cfg = bench.cell_config(bench.Args(), "m", "debate", "magrpo", "decentralized", 0, 1, label="single")
    assert cfg.agent_overrides["debater_1"] == {"max_new_tokens": 1, "trainable": False}
    assert cfg.agent_overrides["debater_0"] == {"max_new_tokens": 48}


def test_the_bootstrap_interval_matches_hand_computed_cases():
    # every item gains exactly 0.25 in every seed: no resample can move the mean
    assert bench.bootstrap_gain([[0.75, 0.25], [0.75, 0.25]], [0.5, 0.0], 200) == pytest.approx((0.25, 0.25))
    # one seed, gains 0 and 1: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5th and 97.5th percentiles of 4,000 resamples are 0 and 1
    assert bench.bootstrap_gain([[0.0, 1.0]], [0.0, 0.0], 4000) == pytest.approx((0.0, 1.0))
    # two seeds, one gaining 0.0 and one 1.0 on both items: the interval spans both
    lo, hi = bench.bootstrap_gain([[0.0, 0.0], [1.0, 1.0]], [0.0, 0.0], 4000)
    assert (lo, hi) == pytest.approx((0.0, 1.0))


def _cell(task, algo, mode, seed, before, after, items):
    return {
        "task": task, "preset": bench.TASKS[task][2], "algo": algo, "mode": mode, "seed": seed, "steps": 60,
        "episodes": 1920, "wall_s": 100 + seed, "eval_items": len(items), "command": f"cmd --seeds {seed} --steps 60",
        "before": {"solved": before, "valid": 1.0}, "after": {"solved": after, "valid": 1.0},
        "curve": [{"step": 0, "solved": before}, {"step": 60, "solved": after}], "items": items,
    }  # fmt: skip


def test_the_report_row_is_the_mean_and_std_of_the_seeds_gains(tmp_path):
    results = tmp_path / "real-teams"
    results.mkdir()
    team = {"solved": 0.5, "valid": 1.0, "items": [0.5, 0.5], "eval_items": 2, "wall_s": 3}
    ref = {"task": "debate", "preset": "sums-30", "untrained-team": team, "untrained-joint": team}
    (results / "debate-reference.json").write_text(json.dumps(ref))
    for seed, after in ((0, 0.7), (1, 0.9)):  # gains 0.2 and 0.4: mean 0.3, std 0.1414
        cell = _cell("debate", "magrpo", "decentralized", seed, 0.5, after, [after, after])
        (results / f"debate-magrpo-decentralized-s{seed}.json").write_text(json.dumps(cell))
    table = bench.report(bench.Args(results=str(results), bootstrap=500))
    (row,) = [line for line in table.splitlines() if "magrpo decentralized" in line]
    assert "| 0, 1 | 2 | 0.500 -> 0.800 | +0.300 ± 0.141 | [+0.200, +0.400] | valid 1.00 | 60 | 1920 |" in row
    assert row.endswith("| 100, 101 | `cmd --seeds 0 1 --steps 60` |")  # each seed's seconds, one command
    assert "| untrained team | - | 2 | 0.500 |" in table
    assert (results / "curves-debate.png").stat().st_size > 0
    (results / "debate-magrpo-decentralized-s1.json").unlink()  # one seed has no std: the row says so
    (row,) = [ln for ln in bench.report(bench.Args(results=str(results))).splitlines() if "magrpo decentralized" in ln]
    assert "| 0 | 2 | 0.500 -> 0.700 | +0.200 (one seed: no std) |" in row


def test_the_report_names_the_machine_of_each_seeds_seconds(tmp_path):
    results = tmp_path / "real-teams"
    results.mkdir()
    amx = "2026-12-07, commit abc1234, Xeon (amx_bf16, avx2), 2 cores, torch 2.13.0+cpu, 1-minute load 0.81"
    plain = "2026-12-06, commit def5678 + uncommitted changes, Xeon (avx2), 2 cores, torch 2.13.0+cpu, 1-minute load 2"
    team = {"solved": 0.5, "items": [0.5, 0.5], "eval_items": 2, "wall_s": 3}
    ref = {"task": "debate", "preset": "sums-30", "host": plain, "untrained-team": team}
    (results / "debate-reference.json").write_text(json.dumps(ref))
    for seed, host in ((0, plain), (1, amx), (2, plain)):
        cell = {**_cell("debate", "magrpo", "decentralized", seed, 0.5, 0.7, [0.7, 0.7]), "host": host}
        (results / f"debate-magrpo-decentralized-s{seed}.json").write_text(json.dumps(cell))
    table = bench.report(bench.Args(results=str(results), bootstrap=50))
    assert "| 0 | 0 | 3 (a) | (evaluation only) |" in table  # the reference row's machine is the file's
    (row,) = [line for line in table.splitlines() if "magrpo decentralized" in line]
    assert "| 100 (a), 101 (b), 102 (a) |" in row  # a date, commit or load apart is the same machine
    assert table.endswith(
        "Seconds measured on: (a) Xeon (avx2), 2 cores, torch 2.13.0+cpu; (b) Xeon (amx_bf16, avx2), 2 cores, "
        "torch 2.13.0+cpu"
    )


def test_a_cell_whose_result_is_present_is_skipped(tmp_path, capsys):
    results = tmp_path / "real-teams"
    results.mkdir()
    (results / "debate-magrpo-decentralized-s0.json").write_text("{}")
    args = tyro.cli(bench.Args, args=["--tasks", "debate", "--cells", "magrpo:decentralized", "--seeds", "0",
                                      "--no-references", "--results", str(results), "--model", "m"])  # fmt: skip
    bench.main(args)  # no model is built: the one cell asked for is done
    assert "done already" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown task"):
        bench.main(tyro.cli(bench.Args, args=["--tasks", "chess", "--model", "m"]))


def test_a_cell_starts_from_its_modes_reference_row(tmp_path, monkeypatch):
    """A cell leaves its step-0 evaluation to the reference row of its mode when that row measured the same
    number of items, and its result's curve starts there; without one it evaluates at its start."""
    import torch

    import textzoo.runners.trainer

    results = tmp_path / "real-teams"
    results.mkdir()
    team = {"solved": 0.3, "valid": 0.99, "agreement": 0.9, "items": [0.0, 1.0], "eval_items": 2, "wall_s": 3}
    joint = {**team, "solved": 0.4}
    ref = {"task": "debate", "preset": "sums-30", "untrained-team": team, "untrained-joint": joint}
    (results / "debate-reference.json").write_text(json.dumps(ref))
    args = bench.Args(results=str(results), runs=str(tmp_path / "runs"), eval_prompts=2, steps=2, eval_every=0)
    assert bench.untrained_row(args, "debate", "decentralized") == {"solved": 0.3, "valid": 0.99, "agreement": 0.9}
    assert bench.untrained_row(args, "debate", "centralized")["solved"] == 0.4
    assert bench.untrained_row(bench.Args(results=str(results), eval_prompts=200), "debate", "centralized") is None

    line = {"now": "2026-12-08, commit aaa1111, Xeon"}  # the host line, which a commit during the run changes
    monkeypatch.setattr(bench.harness, "host_line", lambda: line["now"])

    class Run:  # what run_cell reads of a finished Trainer; the trainer's own skip is test_runner's
        def __init__(self, cfg, resume):
            self.cfg, self.step, self.resumed_step, self.stopped_by = cfg, 0, None, None
            self.rollouts = {"eval/greedy": type("R", (), {"reward_terms": {"solved": torch.tensor([[1.0], [1.0]])}})}

        def train(self):
            rows = [{"step": s, "reward/solved": 0.5, "time/step": 1.5} for s in (1, 2)]
            rows[-1].update({"eval/greedy/reward/solved": 1.0, "eval/greedy/reward/valid": 1.0})
            if self.cfg.eval_at_start:
                rows.insert(0, {"step": 0, "eval/greedy/reward/solved": 0.25, "eval/greedy/reward/valid": 1.0})
            run = Path(self.cfg.run_dir)
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            self.step = self.cfg.steps
            line["now"] = "2026-12-08, commit bbb2222, Xeon"
            return rows

    monkeypatch.setattr(textzoo.runners.trainer, "Trainer", Run)
    out = bench.run_cell(args, "m", "debate", "magrpo:decentralized", 0)
    assert out["curve"][0] == {"step": 0, "solved": 0.3, "valid": 0.99, "agreement": 0.9} == out["before"]
    assert out["before_from"] == "debate-reference.json" and [p["step"] for p in out["curve"]] == [0, 2]
    assert out["step_s"] == 3  # the steps' time/step, summed over every call that trained the cell
    assert out["host"] == "2026-12-08, commit aaa1111, Xeon"  # the code the cell ran, not the one at its end

    class Finished(Run):  # resumed at its last step: it trains nothing, so run_cell evaluates the weights
        def __init__(self, cfg, resume):
            super().__init__(cfg, resume)
            self.step, self.resumed_step, self.evaluated = cfg.steps, cfg.steps, self.rollouts
            self.rollouts = {}

        def train(self):
            return []

        def evaluate(self):
            self.rollouts.update(self.evaluated)
            return {
                "eval/greedy/reward/solved": 1.0,
                "eval/greedy/reward/valid": 1.0,
                "eval/greedy/reward/on_topic": 0.5,
            }

    monkeypatch.setattr(textzoo.runners.trainer, "Trainer", Finished)
    again = bench.run_cell(args, "m", "debate", "magrpo:decentralized", 0)
    assert again["resumed_from_step"] == 2 and again["items"] == out["items"]
    assert again["after"] == {**out["after"], "on_topic": 0.5}  # the terms of the evaluation it ran
    monkeypatch.setattr(textzoo.runners.trainer, "Trainer", Run)
    (results / "debate-reference.json").unlink()  # no reference: the cell measures its own step 0
    out = bench.run_cell(
        dataclasses.replace(args, runs=str(tmp_path / "runs2")), "m", "debate", "magrpo:decentralized", 0
    )
    assert out["before"] == {"step": 0, "solved": 0.25, "valid": 1.0} and out["before_from"] == "run"


def test_rescore_adds_the_terms_a_result_lacks_and_refuses_changed_scores(tmp_path, monkeypatch):
    import torch

    import textzoo.runners.trainer

    results = tmp_path / "real-teams"
    results.mkdir()
    cell = _cell("refine", "magrpo", "decentralized", 0, 0.3, 1.0, [1.0, 1.0])
    cell["after"] = cell["curve"][-1] = {"step": 60, "solved": 1.0}
    path = results / "refine-magrpo-decentralized-s0.json"
    path.write_text(json.dumps(cell))
    scores = {"team": torch.tensor([[1.0], [1.0]])}

    class Run:  # a finished run's final checkpoint, evaluated again
        def __init__(self, cfg):
            assert not cfg.eval_at_start
            self.rollouts = {"eval/greedy": type("R", (), {"reward_terms": scores})}

        def load_final_weights(self):
            return 60

        def evaluate(self):
            return {"eval/greedy/reward/team": 1.0, "eval/greedy/reward/on_topic": 0.25}

    monkeypatch.setattr(textzoo.runners.trainer, "Trainer", Run)
    args = bench.Args(results=str(results), runs=str(tmp_path / "runs"), tasks=["refine"], seeds=[0])
    bench.rescore(args, "m", "refine")
    out = json.loads(path.read_text())
    assert out["after"] == out["curve"][-1] == {"step": 60, "solved": 1.0, "on_topic": 0.25}
    assert out["items"] == [1.0, 1.0] and out["curve"][0] == cell["curve"][0]
    scores["team"] = torch.tensor([[1.0], [0.0]])  # evaluated again, one item differs: nothing is written
    with pytest.raises(SystemExit, match="1 of 2 item scores changed"):
        bench.rescore(args, "m", "refine")
    assert json.loads(path.read_text()) == out
