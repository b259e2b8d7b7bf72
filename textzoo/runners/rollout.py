"""Rollout collection: B prompts x G samples as B*G env copies played in lock-step.

Each turn, each actor makes **one** batched generate call (`Actor.generate`: its prompts formatted,
raw or by the chat template) over every live env copy where one of its roles is active (actors on
distinct devices generate at the same time, in threads); the envs then step (in a thread pool
when `env_workers` > 1, so code-running tasks score many samples at once).
The G copies of a prompt are reset with the same seed and item, so they pose the same task.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from textzoo.algorithms.batch import ActorStep, Rollout
from textzoo.decoding.generation import Generation
from textzoo.errors import EnvError
from textzoo.models.team import Actor
from textzoo.runners.update import disjoint_models


def prompt_seed(base_seed: int, step: int, prompt: int) -> int:
    """Env seed of prompt `prompt` at training step `step` (step -1 = evaluation); resume-safe."""
    return int(np.random.SeedSequence([base_seed, step + 1, prompt]).generate_state(1)[0])


class Collector:
    """Plays actors in a pool of env copies built by `env_fn`."""

    def __init__(
        self, env_fn: Callable[[], Any], actors: Sequence[Actor], env_workers: int = 1, generate_workers: int = 1
    ):
        self.env_fn = env_fn
        self.actors = list(actors)
        self.generate_workers = generate_workers
        self.envs: list[Any] = []
        self.env_workers = env_workers
        self._pool = ThreadPoolExecutor(env_workers) if env_workers > 1 else None
        probe = self._env(0)
        self.roles: list[str] = list(probe.possible_agents)
        covered = [r for a in self.actors for r in a.roles]
        if sorted(covered) != sorted(self.roles):
            raise EnvError(
                f"the team's roles {sorted(covered)} do not match the env's agents {sorted(self.roles)}: "
                "configure one agent per env agent (or a joint actor over all of them)"
            )

    def _env(self, i: int) -> Any:
        while len(self.envs) <= i:
            self.envs.append(self.env_fn())
        return self.envs[i]

    def _map(self, fn: Callable[[int], Any], indices: Sequence[int]) -> list[Any]:
        if self._pool is None or len(indices) < 2:
            return [fn(i) for i in indices]
        return list(self._pool.map(fn, indices))

    def collect(
        self,
        items: Sequence[int],
        seeds: Sequence[int],
        group_size: int,
        *,
        greedy: bool = False,
        cross: bool = False,
        tree: bool = False,
    ) -> Rollout:
        """Play every prompt `items[b]` (env seed `seeds[b]`) `group_size` times, turn by turn until every
        env copy is done; with `cross`, also score every combination of the actors' samples; with `tree`,
        after each turn continue every prompt's best branch in all its copies (`_branch`)."""
        B, G = len(items), group_size
        envs = [self._env(e) for e in range(B * G)]
        resets = [envs[e].reset(seed=int(seeds[e // G]), options={"index": int(items[e // G])}) for e in range(B * G)]
        obs, infos = [r[0] for r in resets], [r[1] for r in resets]
        record = _Record(len(envs), self.roles, len(self.actors))
        live, t = list(range(len(envs))), 0
        paths: list[list[dict[str, str]]] = [[] for _ in envs]  # each copy's joint actions so far (tree)
        while live:
            record.states.append([envs[e].state() if e in set(live) else "" for e in range(len(envs))])
            requests = self._requests(live, obs, infos)
            start = time.perf_counter()
            gens = self._generate([(self.actors[r.actor], r.prompts) for r in requests], greedy)
            record.time_generate += time.perf_counter() - start
            actions = self._actions(requests, gens, live, t, greedy, record)
            start = time.perf_counter()
            results = self._map(lambda e, actions=actions: envs[e].step(actions[e]), live)
            played = live
            live = record.step(live, results, obs, infos)
            if tree:
                live = self._branch(envs, played, live, actions, paths, record.rewards[-1], obs, infos, items, seeds, G)
            record.time_env += time.perf_counter() - start
            t += 1
        rollout = record.rollout(B, G, self.actors, items)
        if cross:
            rollout.cross_rewards = self._cross(rollout, items, seeds)
        return rollout

    def _branch(
        self,
        envs: list[Any],
        played: list[int],
        live: list[int],
        actions: dict[int, dict[str, str]],
        paths: list[list[dict[str, str]]],
        rewards: torch.Tensor,
        obs: list[dict],
        infos: list[dict],
        items: Sequence[int],
        seeds: Sequence[int],
        G: int,
    ) -> list[int]:
        """Tree rollout: of each prompt's copies that played this turn, the one with the best team reward
        (`rewards` [E, R]; ties: the first) is rebuilt in the others (reset, then its joint actions replayed:
        tasks are deterministic given seed, item and actions). Returns the copies still live."""
        for e in played:
            paths[e].append(dict(actions[e]))
        team = rewards.mean(-1)  # [E]
        still = set(live)
        for b in sorted({e // G for e in played}):
            copies = [e for e in played if e // G == b]
            best = max(copies, key=lambda e: (float(team[e]), -e))
            for e in copies:
                if e == best:
                    continue
                paths[e] = [dict(a) for a in paths[best]]
                o, info = envs[e].reset(seed=int(seeds[b]), options={"index": int(items[b])})
                for joint in paths[e]:
                    o, _, _, _, info = envs[e].step(joint)
                obs[e], infos[e] = o, info
                still.discard(e)
                if best in still:
                    still.add(e)
        return sorted(still)

    def _requests(self, live: list[int], obs: list[dict], infos: list[dict]) -> list[_Request]:
        """Who generates this turn: per actor, the live env copies where one of its roles is active."""
        requests = []
        for ai, actor in enumerate(self.actors):
            request = _Request(ai)
            for e in live:
                roles = tuple(r for r in actor.roles if r in obs[e] and infos[e].get(r, {}).get("active", True))
                if roles:
                    request.rows.append(e)
                    request.roles.append(roles)
                    request.prompts.append(actor.build_prompt({r: obs[e][r] for r in roles}))
            if request.rows:
                requests.append(request)
        return requests

    def _actions(
        self, requests: list[_Request], gens: list[Generation], live: list[int], t: int, greedy: bool, record: _Record
    ) -> dict[int, dict[str, str]]:
        """Each live env copy's actions this turn (the completions parsed per role); records the samples."""
        actions: dict[int, dict[str, str]] = {e: {} for e in live}
        acted = torch.zeros(record.num_envs, len(self.actors), dtype=torch.bool)  # [E, A]
        played = torch.zeros(record.num_envs, len(self.roles), dtype=torch.bool)  # [E, R]
        for request, gen in zip(requests, gens):
            actor = self.actors[request.actor]
            for e, roles, text in zip(request.rows, request.roles, gen.texts):
                acts, failed = actor.parse(text, roles)
                record.parse_failures += int(failed)
                actions[e].update(acts)
                # per-role action length in characters: one measure for both modes and any tokenizer
                for r in roles:
                    record.role_chars.setdefault(r, []).append(len(acts.get(r, "")))
                    played[e, record.role_index[r]] = True
            acted[request.rows, request.actor] = True
            record.steps.append(ActorStep(actor.id, t, torch.tensor(request.rows, dtype=torch.long), gen, greedy))
        record.active.append(acted)
        record.role_active.append(played)
        record.actions.append(actions)
        return actions

    def _generate(self, requests: list[tuple[Actor, list[str]]], greedy: bool) -> list[Generation]:
        """One batched generate call per actor; actors on different devices generate at the same time.

        Each thread samples on its own device's RNG, so the draws do not depend on thread timing.
        """
        by_device: dict[str, list[int]] = {}
        for i, (actor, _) in enumerate(requests):
            by_device.setdefault(str(actor.policy.device), []).append(i)
        if len(by_device) < 2:
            models = [actor.policy.model for actor, _ in requests]
            if min(self.generate_workers, len(requests)) < 2 or not disjoint_models(models):
                return [actor.generate(prompts, greedy=greedy) for actor, prompts in requests]
            # Actors on one device share its RNG: each samples from its own generator, seeded from
            # that RNG in actor order, so the draws do not depend on thread timing.
            device = requests[0][0].policy.device
            seeds = torch.randint(2**62, (len(requests),)).tolist()
            generators = [torch.Generator(device).manual_seed(s) for s in seeds]
            with ThreadPoolExecutor(min(self.generate_workers, len(requests))) as pool:
                return list(
                    pool.map(
                        lambda i: requests[i][0].generate(requests[i][1], greedy=greedy, generator=generators[i]),
                        range(len(requests)),
                    )
                )
        out: list[Generation | None] = [None] * len(requests)

        def run(indices: list[int]) -> None:
            for i in indices:
                actor, prompts = requests[i]
                out[i] = actor.generate(prompts, greedy=greedy)

        with ThreadPoolExecutor(len(by_device)) as pool:
            list(pool.map(run, by_device.values()))
        return out

    def _cross(self, rollout: Rollout, items: Sequence[int], seeds: Sequence[int]) -> torch.Tensor:
        """Each role's reward for every combination of the actors' samples, per prompt: [B, G**A, R]."""
        if rollout.rewards.shape[-1] != 1:
            raise EnvError("joint_mode='cross' needs a single-turn env")
        B, G, A = rollout.num_prompts, rollout.group_size, len(self.actors)
        texts = {}  # (actor index, env copy) -> actions
        for s in rollout.steps:
            ai = rollout.actors.index(s.actor)
            actor = self.actors[ai]
            for e, text in zip(s.env_ids.tolist(), s.gen.texts):
                texts[(ai, e)] = actor.parse(text, actor.roles)[0]
        combos = list(itertools.product(range(G), repeat=A))
        jobs = [(b, c) for b in range(B) for c in range(len(combos))]
        base = rollout.num_envs
        for i in range(len(jobs)):
            self._env(base + i)

        def play(i: int) -> torch.Tensor:
            b, c = jobs[i]
            env = self.envs[base + i]
            env.reset(seed=int(seeds[b]), options={"index": int(items[b])})
            actions: dict[str, str] = {}
            for ai, g in enumerate(combos[c]):
                actions.update(texts.get((ai, b * G + g), {}))
            rew = env.step(actions)[1]
            return torch.tensor([float(rew.get(r, 0.0)) for r in self.roles])  # [R]

        out = torch.stack(self._map(play, list(range(len(jobs)))))  # [B*G**A, R]
        return out.view(B, len(combos), len(self.roles))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        for env in self.envs:
            env.close()


@dataclass
class _Request:
    """One actor's generate call of a turn: env copy `rows[i]` asks for roles `roles[i]` with `prompts[i]`."""

    actor: int  # index into the collector's actors
    rows: list[int] = field(default_factory=list)
    roles: list[tuple[str, ...]] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)


class _Record:
    """What a collection writes down turn by turn, and the `Rollout` it becomes."""

    def __init__(self, num_envs: int, roles: list[str], num_actors: int):
        self.num_envs = num_envs
        self.roles = roles
        self.role_index = {r: i for i, r in enumerate(roles)}
        self.steps: list[ActorStep] = []
        self.rewards: list[torch.Tensor] = []  # per turn [E, R]
        self.active: list[torch.Tensor] = []  # per turn [E, A]
        self.role_active: list[torch.Tensor] = []  # per turn [E, R]: the roles an actor answered for
        self.states: list[list[str]] = []  # per turn [E]
        self.terms: dict[str, torch.Tensor] = {}  # term -> [E, R], summed over turns
        self.parse_failures = 0
        # per turn, what each env copy's roles did and scored (for the samples log): env -> role -> ...
        self.actions: list[dict[int, dict[str, str]]] = []
        self.turn_terms: list[dict[int, dict[str, dict[str, float]]]] = []
        self.role_chars: dict[str, list[int]] = {}  # role -> character length of each of its actions
        self.time_generate = self.time_env = 0.0

    def step(self, live: list[int], results: list[tuple], obs: list[dict], infos: list[dict]) -> list[int]:
        """Record the envs' step results of this turn; return the env copies still live."""
        shape = (self.num_envs, len(self.roles))
        rewards = torch.zeros(shape)  # [E, R]
        still = []
        self.turn_terms.append({})
        for e, (o, rew, term, trunc, info) in zip(live, results):
            self.turn_terms[-1][e] = {r: dict(inf.get("reward_terms") or {}) for r, inf in info.items()}
            for r, v in rew.items():
                rewards[e, self.role_index[r]] = float(v)
            for r, inf in info.items():
                for k, v in (inf.get("reward_terms") or {}).items():
                    self.terms.setdefault(k, torch.zeros(shape))[e, self.role_index[r]] += float(v)
            obs[e], infos[e] = o, info
            if not all(term.get(r, False) or trunc.get(r, False) for r in rew):
                still.append(e)
        self.rewards.append(rewards)
        return still

    def rollout(self, num_prompts: int, group_size: int, actors: Sequence[Actor], items: Sequence[int]) -> Rollout:
        return Rollout(
            num_prompts=num_prompts,
            group_size=group_size,
            roles=self.roles,
            actors=[a.id for a in actors],
            actor_roles=[tuple(self.role_index[r] for r in a.roles) for a in actors],
            items=list(items),
            steps=self.steps,
            rewards=torch.stack(self.rewards, dim=-1),  # [E, R, T]
            active=torch.stack(self.active, dim=-1),  # [E, A, T]
            states=self.states,
            reward_terms=self.terms,
            infos={
                "actions": self.actions,
                "reward_terms_by_turn": self.turn_terms,
                "parse_failures": self.parse_failures,
                "role_active": torch.stack(self.role_active, dim=-1),  # [E, R, T]
                "role_chars": self.role_chars,
                "time_generate": self.time_generate,
                "time_env": self.time_env,
            },
        )
