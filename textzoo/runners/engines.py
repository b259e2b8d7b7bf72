"""The run's rollout engines: built for the agents that ask for one (``agent.engine.kind="vllm"``), synced
after every optimizer step, their log-prob gap logged, and closed (`textzoo.decoding.engine` has the seam).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from textzoo.algorithms.rlmath import engine_gap, truncated_importance_weights
from textzoo.decoding.engine import EngineClient
from textzoo.decoding.vllm_engine import VLLMEngine
from textzoo.models.lora import AdapterView


def attach_engines(actors: Sequence[Any], agents: Sequence[Any], seed: int = 0) -> None:
    """Give each actor whose agent config (``agents[i]``, an `AgentConfig`) says ``engine.kind="vllm"`` an
    `EngineClient`: LoRA agents of one shared base share one engine, a fully fine-tuned agent gets its own.
    Engine i samples with seed ``seed * 1000 + i``."""
    shared: dict[int, Any] = {}  # id(SharedBase) -> its engine
    loras = [c for a, c in zip(actors, agents) if isinstance(a.policy.model, AdapterView)]
    for i, (actor, agent) in enumerate(zip(actors, agents)):
        settings = agent.engine
        if settings.kind == "local":
            continue
        policy = actor.policy
        client_args = dict(tis_cap=settings.tis_cap, sync_timeout=settings.sync_timeout_s, tis=settings.tis)
        if isinstance(policy.model, AdapterView):
            base = policy.model.shared
            if id(base) not in shared:
                rank = max(c.lora.rank for c in loras)
                shared[id(base)] = VLLMEngine.for_lora_base(
                    base, settings, lora_rank=rank, max_loras=len(loras), seed=seed * 1000 + i
                )
            engine = shared[id(base)]
            engine.update_adapter(policy.model.adapter, policy.model, 0, settings.sync_timeout_s)
            policy.engine = EngineClient(engine, policy.model.adapter, **client_args)
        else:
            policy.engine = EngineClient(
                VLLMEngine.for_policy(policy, settings, seed=seed * 1000 + i), None, **client_args
            )


def sync_engines(actors: Sequence[Any], versions: dict[str, int], force: bool = False) -> dict[str, float]:
    """Sync every engine-backed actor whose learner moved on (``versions``: actor id -> learner version;
    ``force``: whether or not it did), waking sleeping engines first, and return the log row's engine columns
    (`engine/<id>/weight_version`, `engine/<id>/sync_s`, and `engine/<id>/wake_s` when it woke one)."""
    row: dict[str, float] = {}
    woken: set[int] = set()
    for actor in actors:
        client = actor.policy.engine
        if client is None:
            continue
        if getattr(client.engine, "asleep", False):  # sleep mode: awake before the sync and the next rollout
            client.engine.wake()
            woken.add(id(client.engine))
        if id(client.engine) in woken:
            row[f"engine/{actor.id}/wake_s"] = client.engine.wake_s
        if actor.id in versions:
            client.sync(actor.policy, versions[actor.id], force)
        row[f"engine/{actor.id}/weight_version"] = float(client.version)
        row[f"engine/{actor.id}/sync_s"] = client.sync_s
    return row


def sleep_engines(actors: Sequence[Any]) -> dict[str, float]:
    """Put every engine with sleep mode on (``agent.engine.sleep``) to sleep after a rollout, so the update has
    the device memory; the log row's `engine/<id>/sleep_s`. The next sync (`sync_engines`) wakes them."""
    row: dict[str, float] = {}
    for actor in actors:
        client = actor.policy.engine
        if client is None or not getattr(client.engine, "sleeps", False):
            continue
        client.engine.sleep()
        row[f"engine/{actor.id}/sleep_s"] = client.engine.sleep_s
    return row


def engine_metrics(actors: Sequence[Any]) -> dict[str, float]:
    """The log-prob gap columns of every engine-backed actor since the last call, over all its sampled
    tokens: `engine/<id>/logp_gap` (mean |Δ log p|), `engine/<id>/kl_k3` and `engine/<id>/tis_weight`
    (mean min(π_trainer/π_engine, C), C = the agent's `engine.tis_cap`)."""
    row: dict[str, float] = {}
    for actor in actors:
        client = actor.policy.engine
        if client is None:
            continue
        s = client.drain()
        if not s.mask:
            continue
        C = max(m.shape[1] for m in s.mask)
        trainer, engine, mask = (
            torch.cat([F.pad(t, (0, C - t.shape[1])) for t in ts]) for ts in (s.trainer, s.engine, s.mask)
        )
        if not bool(mask.any()):
            continue
        gap, kl = engine_gap(trainer, engine, mask)
        weights = truncated_importance_weights(trainer, engine, mask, client.tis_cap)
        row[f"engine/{actor.id}/logp_gap"] = float(gap)
        row[f"engine/{actor.id}/kl_k3"] = float(kl)
        row[f"engine/{actor.id}/tis_weight"] = float(weights.sum() / mask.sum())
    return row


def close_engines(actors: Sequence[Any]) -> None:
    """Shut every engine of ``actors`` down (once each) and detach it."""
    seen: set[int] = set()
    for actor in actors:
        client = actor.policy.engine
        if client is None:
            continue
        if id(client.engine) not in seen:
            seen.add(id(client.engine))
            client.engine.close()
        actor.policy.engine = None
