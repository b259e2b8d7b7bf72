"""textzoo/Count-v0: a writer writes exactly the number of words it is asked for.

(The template of a built-in task: copy it to `textzoo/envs/<name>_v0.py`, then replace the name,
this docstring, the declaration and the three methods; CONTRIBUTING.md, "Recipe 1: add a task".
This docstring is the task's specification: roles, observations, actions, rewards, turns, items,
version history.)

Roles: `writer`.
Turns: one; the episode ends after the writer's answer.

Observations (at most `max_prompt_chars`)::

    Write exactly {target} words:

Actions: any string (cleaned by `TextParallelEnv`: too long, non-text or control characters get a
note in `infos[agent]["notes"]`, never an exception).

Rewards: with n = the number of words (`textzoo.envs.words`) and N = the target,
`count` = max(0, 1 - |n - N| / N); the reward is `count` and `infos["writer"]["reward_terms"]` is
`{"count": count}`.

Items: the targets `min_words` .. `max_words`; `split="train"|"eval"` keeps items k with
k % 5 != 4 | k % 5 == 4, `split="all"` every item (`textzoo.envs.split_indices`);
`options={"index": i}` picks item i of the split.

Version history:
- v0: first version.
"""

from __future__ import annotations

from typing import Any

from textzoo.envs import (
    SPLIT,
    StepResult,
    TextParallelEnv,
    entry_points,
    integer,
    split_indices,
    task,
    text_args,
    words,
)
from textzoo.errors import EnvError

PROMPT = "Write exactly {target} words:"


@task(
    "count_v0",
    min_words=integer(2, low=1, doc="the shortest target"),
    max_words=integer(11, low=1, doc="the longest target"),
    split=SPLIT,
    **text_args(max_prompt_chars=64),
)
class CountEnv(TextParallelEnv):
    """Count-v0: the writer writes exactly N words; see the module docstring."""

    def __init__(self, min_words, max_words, split, **text: Any):
        # what the declaration cannot say: a rule that ties two arguments together
        if min_words > max_words:
            raise EnvError(f"count_v0: min_words must be <= max_words, got {min_words} > {max_words}")
        super().__init__(["writer"], num_turns=1, **text)
        targets = list(range(min_words, max_words + 1))
        self.targets = [targets[k] for k in split_indices(len(targets), split)]
        if not self.targets:
            raise EnvError(f"count_v0: split={split!r} of {len(targets)} targets is empty; give at least 5 targets")
        self.target = self.targets[0]

    def num_items(self) -> int:
        return len(self.targets)

    def _reset_task(self, index: int) -> dict[str, str]:  # the prompts depend on the item index only
        self.target = self.targets[index]
        return {"writer": PROMPT.format(target=self.target)}

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        n = len(words(actions["writer"]))  # actions arrive as cleaned str
        count = max(0.0, 1.0 - abs(n - self.target) / self.target)
        return StepResult(rewards={"writer": count}, reward_terms={"writer": {"count": count}})


parallel_env, env, raw_env = entry_points(CountEnv)
