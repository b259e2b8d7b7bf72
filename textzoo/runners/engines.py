"""The run's rollout engines: made for the agents that ask for one (``agent.engine.kind`` "vllm" or
"vllm-server") as their policies are built (`TeamEngines`), checked and synced after every optimizer step,
their log-prob gap logged, and closed (`textzoo.decoding.engine` has the seam).

Under data parallelism each process has its own clients: with "vllm" its own in-process engines, which
join the trainer's process group (colocated; `textzoo.decoding.vllm_engine`), with "vllm-server" its
clients of the one server, to which process 0 alone pushes weights (`textzoo.decoding.vllm_server`; the
others wait for it at a barrier and then use the names it loaded). Their metrics carry the process's rank
(`engine/<id>/rank<r>/...`), so a run's log says which engine sampled what.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from textzoo.algorithms.rlmath import engine_gap, truncated_importance_weights
from textzoo.config import AgentConfig
from textzoo.decoding.engine import EngineClient
from textzoo.decoding.precision import PRECISIONS
from textzoo.decoding.settings import EngineConfig
from textzoo.decoding.vllm_engine import VLLMEngine, _base_state_dict
from textzoo.decoding.vllm_server import VLLMServerEngine
from textzoo.errors import ConfigError, EngineError
from textzoo.models.build import Loaded
from textzoo.models.lora import SharedBase, adapter_name
from textzoo.runners.distributed import DistContext

RANK_SEED = 1_000_003
"""Process r's engines sample with the seeds of process 0's plus r x this (colocated engines draw apart)."""


class TeamEngines:
    """The rollout engines of one team, made while its policies are built (`textzoo.runners.build`), so each
    policy gets its `EngineClient` when it is constructed: an agent whose ``engine.kind`` is "vllm" samples on
    an in-process engine, "vllm-server" on a server; LoRA agents of one shared base share that base's engine
    (room for ``max_loras`` adapters of rank up to ``lora_rank``), a fully fine-tuned agent gets its own. The
    engine first made for actor i samples with seed ``seed * 1000 + i`` (plus `RANK_SEED` x the rank)."""

    def __init__(self, seed: int = 0, max_loras: int = 0, lora_rank: int = 0, dist: DistContext | None = None):
        self.seed = seed
        self.max_loras = max_loras
        self.lora_rank = lora_rank
        self.dist = dist or DistContext()
        self._shared: dict[int, Any] = {}  # id(SharedBase) -> its engine
        self._token: str | None = None

    def _seed(self, index: int) -> int:
        return self.seed * 1000 + index + RANK_SEED * self.dist.rank

    def _server(self, settings: EngineConfig) -> VLLMServerEngine:
        if self._token is None:  # the run's part of adapter and weight names, equal on every process
            token = secrets.token_hex(4)
            self._token = self.dist.broadcast(token) if self.dist.enabled else token
        return VLLMServerEngine(
            settings.url, settings.api_key, settings.timeout_s, settings.sync_dir, self.dist.is_main, self._token
        )

    def for_model(self, settings: EngineConfig, loaded: Loaded, index: int) -> EngineClient | None:
        """The client of a new engine for ``loaded``'s whole weights; None for ``kind="local"``. A server's is
        given the weights once the policy holds them (`EngineClient.attach`)."""
        if settings.kind == "local":
            return None
        if settings.kind == "vllm-server":
            return EngineClient(self._server(settings), None, **_client_args(settings))
        computes = PRECISIONS[loaded.precision].compute or next(loaded.model.parameters()).dtype
        engine = VLLMEngine.for_model(
            loaded.model, loaded.tokenizer, computes, settings, loaded.name, self._seed(index), self.dist.enabled
        )
        return EngineClient(engine, None, **_client_args(settings))

    def for_adapter(self, settings: EngineConfig, base: SharedBase, agent_id: str, index: int) -> EngineClient | None:
        """The client of agent ``agent_id``'s adapter on ``base``'s engine (made on the first call for that
        base; a server is first made to hold the base's weights); None for ``kind="local"``. The builder
        uploads the adapter once the policy holds it (`EngineClient.attach`)."""
        if settings.kind == "local":
            return None
        if id(base) not in self._shared:
            if settings.kind == "vllm-server":
                engine = self._server(settings)
                _serve_base(engine, base, settings.sync_timeout_s, self.dist)
            else:
                engine = VLLMEngine.for_lora_base(
                    base, settings, self.lora_rank, self.max_loras, self._seed(index), self.dist.enabled
                )
            self._shared[id(base)] = engine
        return EngineClient(self._shared[id(base)], adapter_name(agent_id), **_client_args(settings))


def _serve_base(engine: VLLMServerEngine, base: SharedBase, timeout: float, dist: DistContext) -> None:
    """Make the server hold ``base``'s frozen weights: checked on the probe, given them when it holds others
    (e.g. after serving a fully fine-tuned run) and checked again."""
    plain = base.model.get_base_model() if base.model is not None else base.base

    def trainer(prompt: list[int], completion: list[int]) -> list[float]:
        device = next(plain.parameters()).device
        ids = torch.tensor([prompt + completion], device=device)
        with torch.no_grad():
            if base.model is not None:
                with base.model.disable_adapter():
                    logits = base.model(input_ids=ids).logits
            else:
                logits = plain(input_ids=ids).logits
        lp = logits[0].float().log_softmax(-1)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]

    half = next(plain.parameters()).dtype in (torch.bfloat16, torch.float16)
    try:
        engine.verify(trainer, base.tokenizer, trainer_half=half)
        same = True
    except EngineError:
        same = False
    if dist.enabled:
        same = all(dist.gather(same))
    if same:
        return
    state = _base_state_dict(base) if base.model is not None else plain.state_dict()
    engine.load_weights(state, timeout, version=0)
    engine.forget_weights()  # the base is not a weight version: a restarted server serves its own model again
    dist.barrier()
    engine.verify(trainer, base.tokenizer, trainer_half=half)


def _client_args(settings: EngineConfig) -> dict[str, Any]:
    return dict(tis_cap=settings.tis_cap, sync_timeout=settings.sync_timeout_s, tis=settings.tis)


def check_servers(roles: Sequence[str], agents: Sequence[AgentConfig]) -> None:
    """A vLLM server holds one model's weights: one fully fine-tuned agent per server, or the LoRA agents of one
    base; `ConfigError` before any model is built otherwise."""
    holders: dict[str, str] = {}  # url -> what it serves
    for role, agent in zip(roles, agents):
        if agent.engine.kind != "vllm-server":
            continue
        holds = "the LoRA agents' base" if agent.lora.rank else f"agent {role!r}"
        if holders.setdefault(agent.engine.url, holds) != holds:
            raise ConfigError(
                f"agent.engine.url {agent.engine.url} would serve two models ({holders[agent.engine.url]} and "
                f"{holds}); a vLLM server holds one model's weights: give each fully fine-tuned agent its own "
                "server (agent_overrides.ROLE.engine.url; LoRA agents of one base share one)"
            )


def sync_engines(
    actors: Sequence[Any],
    versions: dict[str, int],
    force: bool = False,
    weights: dict[str, dict[str, torch.Tensor]] | None = None,
    dist: DistContext | None = None,
) -> dict[str, float]:
    """Sync every engine-backed actor whose learner moved on (``versions``: actor id -> learner version;
    ``force``: whether or not it did; ``weights``: actor id -> whole state dict, for sharded models), waking
    sleeping engines first, then check the syncs that engines verify (after a barrier under data parallelism:
    process 0 pushes to a server). Returns the log row's engine columns: `engine/<id>/weight_version`,
    `engine/<id>/sync_s`, `engine/<id>/sync_gap` (a verified sync's probe gap), `engine/<id>/wake_s` when it
    woke one, and under data parallelism `engine/<id>/rank<r>/weight_version`."""
    dist = dist or DistContext()
    weights = weights or {}
    row: dict[str, float] = {}
    woken: set[int] = set()
    synced = []
    for actor in _engine_actors(actors):
        client = actor.policy.engine
        if getattr(client.engine, "asleep", False):  # sleep mode: awake before the sync and the next rollout
            client.engine.wake()
            woken.add(id(client.engine))
        if id(client.engine) in woken:
            row[f"engine/{actor.id}/wake_s"] = client.engine.wake_s
        if actor.id in versions and client.sync(actor.policy, versions[actor.id], force, weights.get(actor.id)):
            synced.append(actor)
    _verified(synced, dist)
    for actor in _engine_actors(actors):
        client = actor.policy.engine
        row[f"engine/{actor.id}/weight_version"] = float(client.version)
        row[f"engine/{actor.id}/sync_s"] = client.sync_s
        if client.sync_gap is not None:
            row[f"engine/{actor.id}/sync_gap"] = client.sync_gap
        if dist.enabled:
            row[f"engine/{actor.id}/rank{dist.rank}/weight_version"] = float(client.version)
    return row


def refresh_engines(
    actors: Sequence[Any],
    weights: Callable[[Any], dict[str, torch.Tensor] | None] = lambda actor: None,
    dist: DistContext | None = None,
) -> dict[str, float]:
    """Before a rollout: give every engine that lost its weights or adapters (a restarted server) the current
    ones again and check them (`EngineClient.lost`, `EngineClient.resend`); the processes of a data-parallel
    run agree on which first. ``weights(actor)``: a sharded model's whole state dict (a collective: called
    for the same actors in the same order on every process). The log row's `engine/<id>/restarts`."""
    dist = dist or DistContext()
    engines = _engine_actors(actors)
    lost = [a.id for a in engines if a.policy.engine.lost()]
    if dist.enabled:
        lost = sorted({i for ids in dist.gather(lost) for i in ids})
    found = [a for a in engines if a.id in lost]
    for actor in found:
        actor.policy.engine.resend(actor.policy, weights(actor))
    _verified(found, dist)
    return {f"engine/{a.id}/restarts": float(a.policy.engine.restarts) for a in engines}


def attach_engines(actors: Sequence[Any], dist: DistContext | None = None) -> None:
    """Check the syncs the builder made (`EngineClient.attach`: a server given its weights or adapters), after
    every process has built its team."""
    _verified(_engine_actors(actors), dist or DistContext())


def _verified(actors: Sequence[Any], dist: DistContext) -> None:
    """`EngineClient.verify` each actor's engine, once every process has pushed (a barrier where there are several)."""
    if dist.enabled:
        dist.barrier()
    for actor in actors:
        actor.policy.engine.verify(actor.policy)


def _engine_actors(actors: Sequence[Any]) -> list[Any]:
    return [a for a in actors if a.policy.engine is not None and a.policy.engine.open]


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


def engine_metrics(actors: Sequence[Any], rank: int | None = None) -> dict[str, float]:
    """The columns of every engine-backed actor's samples since the last call, over all its sampled tokens:
    `engine/<id>/logp_gap` (mean |Δ log p|), `engine/<id>/kl_k3`, `engine/<id>/tis_weight` (mean
    min(π_trainer/π_engine, C), C = the agent's `engine.tis_cap`), and how many completions and tokens the
    engine sampled, `engine/<id>/completions` and `engine/<id>/tokens` (with ``rank``, a data-parallel
    process's, `engine/<id>/rank<r>/completions` and `.../tokens`)."""
    row: dict[str, float] = {}
    for actor in _engine_actors(actors):
        client = actor.policy.engine
        s = client.drain()
        where = f"engine/{actor.id}/" + (f"rank{rank}/" if rank is not None else "")
        row[where + "completions"] = float(sum(m.shape[0] for m in s.mask))  # sampled rows (greedy ones are not kept)
        row[where + "tokens"] = float(sum(m.sum() for m in s.mask))
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
