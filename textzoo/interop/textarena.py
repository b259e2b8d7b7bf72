"""TextArena interop: any TextArena game (`textarena>=0.7.4`, extra `textzoo[textarena]`) as a PettingZoo env.

Two forms of one game, both with textzoo's text spaces (`textzoo.envs.base.text_space`):

- `aec_env(game)`: PettingZoo's AEC form, turn-based: `agent_selection` is the player whose move it
  is (`player_0`, `player_1`, ...); the others wait.
- `parallel_env(game)`: a `ParallelEnv`, built by PettingZoo's converter (`aec_to_parallel`) from
  the AEC form in cycle mode, where every agent steps each cycle and only the player to move acts;
  the idle agents' actions are ignored (and may be left out of the actions dict). Their infos say
  `active: False`, so textzoo's runner generates only for the player to move. It is also
  registered: `make("textzoo/TextArena-v0", game="KuhnPoker-v0")` or `make("textarena/KuhnPoker-v0")`
  (any TextArena id under the `textarena/` namespace), so `textzoo train --env textarena/TicTacToe-v0`
  trains on it.

Items: item k is the game reset with `seed=k`; `num_items` (default 1000) sets the pool and
`split="train"|"eval"|"all"` keeps k % 5 != 4 | k % 5 == 4 | all (`textzoo.envs._sources`), as in
the built-in tasks; `reset(options={"index": i})` plays item i of the split.

Observations: TextArena's own text for the player to move (with the game's default wrappers: the
rules and the game's messages so far, cut to its last `max_prompt_chars` characters, where the
current board is); a waiting player sees "Waiting: it is player_k's move."

Actions: any string, cleaned as textzoo's tasks clean them (`textzoo.envs.base.clean_text`) and
passed to the game. A move the game refuses is **illegal**: reward `illegal_reward` (default -1)
for the mover, term `illegal` 1 (`legal` 0) and a note in `infos[agent]["notes"]`; TextArena then asks for the
move again (its error allowance) or ends the game. A game that raises on an action ends, the mover
scored `illegal_reward` with a note: never a crash.

Rewards: at the end of the game each player gets its outcome from TextArena (`env.close()`:
1 win, -1 loss, 0 draw in the two-player games), term `outcome`; each move the mover's terms are
`legal` and `illegal` (1 for a legal move and 0, or 0 and 1), so summed over an episode (the
`reward/<term>` metrics) they count moves and legal / (legal + illegal) is the legal-move rate.
A game that reaches `max_moves` moves is truncated (outcome 0).
`infos[agent]` also carries `turn` (moves so far), `active`, `item`, `reward_terms` and `notes`.

`state()` is the global text view: every move so far and the current player's observation.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from gymnasium.utils import seeding
from pettingzoo import AECEnv
from pettingzoo.utils.conversions import aec_to_parallel_wrapper

from textzoo.envs._sources import import_extra, split_indices
from textzoo.envs.base import clean_text, text_space
from textzoo.envs.declare import SPLIT, Arg, integer, number, task, text_args
from textzoo.errors import EnvError

ILLEGAL_NOTE = "illegal move: {reason}"


def _ta() -> Any:
    return import_extra("textarena", "textzoo.interop.textarena", "textarena", "textarena>=0.7.4")


def game_ids() -> list[str]:
    """Every game id TextArena registers, sorted."""
    _ta()
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def _make_game(game: str) -> Any:
    ta = _ta()
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise EnvError(f"game={game!r} is not a TextArena id.{hint} textzoo.interop.textarena.game_ids() lists them")
    return ta.make(game)


@task(
    "textarena",
    game=Arg("TicTacToe-v0", str, doc="a TextArena game id (textzoo.interop.textarena.game_ids())"),
    num_players=integer(2, low=1),
    cycle=Arg(False, bool, doc="step every agent each cycle (what parallel_env runs)"),
    split=SPLIT,
    num_items=integer(1000, low=1, doc="seeds of the game (the eval split keeps every 5th)"),
    illegal_reward=number(-1.0, doc="the reward of a move the game refuses"),
    max_moves=integer(200, low=1, doc="moves before the episode is truncated"),
    **text_args(max_action_chars=1024),
)
class TextArenaAEC(AECEnv):
    """A TextArena game as a PettingZoo AEC env; `cycle=True` steps every agent each cycle (module docstring)."""

    metadata = {"name": "textarena", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        game,
        num_players,
        cycle,
        split,
        num_items,
        illegal_reward,
        max_moves,
        max_prompt_chars,
        max_action_chars,
        render_mode,
    ):
        super().__init__()
        _make_game(game)  # fail now, with the close ids, not at the first reset
        self.game_id = game
        self.metadata = {**self.metadata, "name": "textarena_" + re.sub(r"\W", "_", game)}
        self.num_players = num_players
        self.cycle = cycle
        self.split = split
        self._items = split_indices(num_items, self.split)
        if not self._items:
            raise EnvError(f"split={split!r} of {num_items} items is empty; give num_items >= 5 (or split='all')")
        self.illegal_reward = float(illegal_reward)
        self.max_moves = max_moves
        self.max_prompt_chars = max_prompt_chars
        self.max_action_chars = max_action_chars
        self.render_mode = render_mode
        self.possible_agents = [f"player_{i}" for i in range(self.num_players)]
        self.agents = []
        self._obs_spaces = {a: text_space(self.max_prompt_chars) for a in self.possible_agents}
        self._act_spaces = {a: text_space(self.max_action_chars) for a in self.possible_agents}
        self.np_random, _ = seeding.np_random(None)
        self.game: Any = None
        self.item_index = -1

    # ---- PettingZoo API --------------------------------------------------------------------
    def observation_space(self, agent: str):
        return self._obs_spaces[agent]

    def action_space(self, agent: str):
        return self._act_spaces[agent]

    def num_items(self) -> int:
        """Games (seeds) in the split."""
        return len(self._items)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self._items)))
        elif not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self._items):
            raise EnvError(f"options['index'] must be an int in [0, {len(self._items)}), got {index!r}")
        self.item_index = index
        self.game = _make_game(self.game_id)
        self.game.reset(num_players=self.num_players, seed=self._items[index])
        self._invalid: list[str] = []
        state = self.game.state
        refuse = state.set_invalid_move

        def recorded(*args: Any, **kwargs: Any) -> Any:  # how a game says a move was illegal
            self._invalid.append(str(args[0] if args else kwargs.get("reason", "")))
            return refuse(*args, **kwargs)

        state.set_invalid_move = recorded
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.history: list[str] = []
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self._pending: dict[str, float] | None = None  # the outcome, paid at the end of the cycle
        self._read_turn()
        self.infos = {a: self._info(a) for a in self.agents}
        self.agent_selection = self.agents[0] if self.cycle else self.mover
        self._cycle_start()

    def observe(self, agent: str) -> str:
        if agent == self.mover and self._pending is None:
            return self._text
        return f"Waiting: it is {self.mover}'s move."

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(None)  # a finished player's action is ignored
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if not self.cycle or agent == self.agents[0]:  # a new cycle: its infos say what it did
            for a in self.agents:
                self.infos[a]["reward_terms"], self.infos[a]["notes"] = {}, []
        if agent == self._cycle_mover and self._pending is None:
            self._play(agent, action)
        last = not self.cycle or agent == self.agents[-1]
        if last:
            self._end_cycle()
        else:
            self.agent_selection = self.agents[self.agents.index(agent) + 1]
        self._accumulate_rewards()

    def state(self) -> str:
        parts = list(self.history)
        if self.agents and self._pending is None:
            parts.append(f"<{self.mover} observation>\n{self._text}")
        return "\n".join(parts)

    def render(self) -> str | None:
        return None if self.render_mode is None else self.state()

    def close(self) -> None:
        pass

    # ---- the game ----------------------------------------------------------------------------
    def _read_turn(self) -> None:
        pid, text = self.game.get_observation()
        self.mover = self.possible_agents[int(pid)]
        text = text if isinstance(text, str) else str(text)
        text, _ = clean_text(text[-self.max_prompt_chars :], self.max_prompt_chars)
        self._text = text

    def _info(self, agent: str) -> dict[str, Any]:
        return {
            "turn": self.moves,
            "active": agent == self.mover and self._pending is None,
            "item": self.item_index,
            "reward_terms": {},
            "notes": [],
        }

    def _cycle_start(self) -> None:
        self._cycle_mover = self.mover

    def _play(self, agent: str, action: Any) -> None:
        text, notes = clean_text("" if action is None else action, self.max_action_chars)
        if action is None:
            notes = ["no action given; treated as empty"]
        before = len(self._invalid)
        self.history.append(f"<{agent} move {self.moves}>\n{text}")
        info = self.infos[agent]
        try:
            done, _ = self.game.step(text)
        except Exception as e:  # a game that breaks on odd text: the mover forfeits it, no crash
            self._invalid.append(f"the game raised {type(e).__name__}: {str(e)[:160]}")
            done = True
            self._pending = dict.fromkeys(self.agents, 0.0)  # the illegal-move reward below is the forfeit
        self.moves += 1
        illegal = len(self._invalid) > before
        info["reward_terms"]["legal"] = 0.0 if illegal else 1.0
        info["reward_terms"]["illegal"] = 1.0 if illegal else 0.0
        if illegal:
            self.rewards[agent] += self.illegal_reward
            notes.append(ILLEGAL_NOTE.format(reason=self._invalid[-1] or "the game refused it"))
        info["notes"] += notes
        if self._pending is None and done:
            outcome, _ = self.game.close()
            outcome = outcome or {}
            self._pending = {
                a: float(outcome.get(i, 0.0)) for i, a in enumerate(self.possible_agents) if a in self.agents
            }
        elif self._pending is None:
            if self.moves >= self.max_moves:
                self._pending = dict.fromkeys(self.agents, 0.0)
                self.truncations = dict.fromkeys(self.agents, True)
            else:
                self._read_turn()

    def _end_cycle(self) -> None:
        if self._pending is not None:
            for a, r in self._pending.items():
                self.rewards[a] += r
                self.infos[a]["reward_terms"]["outcome"] = r
            if not any(self.truncations.values()):
                self.terminations = dict.fromkeys(self.agents, True)
            for a in self.agents:
                self.infos[a]["active"] = False
            self.agent_selection = self.agents[0]
            return
        for a in self.agents:  # the cycle's terms and notes stay readable until the next cycle starts
            self.infos[a]["active"], self.infos[a]["turn"] = a == self.mover, self.moves
        self.agent_selection = self.agents[0] if self.cycle else self.mover
        self._cycle_start()


class TextArenaParallel(aec_to_parallel_wrapper):
    """The parallel form: PettingZoo's converter over the cycle-mode AEC; an idle agent's action is ignored
    and may be missing."""

    def __init__(self, aec: TextArenaAEC):
        if not aec.cycle:
            raise EnvError("the parallel form needs the AEC env in cycle mode (TextArenaAEC(cycle=True))")
        super().__init__(aec)

    def num_items(self) -> int:
        return self.aec_env.num_items()

    def step(self, actions: dict[str, Any]):
        filled = {a: actions.get(a, "") for a in self.aec_env.agents}
        mover = self.aec_env.mover
        out = super().step(filled)
        if mover not in actions and mover in out[4]:
            out[4][mover]["notes"].insert(0, "no action given; treated as empty")
        return out


def aec_env(game: str = "TicTacToe-v0", **kwargs: Any) -> TextArenaAEC:
    """The turn-based AEC form of TextArena game `game` (keyword arguments: `TextArenaAEC`)."""
    return TextArenaAEC(game, **kwargs)


def parallel_env(game: str = "TicTacToe-v0", **kwargs: Any) -> TextArenaParallel:
    """The parallel form of TextArena game `game`, through PettingZoo's converter (see the module docstring)."""
    if "cycle" in kwargs:
        raise EnvError("parallel_env always runs the AEC form in cycle mode; do not pass cycle")
    return TextArenaParallel(TextArenaAEC(game, cycle=True, **kwargs))
