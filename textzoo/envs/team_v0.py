"""textzoo/Team-v0: any prompt dataset plus TRL-style reward functions, as a team task.

Three lines turn a dataset and a reward into a PettingZoo task::

    from textzoo.envs import make
    def brief(prompts, completions, **kwargs): return [1.0 if len(c.split()) <= 20 else 0.0 for c in completions]
    env = make("textzoo/Team-v0", prompts=["Name a color.", "Describe rain."], agents=2, reward_fns=brief, split="all")

Roles: N agents (`agents=N` gives `agent_0 .. agent_{N-1}`; or a list of names), N >= 1.
Turns: one; every agent answers its prompt at once and the episode ends.

Observations: the item's prompt (`prompt_field` of the row, or for each agent its own field when
`prompt_field` is a dict agent -> field). A chat-style prompt (a list of `{"role", "content"}`
messages) is shown as `role: content` lines. Prompts are cut to `max_prompt_chars`.

Actions: any string (cleaned by `TextParallelEnv`).

Rewards, for agent i with completion c_i:
- own_i = sum_k w_k f_k(prompts=[p_i], completions=[c_i], agent_id=i,
  other_completions={j: [c_j] for j != i}, **columns) over `reward_fns` f_k with `reward_weights`
  w_k (default 1): TRL's weighted sum. `columns` are the row's other fields, each as a one-element
  list (TRL passes dataset columns the same way). A `None` value counts 0 with a note.
- team = `team_reward_fn(prompts=[p], completions=[{agent: c_agent, ...}], **columns)[0]`
  (0 without a `team_reward_fn`); `p` is the shared prompt (the first agent's for per-agent prompts).
- reward_i = own_i + team. With only a `team_reward_fn` every agent gets the team reward.
Reward functions take either of TRL's formats (`textzoo.envs.rewards`): "standard" (completions as
`list[str]`) or "conversational" (each completion `[{"role": "assistant", "content": c}]`, prompts
and `other_completions` as message lists), decided per function by `reward_format` (one for all,
or one per function), else by the `completions` annotation, else by the data as TRL does
(conversational when every prompt is a message list); ambiguous cases raise `EnvError`. The team
reward's completions are dicts agent -> text in both formats.
`infos[i]["reward_terms"]` = {name of f_k: f_k value (unweighted), ..., "team": team (when set)}.
`reward_fns` may also be a dict agent -> function(s) (with `reward_weights` a dict too) to give
roles different rewards. Non-finite values score 0 with a note; wrong output shapes raise
`EnvError` (a bug in the reward function, not a bad action). A reward function that raises stops
with an `EnvError` naming the function, the item, the agent and the exception; with
`on_reward_error="score"` the sample gets `reward_error_value` for that function instead, a note,
and a count in the `reward_errors` term (logged as `reward/reward_errors`), and the run goes on.

Items: the dataset rows (`prompts`: a list of str or dicts, a JSONL path or a `datasets.Dataset`).
`split="train"|"eval"` keeps rows k with k % 5 != 4 | k % 5 == 4; `split="all"` keeps every row
(for data that is already split). `options={"index": i}` picks row i of the split.

Version history:
- v0: first version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textzoo.envs._sources import load_records, split_indices
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.declare import SPLIT, anything, entry_points, integer, number, one_of, task, text_args
from textzoo.envs.rewards import ERRORS_TERM, RewardFunctions, is_messages
from textzoo.errors import EnvError

RESERVED = ("prompts", "completions", "agent_id", "other_completions")


def _agent_names(agents: Any) -> list[str]:
    if integer(2, low=1).accepts(agents):
        return [f"agent_{i}" for i in range(agents)]
    if isinstance(agents, Sequence) and not isinstance(agents, str):
        names = list(agents)
        if names and all(isinstance(a, str) and a for a in names) and len(set(names)) == len(names):
            return names
    raise EnvError(f"agents must be a positive int or a list of distinct non-empty names, got {agents!r}")


def render_prompt(prompt: Any) -> str:
    """A dataset prompt as text: strings as is, chat messages as `role: content` lines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "content" in m for m in prompt):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in prompt)
    return str(prompt)


def _prompt_fields(prompt_field: Any, names: list[str]) -> dict[str, str]:
    """Agent -> the row field holding its prompt."""
    if isinstance(prompt_field, str):
        return dict.fromkeys(names, prompt_field)
    if isinstance(prompt_field, Mapping) and set(prompt_field) == set(names):
        return dict(prompt_field)
    raise EnvError(
        f"prompt_field must be a field name or a dict with one field per agent {names}, got {prompt_field!r}"
    )


def _per_agent_rewards(
    names: list[str], reward_fns: Any, reward_weights: Any, reward_format: Any, provided: tuple, on_error: dict
) -> dict[str, RewardFunctions | None]:
    """Agent -> its reward functions (None without any): one set shared by all, or one per agent."""
    if reward_fns is None:
        return dict.fromkeys(names)
    if not isinstance(reward_fns, Mapping):
        if isinstance(reward_weights, Mapping):
            raise EnvError(
                "reward_weights must be a list (one weight per reward function) when reward_fns is not a dict"
            )
        if isinstance(reward_format, Mapping):
            raise EnvError("reward_format may be a dict agent -> format only when reward_fns is a dict")
        shared = RewardFunctions(
            reward_fns, reward_weights, provided, arg="reward_fns", reward_format=reward_format, **on_error
        )
        return dict.fromkeys(names, shared)
    if set(reward_fns) != set(names):
        raise EnvError(f"reward_fns as a dict needs one entry per agent {names}, got {sorted(reward_fns)}")
    if reward_weights is not None and not (isinstance(reward_weights, Mapping) and set(reward_weights) <= set(names)):
        raise EnvError("reward_weights must be a dict agent -> weights when reward_fns is a dict")
    out: dict[str, RewardFunctions | None] = {}
    for a in names:
        weights = None if reward_weights is None else reward_weights.get(a)
        fmt = reward_format.get(a, "auto") if isinstance(reward_format, Mapping) else reward_format
        out[a] = RewardFunctions(
            reward_fns[a], weights, provided, arg=f"reward_fns[{a!r}]", reward_format=fmt, **on_error
        )
    return out


@task(
    "team_v0",
    prompts=anything(None, doc="a list of str or dicts, a JSONL path or a datasets.Dataset (required)"),
    agents=anything(2, doc="N (agent_0 .. agent_{N-1}) or a list of distinct names"),
    reward_fns=anything(None, doc="TRL-style reward function(s), or a dict agent -> function(s)"),
    reward_weights=anything(None, doc="one weight per reward function (a dict agent -> weights for a dict)"),
    team_reward_fn=anything(None, doc="one reward of the whole team's completions"),
    prompt_field=anything("prompt", doc="the row field holding the prompt, or a dict agent -> field"),
    split=SPLIT,
    on_reward_error=one_of("raise", "raise", "score", doc="stop on a raising reward function, or score it"),
    reward_error_value=number(0.0, doc="the score of a reward function that raised (on_reward_error='score')"),
    reward_format=anything("auto", doc="'auto', 'standard' or 'conversational'; one per function or per agent"),
    **text_args(max_prompt_chars=2048),
)
class TeamEnv(TextParallelEnv):
    """Team-v0: a dataset of prompts answered by N agents, scored by TRL-style reward functions."""

    def __init__(
        self,
        prompts,
        agents,
        reward_fns,
        reward_weights,
        team_reward_fn,
        prompt_field,
        split,
        on_reward_error,
        reward_error_value,
        reward_format,
        **text: Any,
    ):
        names = _agent_names(agents)
        super().__init__(names, num_turns=1, **text)
        self.split = split
        if prompts is None:
            raise EnvError("prompts is required: a list of str or dicts, a JSONL path or a datasets.Dataset")
        if reward_fns is None and team_reward_fn is None:
            raise EnvError("give reward_fns (per agent), team_reward_fn (one team reward), or both")
        self.prompt_fields = _prompt_fields(prompt_field, names)
        fields = list(dict.fromkeys(self.prompt_fields.values()))
        rows = load_records(prompts, fields[0], "prompts")
        for f in fields[1:]:
            missing = [i for i, row in enumerate(rows) if f not in row]
            if missing:
                raise EnvError(f"row {missing[0]} of prompts has no field {f!r} named in prompt_field")
        self._rows = [rows[k] for k in split_indices(len(rows), self.split)]
        if not self._rows:
            raise EnvError(
                f"split={self.split!r} of {len(rows)} prompts is empty; the eval split holds every 5th row, "
                "so give at least 5 rows (or split='all')"
            )
        clash = sorted(set(RESERVED) & {str(k) for row in self._rows for k in row if k not in fields})
        if clash:
            raise EnvError(f"prompts has column(s) {clash}, which clash with reward function arguments; rename them")

        chat = [is_messages(row[f]) for row in self._rows for f in fields]
        on_error = {
            "on_error": on_reward_error,
            "error_value": reward_error_value,
            "conversational_data": True if all(chat) else False if not any(chat) else None,
        }
        columns = sorted({k for row in self._rows for k in row if k not in fields}, key=str)
        provided = (*RESERVED, *columns)
        self.reward_fns = _per_agent_rewards(names, reward_fns, reward_weights, reward_format, provided, on_error)
        self.team_reward_fn = (
            None
            if team_reward_fn is None
            else RewardFunctions(
                [team_reward_fn], None, ("prompts", "completions", *columns), arg="team_reward_fn", **on_error
            )
        )
        self.row: dict[str, Any] = {}

    def num_items(self) -> int:
        return len(self._rows)

    def _reset_task(self, index: int) -> dict[str, str]:
        self.row = self._rows[index]
        return {a: render_prompt(self.row[f]) for a, f in self.prompt_fields.items()}

    def _where(self) -> str:
        return f"item {self.item_index} of split {self.split!r}"

    def _columns(self) -> dict[str, list[Any]]:
        fields = set(self.prompt_fields.values())
        return {k: [v] for k, v in self.row.items() if k not in fields}

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        columns = self._columns()
        rewards: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        extra: dict[str, list[str]] = {a: [] for a in self.possible_agents}
        for a in self.possible_agents:
            fns = self.reward_fns[a]
            own, own_terms = 0.0, {}
            if fns is not None:
                others = {b: [actions[b]] for b in self.possible_agents if b != a}
                prompt = self.row[self.prompt_fields[a]]
                kwargs = {"agent_id": a, "other_completions": others, **columns}
                totals, per_fn, fn_notes = fns.score(
                    [prompt], [actions[a]], kwargs, where=f"{self._where()}, agent {a!r}"
                )
                own, own_terms = totals[0], per_fn[0]
                extra[a] += fn_notes[0]
            rewards[a], terms[a] = own, dict(own_terms)
        if self.team_reward_fn is not None:
            prompt = self.row[self.prompt_fields[self.possible_agents[0]]]
            totals, team_terms, team_notes = self.team_reward_fn.score(
                [prompt], [dict(actions)], columns, where=f"{self._where()}, the team reward"
            )
            for a in self.possible_agents:
                rewards[a] += totals[0]
                terms[a]["team"] = totals[0]
                if ERRORS_TERM in team_terms[0]:
                    terms[a][ERRORS_TERM] = terms[a].get(ERRORS_TERM, 0.0) + team_terms[0][ERRORS_TERM]
                extra[a] += team_notes[0]
        return StepResult(rewards=rewards, reward_terms=terms, notes=extra)


parallel_env, env, raw_env = entry_points(TeamEnv)
