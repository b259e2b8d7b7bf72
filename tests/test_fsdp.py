"""FSDP2 sharding on CPU (gloo, 2 processes): the same weights as one process with the combined batch,
identical full weights on both processes through `Trainer` runs, full-weight checkpoints, exact resume."""

import shutil
import textwrap

import pytest
import torch
from replicas import assert_states_equal, run_script

from textzoo.config import AgentConfig, LoRAConfig, TrainConfig
from textzoo.errors import ConfigError
from textzoo.runners import checkpoint as ck

torch.set_num_threads(1)

SCRIPT = '''
import sys
from functools import partial
from pathlib import Path

import torch

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.decoding.generation import GenerationConfig
from textzoo.models.policy import Policy
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from textzoo.runners import sharding
from helpers import tiny_config
from textzoo.config import AgentConfig, TrainConfig, LoRAConfig
from textzoo.runners.distributed import launch
from textzoo.runners.trainer import Trainer
from textzoo.runners.update import Learner, UpdateConfig, run_job

N = 8  # samples in the combined batch


def fixed_update(arch, rows, ctx):
    """Three SGD steps of REINFORCE on `rows` of one fixed batch (sharded over `ctx` when given)."""
    torch.manual_seed(0)
    policy = Policy.tiny(arch, n_layer=2, n_embd=32, n_head=2, seed=0, generation=GenerationConfig(max_new_tokens=6))
    prompts = [f"prompt number {i // 2}" for i in range(N)]  # pairs share a prompt
    gen = policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    if ctx is not None:
        sharding.shard(policy.model, torch.device("cpu"), ctx.world_size)
    advantages = torch.linspace(-1.0, 1.0, N)
    learner = Learner(policy.model, torch.optim.SGD(policy.model.parameters(), lr=0.5), max_grad_norm=1.0)
    job = Job("a", SampleBatch(gen.select(rows), advantages[rows]), partial(reinforce_loss, policy, ReinforceConfig()),
              max_new_tokens=6)
    for _ in range(3):
        run_job(job, learner, UpdateConfig(micro_batch_size=3), grad_sync=None if ctx is None else ctx.grad_sync)
    if ctx is None:
        return {k: v.clone() for k, v in policy.model.state_dict().items()}
    return sharding.full_weights(policy.model, everywhere=True)


def replica(ctx, mode, out, run_dir):
    torch.set_num_threads(1)
    if mode == "train":
        for arch in ("gpt2", "llama"):
            weights = fixed_update(arch, torch.arange(N)[ctx.shard(N)], ctx)
            torch.save(weights, Path(out) / f"fixed-{arch}-rank{ctx.rank}.pt")
    cfg = tiny_config(steps=3, threads=1, save_every=1, keep_last=3, run_dir=run_dir, sharding="fsdp")
    trainer = Trainer(cfg, dist=ctx, resume=run_dir if mode == "resume" else None)
    assert all(sharding.is_sharded(learner.model) for learner in trainer.learners.values())
    trainer.train()
    weights = {n: sharding.full_weights(l.model, everywhere=True) for n, l in trainer.learners.items()}
    torch.save(weights, Path(out) / f"{mode}-rank{ctx.rank}.pt")


if __name__ == "__main__":
    mode, out, run_dir = sys.argv[1:]
    launch(replica, 2, mode, out, run_dir)
    if mode == "train":
        torch.set_num_threads(1)
        for arch in ("gpt2", "llama"):
            torch.save(fixed_update(arch, torch.arange(N), None), Path(out) / f"fixed-{arch}-single.pt")
'''


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    script = tmp / "fsdp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run_script(script, "train", tmp, tmp / "run")
    return script, tmp


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_two_shards_equal_one_process_with_the_combined_batch(sharded_run, arch):
    from textzoo.models.policy import Policy

    _, out = sharded_run
    rank0, rank1 = torch.load(out / f"fixed-{arch}-rank0.pt"), torch.load(out / f"fixed-{arch}-rank1.pt")
    single = torch.load(out / f"fixed-{arch}-single.pt")
    assert_states_equal(rank0, rank1)
    assert set(rank0) <= set(single)  # full weights under the module's own names
    for name, tensor in rank0.items():
        torch.testing.assert_close(tensor, single[name], rtol=1e-5, atol=1e-6, msg=name)
    init = Policy.tiny(arch, n_layer=2, n_embd=32, n_head=2, seed=0).model.state_dict()
    assert max(float((single[k] - init[k]).abs().max()) for k in rank0) > 1e-2  # the check has teeth


def test_sharded_trainer_processes_hold_the_same_weights_and_checkpoint_them_whole(sharded_run):
    from textzoo.models.build import build_policy

    _, out = sharded_run
    assert_states_equal(torch.load(out / "train-rank0.pt"), torch.load(out / "train-rank1.pt"))
    saved = ck.read_checkpoint(ck.list_checkpoints(out / "run")[-1])
    whole = build_policy(AgentConfig(), seed=0, device=torch.device("cpu")).model
    for name in ("summary", "elaboration"):
        ck.check_weights(whole, saved.weights[name], name)  # loads into an unsharded model as it is
    assert len(saved.state["replicas"]) == 2


def test_sharded_training_resumes_exactly(sharded_run):
    script, out = sharded_run
    run_dir = out / "run"
    shutil.rmtree(ck.list_checkpoints(run_dir)[-1])  # as if killed before step 3 was saved
    run_script(script, "resume", out, run_dir)
    assert_states_equal(torch.load(out / "resume-rank0.pt"), torch.load(out / "train-rank0.pt"))
    assert_states_equal(torch.load(out / "resume-rank1.pt"), torch.load(out / "train-rank1.pt"))


def test_sharding_settings_are_checked_before_models_are_built():
    with pytest.raises(ConfigError, match="sharding must be one of"):
        TrainConfig(sharding="zero3")
    with pytest.raises(ConfigError, match="LoRA"):
        TrainConfig(sharding="fsdp", agent=AgentConfig(lora=LoRAConfig(rank=4)))
    with pytest.raises(ConfigError, match="LoRA"):
        TrainConfig(sharding="fsdp", agent_overrides={"summary": {"lora": {"rank": 4}}})
    cfg = TrainConfig(algo="iac")
    cfg.actor_critic.critic_model = "actor"
    with pytest.raises(ConfigError, match="value head"):
        TrainConfig(algo="iac", sharding="fsdp", actor_critic=cfg.actor_critic)
