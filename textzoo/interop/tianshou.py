"""tianshou 2.x interop: textzoo agents as tianshou policies, textzoo tasks as tianshou envs.

A tianshou `Collector` then plays our LLM agents in our tasks, with prompts and completions (str)
in its buffer::

    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from textzoo.models import Policy
    from textzoo.envs import make
    from textzoo.interop.tianshou import TextPettingZooEnv, team_policy

    venv = DummyVectorEnv([lambda: TextPettingZooEnv(make("textzoo/Writing-v0"))] * 2)
    policy = team_policy({"summary": Policy.tiny(seed=0), "elaboration": Policy.tiny(seed=1)})
    collector = Collector(policy, venv, VectorReplayBuffer(64, 2))
    collector.collect(n_episode=4, reset_before_collect=True)
    collector.buffer.obs.obs, collector.buffer.act   # prompts and completions, one row per AEC step

`TextPettingZooEnv` runs the task through PettingZoo's `parallel_to_aec` and tianshou's
`PettingZooEnv`, so agents act in turn; a turn of the parallel task completes when its last agent
has acted, and `rew` ([agents]) carries the turn's rewards on that step (0 on the others).

Two frictions of tianshou 2.0.1 are absorbed here, so user code needs neither:

- tianshou's `Policy` accepts Discrete/MultiDiscrete/MultiBinary/Box action spaces only, never
  `Text`: `TextPolicy` declares `PLACEHOLDER_ACTION_SPACE` (Discrete(1)). The actions it returns
  are strings in an object array; tianshou passes them to the env untouched (`map_action` only
  rescales Box actions).
- `MultiAgentPolicy.forward` reads `batch.obs_next`, which does not exist while collecting, unless
  the observation carries an action mask: `TextPettingZooEnv` adds `mask=[True]` (every string is
  a legal action).

Each step's info is the task's per-agent info (its `notes` joined into one string, so that buffers
can stack them) plus `episode` (an id unique to each reset), `observations` (every role's current
prompt) and `roles_active` (every role's `active` flag). A joint actor reads them to answer for all
roles at once: the first role of a turn triggers one joint completion per env, parsed into every
role's action; the other roles of that turn receive their share of it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    from gymnasium import spaces
    from pettingzoo import AECEnv, ParallelEnv
    from pettingzoo.utils.conversions import parallel_to_aec
    from tianshou.algorithm.algorithm_base import Policy as TianshouPolicy
    from tianshou.algorithm.multiagent.marl import MultiAgentPolicy
    from tianshou.data import Batch
    from tianshou.env import PettingZooEnv
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("textzoo.interop.tianshou needs tianshou>=2.0: pip install 'textzoo[tianshou]'") from e

from textzoo.errors import TextzooError
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.team import Actor

PLACEHOLDER_ACTION_SPACE = spaces.Discrete(1)
"""What `TextPolicy` declares to tianshou instead of the task's `Text` space (which tianshou rejects)."""

INFO_KEYS = ("episode", "observations", "roles_active")
"""Info entries `TextPettingZooEnv` adds (see the module docstring)."""


class TextPettingZooEnv(PettingZooEnv):
    """A textzoo task (a parallel env, or an AEC env) as a tianshou multi-agent env.

    Observations are `{"agent_id": role, "obs": prompt, "mask": [True]}`; actions are strings.
    """

    def __init__(self, env: ParallelEnv | AECEnv):
        self._episode = ""
        super().__init__(parallel_to_aec(env) if isinstance(env, ParallelEnv) else env)

    def reset(self, *args: Any, **kwargs: Any) -> tuple[dict, dict]:
        self._episode = uuid.uuid4().hex
        obs, info = super().reset(*args, **kwargs)
        return self._with_mask(obs), self._info(info)

    def step(self, action: Any) -> tuple[dict, list, bool, bool, dict]:
        obs, rewards, term, trunc, info = super().step(action)
        return self._with_mask(obs), list(rewards), term, trunc, self._info(info)

    @staticmethod
    def _with_mask(obs: dict) -> dict:
        return {**obs, "mask": [True]}

    def _info(self, info: dict) -> dict:
        roles = self.env.possible_agents
        info = dict(info)
        if isinstance(info.get("notes"), list):
            info["notes"] = "; ".join(map(str, info["notes"]))
        info["episode"] = self._episode
        # a finished episode has no agents left: its roles then observe "" and act in no turn
        live = set(self.env.agents)
        info["observations"] = {r: (self.env.observe(r) if r in live else "") for r in roles}
        info["roles_active"] = {r: bool(r in live and self.env.infos.get(r, {}).get("active", True)) for r in roles}
        return info


class TextPolicy(TianshouPolicy):
    """A textzoo agent as a tianshou `Policy`: one batched `generate` per call, string actions out.

    `agent` is a `Policy` (the prompt is the observation, formatted "auto": by its chat template when
    the tokenizer has one; the action is the whole completion), a
    decentralized `Actor` (`AgentActor`: prompt and action through the actor) or a joint actor
    (one completion per env and turn for all its roles; needs `TextPettingZooEnv`'s infos).
    `greedy` takes the argmax token instead of sampling.
    """

    def __init__(self, agent: Policy | Actor, greedy: bool = False):
        super().__init__(action_space=PLACEHOLDER_ACTION_SPACE, action_scaling=False, action_bound_method=None)
        self.actor: Actor | None = None if isinstance(agent, Policy) else agent
        self.policy: Policy = agent if isinstance(agent, Policy) else agent.policy
        # registered as a submodule, so tianshou's .parameters(), .train() and state_dict see the LM
        self.model = self.policy.model
        self.greedy = greedy
        self.prompt_format = PromptFormat.resolve(getattr(self.policy, "tokenizer", None))  # for a bare Policy
        self._pending: dict[tuple[str, int], dict[str, str]] = {}  # (episode, turn) -> joint actions not yet taken

    @property
    def is_joint(self) -> bool:
        return self.actor is not None and len(self.actor.roles) > 1

    def forward(self, batch: Batch, state: Any = None, **kwargs: Any) -> Batch:
        obs = batch.obs
        texts = [str(o) for o in (obs.obs if isinstance(obs, Batch) and "obs" in obs.get_keys() else obs)]
        ids = obs.agent_id if isinstance(obs, Batch) and "agent_id" in obs.get_keys() else [None] * len(texts)
        acts = self._joint_actions(batch, list(ids)) if self.is_joint else self._actions(batch, texts, list(ids))
        return Batch(act=_object_array(acts))

    def _actions(self, batch: Batch, texts: list[str], ids: list[Any]) -> list[str]:
        """One action per row; rows whose role is inactive this turn get "" without generating."""
        active = _roles_active(batch)
        rows = [i for i, role in enumerate(ids) if active is None or role is None or active[i].get(role, True)]
        acts = [""] * len(texts)
        if not rows:
            return acts
        if self.actor is None:
            gen = self.prompt_format.generate(self.policy, [texts[i] for i in rows], greedy=self.greedy)
            for i, text in zip(rows, gen.texts):
                acts[i] = text
            return acts
        role = self.actor.roles[0]
        gen = self.actor.generate([self.actor.build_prompt({role: texts[i]}) for i in rows], greedy=self.greedy)
        for i, text in zip(rows, gen.texts):
            acts[i] = self.actor.parse(text, (role,))[0].get(role, "")
        return acts

    def _joint_actions(self, batch: Batch, ids: list[Any]) -> list[str]:
        """Generate one joint completion per (episode, turn) not seen yet; hand each role its part."""
        info = batch.info if "info" in batch.get_keys() else Batch()
        missing = [k for k in INFO_KEYS + ("turn",) if not isinstance(info, Batch) or k not in info.get_keys()]
        if missing:
            raise TextzooError(
                f"a joint actor needs the infos {missing} that TextPettingZooEnv adds; wrap the task "
                "with textzoo.interop.tianshou.TextPettingZooEnv"
            )
        keys = [(str(info.episode[i]), int(info.turn[i])) for i in range(len(ids))]
        observations = [{r: str(info.observations[r][i]) for r in self.actor.roles} for i in range(len(ids))]
        active = _roles_active(batch)
        new = list(dict.fromkeys(k for k in keys if k not in self._pending))
        first_row = {k: keys.index(k) for k in new}
        roles_of = {k: tuple(r for r in self.actor.roles if active[first_row[k]].get(r, False)) for k in new}
        todo = [k for k in new if roles_of[k]]
        for k in new:
            self._pending[k] = {}
        if todo:
            prompts = [self.actor.build_prompt({r: observations[first_row[k]][r] for r in roles_of[k]}) for k in todo]
            gen = self.actor.generate(prompts, greedy=self.greedy)
            for k, text in zip(todo, gen.texts):
                self._pending[k] = dict(self.actor.parse(text, roles_of[k])[0])
        acts = []
        for key, role in zip(keys, ids):
            pending = self._pending[key]
            acts.append(pending.pop(role, ""))
            if not pending:  # every active role has its action: drop the entry
                del self._pending[key]
        return acts


def _roles_active(batch: Batch) -> list[dict[str, bool]] | None:
    """Per row, every role's `active` flag from `TextPettingZooEnv`'s info (None without it)."""
    info = batch.info if "info" in batch.get_keys() else None
    if not isinstance(info, Batch) or "roles_active" not in info.get_keys():
        return None
    flags = info.roles_active
    roles = list(flags.get_keys())
    return [{r: bool(flags[r][i]) for r in roles} for i in range(len(flags[roles[0]]))] if roles else None


def _object_array(texts: list[str]) -> np.ndarray:
    # object dtype: a fixed-width '<U' array would truncate longer strings written into it later
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out


def team_policy(team: Mapping[str, Policy | Actor] | Sequence[Actor] | Actor, greedy: bool = False) -> MultiAgentPolicy:
    """A tianshou `MultiAgentPolicy` over a team.

    `team`: role -> `Policy` or `Actor`; or a list of actors (e.g. `Trainer.actors`); or one joint
    actor. An actor answering for several roles is one `TextPolicy` shared by them.
    """
    if isinstance(team, Mapping):
        policies = {role: TextPolicy(agent, greedy) for role, agent in team.items()}
    else:
        actors = [team] if hasattr(team, "roles") else list(team)
        policies = {}
        for actor in actors:
            shared = TextPolicy(actor, greedy)
            policies.update({role: shared for role in actor.roles})
    if not policies:
        raise TextzooError("team_policy needs at least one agent")
    return MultiAgentPolicy(policies)


__all__ = ["PLACEHOLDER_ACTION_SPACE", "TextPettingZooEnv", "TextPolicy", "team_policy"]
