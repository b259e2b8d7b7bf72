"""The run's rollout engines: made for the agents that ask for one (``agent.engine.kind="vllm"``) as their
policies are built (`TeamEngines`), synced after every optimizer step, their log-prob gap logged, and closed
(`textzoo.decoding.engine` has the seam).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from textzoo.algorithms.rlmath import engine_gap, truncated_importance_weights
from textzoo.decoding.engine import EngineClient
from textzoo.decoding.precision import PRECISIONS
from textzoo.decoding.settings import EngineConfig
from textzoo.decoding.vllm_engine import VLLMEngine
from textzoo.models.build import Loaded
from textzoo.models.lora import SharedBase, adapter_name


class TeamEngines:
    """The rollout engines of one team, made while its policies are built (`textzoo.runners.build`), so each
    policy gets its `EngineClient` when it is constructed: an agent whose ``engine.kind`` is "vllm" samples
    on one; LoRA agents of one shared base share that base's engine (room for ``max_loras`` adapters of rank
    up to ``lora_rank``), a fully fine-tuned agent gets its own. The engine first made for actor i samples
    with seed ``seed * 1000 + i``."""

    def __init__(self, seed: int = 0, max_loras: int = 0, lora_rank: int = 0):
        self.seed = seed
        self.max_loras = max_loras
        self.lora_rank = lora_rank
        self._shared: dict[int, VLLMEngine] = {}  # id(SharedBase) -> its engine

    def for_model(self, settings: EngineConfig, loaded: Loaded, index: int) -> EngineClient | None:
        """The client of a new engine over ``loaded``'s whole weights; None for ``kind="local"``."""
        if settings.kind == "local":
            return None
        computes = PRECISIONS[loaded.precision].compute or next(loaded.model.parameters()).dtype
        engine = VLLMEngine.for_model(
            loaded.model, loaded.tokenizer, computes, settings, loaded.name, seed=self.seed * 1000 + index
        )
        return EngineClient(engine, None, **_client_args(settings))

    def for_adapter(self, settings: EngineConfig, base: SharedBase, agent_id: str, index: int) -> EngineClient | None:
        """The client of agent ``agent_id``'s adapter on ``base``'s engine (made on the first call for that
        base); None for ``kind="local"``. The builder uploads the adapter once the policy holds it."""
        if settings.kind == "local":
            return None
        if id(base) not in self._shared:
            self._shared[id(base)] = VLLMEngine.for_lora_base(
                base, settings, lora_rank=self.lora_rank, max_loras=self.max_loras, seed=self.seed * 1000 + index
            )
        return EngineClient(self._shared[id(base)], adapter_name(agent_id), **_client_args(settings))


def _client_args(settings: EngineConfig) -> dict[str, Any]:
    return dict(tis_cap=settings.tis_cap, sync_timeout=settings.sync_timeout_s, tis=settings.tis)


def sync_engines(actors: Sequence[Any], versions: dict[str, int], force: bool = False) -> dict[str, float]:
    """Sync every engine-backed actor whose learner moved on (``versions``: actor id -> learner version;
    ``force``: whether or not it did), waking sleeping engines first, and return the log row's engine columns
    (`engine/<id>/weight_version`, `engine/<id>/sync_s`, and `engine/<id>/wake_s` when it woke one)."""
    row: dict[str, float] = {}
    woken: set[int] = set()
    for actor in actors:
        client = actor.policy.engine
        if client is None or not client.open:
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
        if client is None or not client.open or not getattr(client.engine, "sleeps", False):
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
        if client is None or not client.open:
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
    """Shut every engine of ``actors`` down (`EngineClient.close`): their policies sample themselves after."""
    for actor in actors:
        if actor.policy.engine is not None:
            actor.policy.engine.close()
