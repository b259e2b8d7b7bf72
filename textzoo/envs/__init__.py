"""Text tasks as PettingZoo parallel environments: declared arguments, the registry and the conformance check.

Everything a task author needs is importable from here (`docs/templates/task_v0.py` uses nothing else).
"""

from textzoo.envs._sources import split_indices
from textzoo.envs.base import TEXT_CHARSET, StepResult, TextParallelEnv, clean_text, words
from textzoo.envs.checks import check_env
from textzoo.envs.declare import (
    RENDER_MODE,
    SPLIT,
    Arg,
    anything,
    entry_points,
    instance_of,
    integer,
    number,
    one_of,
    task,
    text_args,
)
from textzoo.envs.registry import EnvSpec, make, register, registry, spec

__all__ = [
    "RENDER_MODE",
    "SPLIT",
    "TEXT_CHARSET",
    "Arg",
    "EnvSpec",
    "StepResult",
    "TextParallelEnv",
    "anything",
    "check_env",
    "clean_text",
    "entry_points",
    "instance_of",
    "integer",
    "make",
    "number",
    "one_of",
    "register",
    "registry",
    "spec",
    "split_indices",
    "task",
    "text_args",
    "words",
]

register("textzoo/Writing-v0", "textzoo.envs.writing_v0:parallel_env")
# the pure length-ratio reward of Writing-v0: what `textzoo train` learns by default
register("textzoo/WritingRatio-v0", "textzoo.envs.writing_v0:parallel_env", terms={"length_ratio": 1.0})
register("textzoo/Code-v0", "textzoo.envs.code_v0:parallel_env")
register("textzoo/Relay-v0", "textzoo.envs.relay_v0:parallel_env")
register("textzoo/Team-v0", "textzoo.envs.team_v0:parallel_env")
register("textzoo/Refine-v0", "textzoo.envs.refine_v0:parallel_env")
register("textzoo/Sudoku-v0", "textzoo.envs.sudoku_v0:parallel_env")
register("textzoo/PlanPath-v0", "textzoo.envs.planpath_v0:parallel_env")
register("textzoo/Sokoban-v0", "textzoo.envs.sokoban_v0:parallel_env")
register("textzoo/Debate-v0", "textzoo.envs.debate_v0:parallel_env")
register("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0:parallel_env")  # extra textzoo[reasoning-gym]
# any TextArena game (extra textzoo[textarena]); also every `textarena/<game id>` (registry.NAMESPACES)
register("textzoo/TextArena-v0", "textzoo.interop.textarena:parallel_env")
