"""Which agents train at each step: every trainable agent, a fixed set, or groups that take turns.

`TrainConfig.trainable_agents` lists agents, or groups of agents joined by "+" ("a+b"); with
`alternate_every = k > 0` the entries take turns, k steps each, in the order given (an empty list
alternates over every trainable agent, one at a time). An agent frozen at a step still acts, but
the trainer drops its update job: no loss, no optimizer step, no weight-version bump. Agents with
`trainable=False` never train and may not be listed. The schedule is a pure function of the step,
so a resumed run follows it exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from textzoo.algorithms.batch import Job
from textzoo.errors import ConfigError


@dataclass(frozen=True)
class TrainableSchedule:
    """Groups of agents that train; all of them every step (`every` = 0) or in turns of `every` steps."""

    groups: tuple[frozenset[str], ...]
    agents: frozenset[str]
    """Every actor id of the team (jobs of other learners, e.g. critics, are never dropped)."""
    every: int = 0

    def at(self, step: int) -> frozenset[str]:
        """Agents that train at (0-based) `step`."""
        if not self.every:
            return frozenset().union(*self.groups)
        return self.groups[(step // self.every) % len(self.groups)]

    def filter(self, jobs: Iterable[Job], step: int) -> list[Job]:
        """The jobs that run at `step`: those of agents training now and of non-agent learners."""
        now = self.at(step)
        return [job for job in jobs if job.learner in now or job.learner not in self.agents]


def build_schedule(
    entries: Sequence[str], every: int, agents: Sequence[str], trainable: Iterable[str]
) -> TrainableSchedule:
    """Parse `trainable_agents` entries against the team's `agents` (of which `trainable` may learn)."""
    trainable = [a for a in agents if a in set(trainable)]
    if every < 0:
        raise ConfigError(f"alternate_every must be >= 0 (0 = no alternation), got {every}")
    if not entries:
        groups = tuple(frozenset([a]) for a in trainable) if every else (frozenset(trainable),)
    else:
        groups = tuple(frozenset(name.strip() for name in entry.split("+")) for entry in entries)
    listed = [a for g in groups for a in g]
    unknown = sorted(set(listed) - set(agents))
    if unknown:
        raise ConfigError(
            f"trainable_agents names {unknown}, which are not agents of this team; agents: {list(agents)}"
        )
    frozen = sorted(set(listed) - set(trainable))
    if frozen:
        raise ConfigError(
            f"trainable_agents lists {frozen}, whose AgentConfig has trainable=False; set trainable=true in "
            "agent_overrides or drop them from trainable_agents"
        )
    if entries and len(listed) != len(set(listed)):
        raise ConfigError(f"trainable_agents lists an agent more than once: {list(entries)}")
    if every and not any(groups):
        raise ConfigError("alternate_every is set but no agent is trainable; set trainable=true for some agent")
    return TrainableSchedule(groups, frozenset(agents), every)
