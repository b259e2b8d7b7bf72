"""Configs and run folders written before the agent's `engine` and `lora` sections still load and resume.

`tests/data/old-layout-run` is a real run folder written by textzoo at commit 1d6a084 (the last one with
flat `engine_*` / `lora_*` / `dtype` fields), by

    textzoo train --run-dir old-layout-run --steps 2 --save-every 1 --keep-last 1 --batch-prompts 2
      --group-size 2 --agent.max-new-tokens 4 --agent.max-prompt-tokens 48 --eval-prompts 2
      --eval-modes greedy --no-plot --no-progress --log-completions 1 --agent.n-layer 1 --agent.n-embd 16
      --agent.n-head 1 --agent.lora-rank 2 --agent.engine-tis-cap 1.5
      --agent-overrides '{"summary": {"lora_alpha": 8.0, "engine_sync_timeout_s": 60.0}}'

so its config.json (and its checkpoint's) hold every old key, an `agent_overrides` entry with old keys
among them, and LoRA adapters as weights. Tests copy it before resuming it.
"""

import json
import logging
import shutil
from pathlib import Path

import pytest

from textzoo import config
from textzoo.config import AgentConfig, EngineConfig, LoRAConfig, TrainConfig, migrate_agent
from textzoo.config_files import from_dict, load_config, save_config
from textzoo.errors import ConfigError

OLD_RUN = Path(__file__).parent / "data" / "old-layout-run"


@pytest.fixture
def old_run(tmp_path) -> Path:
    run = tmp_path / "old-layout-run"
    shutil.copytree(OLD_RUN, run)
    return run


def test_an_old_config_json_loads_into_the_sections(caplog):
    config._deprecated.cache_clear()  # each note is logged once per process: this test reads it afresh
    with caplog.at_level(logging.WARNING, logger="textzoo.config"):
        cfg = load_config(OLD_RUN / "config.json")
    assert cfg.agent.lora == LoRAConfig(rank=2, alpha=16.0)
    assert cfg.agent.engine == EngineConfig(kind="local", tis_cap=1.5)
    assert cfg.agent.precision == "fp32"
    assert cfg.agent_overrides == {"summary": {"lora": {"alpha": 8.0}, "engine": {"sync_timeout_s": 60.0}}}
    summary = cfg.agent_config("summary")
    assert summary.lora == LoRAConfig(rank=2, alpha=8.0) and summary.engine.sync_timeout_s == 60.0
    assert summary.engine.tis_cap == 1.5  # the rest of the table is `agent`'s
    notes = " ".join(r.getMessage() for r in caplog.records)
    assert "agent.engine_*" in notes and "agent.engine.*" in notes and "agent.lora.*" in notes
    assert "agent_overrides.summary.lora_*" in notes


def test_an_old_run_folder_resumes_where_it_stopped(old_run):
    from textzoo.runners import checkpoint as ck
    from textzoo.runners.commands import _run_config
    from textzoo.runners.trainer import Trainer

    before = [json.loads(line) for line in (old_run / "metrics.jsonl").read_text().splitlines()]
    saved = ck.read_checkpoint(old_run / "checkpoints" / "step-00000002").weights
    cfg = TrainConfig(**{**_run_config(str(old_run)).__dict__, "steps": 3})  # `textzoo train --resume DIR --steps 3`
    trainer = Trainer(cfg, resume=old_run)
    assert trainer.resumed_step == 2 and trainer.step == 2
    for name, learner in trainer.learners.items():  # the adapters are the checkpoint's, not fresh ones
        weights = ck.model_weights(learner.model)
        assert sorted(weights) == sorted(saved[name])
        assert all(bool((weights[k].cpu() == saved[name][k]).all()) for k in weights), name
    trainer.train()
    assert trainer.step == 3
    after = [json.loads(line) for line in (old_run / "metrics.jsonl").read_text().splitlines()]
    assert after[: len(before)] == before and after[-1]["step"] == 3  # continued, not started over
    written = json.loads((old_run / "config.json").read_text())
    assert written["agent"]["lora"]["rank"] == 2 and "lora_rank" not in written["agent"]  # now in today's layout
    assert written["agent_overrides"]["summary"] == {"engine": {"sync_timeout_s": 60.0}, "lora": {"alpha": 8.0}}


def test_resume_auto_finds_an_old_run_by_its_config(old_run):
    from textzoo.runners.trainer import find_resumable

    cfg = load_config(OLD_RUN / "config.json")
    same = TrainConfig(**{**cfg.__dict__, "run_dir": ""})
    assert find_resumable(same, root=old_run.parent) == old_run
    other = TrainConfig(**{**same.__dict__, "agent": AgentConfig(**{**cfg.agent.__dict__, "lora": LoRAConfig(rank=4)})})
    assert find_resumable(other, root=old_run.parent) is None


def test_old_keys_in_files_and_overrides_read_as_the_sections(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        "[agent]\nengine = 'local'\nengine_memory = 0.25\nlora_rank = 4\nlora_target_modules = ['c_attn']\n"
        "[agent_overrides.summary]\nlora_alpha = 4.0\nengine_tis = false\n"
    )
    cfg = load_config(toml)
    assert cfg.agent.engine == EngineConfig(memory=0.25) and cfg.agent.lora == LoRAConfig(4, target_modules=("c_attn",))
    summary = cfg.agent_config("summary")
    assert summary.lora == LoRAConfig(4, alpha=4.0, target_modules=("c_attn",)) and summary.engine.tis is False
    # an override passed in Python or on the command line (--agent-overrides JSON) is migrated the same way
    direct = TrainConfig(agent_overrides={"summary": {"engine": "local", "engine_tis_cap": 3.0}})
    assert direct.agent_overrides == {"summary": {"engine": {"kind": "local", "tis_cap": 3.0}}}
    assert direct.agent_config("summary").engine.tis_cap == 3.0
    # an AgentConfig file of its own (`textzoo sft --config`) too
    assert from_dict(AgentConfig, {"lora_rank": 3}).lora.rank == 3


def test_the_migration_is_one_function_that_leaves_todays_layout_alone():
    new = {"lr": 0.1, "lora": {"rank": 2}, "engine": {"kind": "vllm", "memory": 0.3}}
    assert migrate_agent(new) == new
    old = {"lr": 0.1, "lora_rank": 2, "engine": "vllm", "engine_memory": 0.3}
    assert migrate_agent(old) == new and "lora_rank" in old  # the input is not changed
    assert migrate_agent({"lora_rank": 2, "lora": {"alpha": 4.0}}) == {"lora": {"alpha": 4.0, "rank": 2}}
    with pytest.raises(ConfigError, match=r"agent.lora.rank twice, as agent.lora_rank .* keep only agent.lora.rank"):
        migrate_agent({"lora_rank": 2, "lora": {"rank": 4}})
    # every flat field of the old layout has its place (a field added to a section is covered without a list)
    flat = json.loads((OLD_RUN / "config.json").read_text())["agent"]
    moved = {k for k in flat if k.startswith(("engine", "lora_"))}
    assert len(moved) == 15 and not set(migrate_agent(flat)) & (moved - {"engine"})


def test_a_saved_config_round_trips(tmp_path):
    cfg = TrainConfig(
        agent=AgentConfig(lora=LoRAConfig(rank=4, target_modules=("c_attn",)), engine=EngineConfig(tis_cap=3.0)),
        agent_overrides={"summary": {"lora": {"alpha": 2.0}}},
    )
    save_config(cfg, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"agent": {"lora_rnk": 4}}, "did you mean 'agent.lora.rank'?"),
        ({"agent": {"engine_memroy": 0.3}}, "did you mean 'agent.engine.memory'?"),
        ({"agent": {"lora": {"rnak": 4}}}, "did you mean 'agent.lora.rank'?"),
        ({"agent": {"engine": {"tis_cp": 1.0}}}, "did you mean 'agent.engine.tis_cap'?"),
        ({"agent": {"lrr": 0.1}}, "did you mean 'agent.lr'?"),
        ({"agent_overrides": {"summary": {"lora_aplha": 2.0}}}, "did you mean 'agent_overrides.summary.lora.alpha'?"),
    ],
)
def test_a_misspelt_key_is_answered_with_the_closest_one(data, named):
    with pytest.raises(ConfigError, match="unknown config field") as err:
        from_dict(TrainConfig, data)
    assert named in str(err.value)
