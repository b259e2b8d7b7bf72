"""samples.jsonl: prompts as sent, completions and rewards that replay to the logged rewards; joint and
multi-turn rows; TensorBoard text; exact after a resume; `textzoo eval --show`."""

import dataclasses
import importlib.util
import json
import shutil

import features
import pytest
import torch
from helpers import tiny_config
from rich.console import Console

from textzoo.config import TrainConfig
from textzoo.envs import make
from textzoo.runners.cli import main as cli_main
from textzoo.runners.samples import episodes, read_samples, samples_markdown, samples_table
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)

CFG = tiny_config(env="textzoo/Writing-v0", log_completions=3, threads=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("samples") / "run"
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(run_dir), save_every=1, report_to=("tensorboard",)))
    trainer.train()
    return run_dir, trainer


def test_each_step_logs_its_episodes_and_each_evaluation_its_held_out_ones(run):
    run_dir, _ = run
    rows = read_samples(run_dir / "samples.jsonl")
    where = [(r["step"], r["split"]) for r in rows]
    assert where == (
        [(0, "eval/greedy")] * 2 + [(0, "eval/sampled")] * 2 + [(1, "train")] * 3
        + [(2, "train")] * 3 + [(2, "eval/greedy")] * 2 + [(2, "eval/sampled")] * 2
    )  # fmt: skip
    train = [r for r in rows if r["split"] == "train"]
    assert [(r["sample"], r["turn"]) for r in train[:3]] == [(0, 0), (0, 0), (1, 0)]  # sample 0 of each prompt first
    assert all(set(r["roles"]) == {"summary", "elaboration"} and not r["parse_failed"] for r in rows)


def test_logged_prompts_are_the_observations_and_completions_replay_to_the_logged_rewards(run):
    run_dir, _ = run
    for row in read_samples(run_dir / "samples.jsonl"):
        env = make("textzoo/Writing-v0", split="eval" if row["split"].startswith("eval") else "train")
        obs, _ = env.reset(seed=0, options={"index": row["item"]})
        roles = row["roles"]
        assert {r: e["prompt"] for r, e in roles.items()} == obs  # raw byte prompts: the observation exactly
        _, rewards, _, _, infos = env.step({r: e["completion"] for r, e in roles.items()})
        for r, entry in roles.items():
            assert entry["reward"] == pytest.approx(rewards[r], abs=1e-6)
            assert entry["reward_terms"] == pytest.approx(infos[r]["reward_terms"])
        assert row["reward"] == pytest.approx(sum(rewards.values()) / len(rewards), abs=1e-6)


def test_rows_hold_the_sampled_completions(run):
    _, trainer = run
    rollout = trainer.rollouts["train"]
    rows = read_samples(trainer.run_dir / "samples.jsonl", "train")[-3:]
    for row, e in zip(rows, episodes(rollout, 3)):
        for s in rollout.steps:
            row_of = s.env_ids.tolist().index(e)
            assert row["roles"][s.actor]["completion"] == s.gen.texts[row_of]


def test_tensorboard_gets_the_samples_as_text(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert {"samples/train/text_summary", "samples/eval/greedy/text_summary"} <= set(acc.Tags()["tensors"])
    events = acc.Tensors("samples/train/text_summary")
    assert [e.step for e in events] == [1, 2]
    text = events[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| item | turn | role | prompt | completion |") and "Summarize the text" in text


def test_a_resumed_run_writes_the_same_samples(run, tmp_path):
    run_dir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000002")
    Trainer(dataclasses.replace(CFG, run_dir=str(copy), save_every=1), resume=copy).train()
    assert (copy / "samples.jsonl").read_text() == (run_dir / "samples.jsonl").read_text()


def test_joint_rows_hold_the_joint_completion_and_each_roles_action(tmp_path):
    cfg = dataclasses.replace(CFG, steps=1, collaboration="centralized", log_completions=2, run_dir=str(tmp_path))
    trainer = Trainer(cfg)
    trainer.train()
    rows = read_samples(tmp_path / "samples.jsonl", "train")
    assert len(rows) == 2
    for row in rows:
        summary, elaboration = row["roles"]["summary"], row["roles"]["elaboration"]
        assert summary["actor"] == elaboration["actor"] == "joint"
        assert summary["completion"] == elaboration["completion"] and summary["prompt"] == elaboration["prompt"]
        # as sent: the first role's task (the tags and the elaboration task are forced tokens of the completion)
        assert summary["prompt"].startswith('<task role="summary">') and summary["prompt"].endswith("</task>")
        assert summary["completion"].startswith("<summary>") and not row["parse_failed"]
        parsed, failed = trainer.actors[0].parse(summary["completion"], ("summary", "elaboration"))
        assert (summary["action"], elaboration["action"], row["parse_failed"]) == (
            parsed["summary"], parsed["elaboration"], failed
        )  # fmt: skip
    assert "| joint" not in samples_markdown(rows)  # roles, not the actor, label the lines
    console = Console(record=True, width=200)
    console.print(samples_table(rows))
    shown = console.export_text()
    assert "elaboration" in shown and ("(parse failed)" in shown) == any(r["parse_failed"] for r in rows)


def test_multi_turn_rows_are_one_per_turn_with_the_roles_that_acted(tmp_path):
    cfg = dataclasses.replace(CFG, env="textzoo/Relay-v0", steps=1, log_completions=1, run_dir=str(tmp_path))
    Trainer(cfg).train()
    rows = read_samples(tmp_path / "samples.jsonl", "train")
    assert [(r["turn"], sorted(r["roles"])) for r in rows] == [(0, ["sender"]), (1, ["receiver"])]
    assert rows[1]["roles"]["receiver"]["prompt"].startswith("Message: ")


def test_no_samples_when_turned_off(tmp_path):
    Trainer(dataclasses.replace(CFG, steps=1, log_completions=0, run_dir=str(tmp_path))).train()
    assert not (tmp_path / "samples.jsonl").exists()
    with pytest.raises(ValueError, match="log_completions"):
        TrainConfig(log_completions=-1)


def test_eval_show_prints_held_out_completions(run, capsys):
    run_dir, _ = run
    assert cli_main(["eval", "--run-dir", str(run_dir), "--prompts", "2", "--show", "2"]) == 0
    out, err = capsys.readouterr()
    assert "eval/greedy/reward/mean" in json.loads(out)
    assert "held-out completions" in err and "elaboration" in err and "summary" in err


@features.requires("tracking", importlib.util.find_spec("wandb") is not None, "wandb is not installed")
def test_wandb_gets_a_samples_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    Trainer(dataclasses.replace(CFG, steps=1, report_to=("wandb",), run_dir=str(tmp_path))).train()
    assert list(tmp_path.glob("wandb/offline-run-*/files/media/table/samples/train*.table.json"))
