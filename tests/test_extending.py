"""Extending textzoo without forking it: a task and an algorithm in the user's own package reach the command
line (``--env my_pkg.tasks:me/Echo-v0``, ``--algo my_pkg.algos:name``, or entry points), an estimator and a
loss aggregation join their one registry, and the templates use public names only.

The plugin package is real: written to a temporary folder with a ``.dist-info`` whose ``entry_points.txt``
makes its entry points visible to `importlib.metadata` (what pip would install), and trained from the
command line in a subprocess.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TASKS = '''
"""Echo: each agent repeats a word; a task with one set of items (no `split` argument)."""
from textzoo.envs import StepResult, TextParallelEnv, entry_points, register, task, text_args

WORDS = ["apple", "river", "stone", "cloud", "green"]


@task("echo_v0", **text_args(max_prompt_chars=64))
class EchoEnv(TextParallelEnv):
    def __init__(self, **text):
        super().__init__(["alice", "bob"], num_turns=1, **text)

    def num_items(self):
        return len(WORDS)

    def _reset_task(self, index):
        self.word = WORDS[index]
        return {a: f"Repeat the word: {self.word}\\nAnswer:" for a in self.possible_agents}

    def _step_task(self, actions, notes):
        exact = {a: float(actions[a].strip() == self.word) for a in actions}
        return StepResult(rewards=exact, reward_terms={a: {"exact": exact[a]} for a in actions})


parallel_env, env, raw_env = entry_points(EchoEnv)
register(NAME, parallel_env)
'''

ALGOS = '''
"""A REINFORCE variant: the median of each group as the baseline, registered in one place each."""
from textzoo.algorithms.registry import register_algorithm
from textzoo.algorithms.reinforce.entries import reinforce_algorithm
from textzoo.algorithms.settings import register_estimator


def median_advantages(returns, mask, greedy_returns=None, running_mean=None):
    return returns - returns.median(dim=1, keepdim=True).values


def register():
    register_estimator(ESTIMATOR, median_advantages, group=True)
    register_algorithm(ALGO, reinforce_algorithm(ESTIMATOR))
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """A folder holding the package `echo_plugin` and its dist-info: `echo_plugin.tasks` / `.algos` register
    me/Echo-v0 and maecho when imported (module:name ids); the entry points register me/EchoEP-v0 and
    maecho_ep when textzoo loads them."""
    site = tmp_path_factory.mktemp("site")
    pkg = site / "echo_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(TASKS.replace("NAME", '"me/Echo-v0"'))
    (pkg / "ep_tasks.py").write_text(TASKS.replace("NAME", '"me/EchoEP-v0"'))
    (pkg / "algos.py").write_text(ALGOS.replace("ESTIMATOR", '"median"').replace("ALGO", '"maecho"') + "register()\n")
    (pkg / "ep_algos.py").write_text(ALGOS.replace("ESTIMATOR", '"median_ep"').replace("ALGO", '"maecho_ep"'))
    info = site / "echo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[textzoo.tasks]\necho = echo_plugin.ep_tasks\n\n[textzoo.algorithms]\necho = echo_plugin.ep_algos:register\n"
    )
    return site


def textzoo(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = "import sys; from textzoo.runners.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=900)


TINY = [
    "--steps", "1", "--batch-prompts", "2", "--group-size", "2", "--eval-prompts", "2", "--eval-modes", "greedy",
    "--agent.n-layer", "1", "--agent.n-embd", "16", "--agent.n-head", "1", "--agent.max-new-tokens", "4",
    "--no-progress", "--no-plot",
]  # fmt: skip


def test_a_task_and_an_algorithm_of_the_users_module_train_from_the_command_line(plugin, tmp_path):
    run = tmp_path / "run"
    done = textzoo(
        plugin, "train", "--env", "echo_plugin.tasks:me/Echo-v0", "--algo", "echo_plugin.algos:maecho",
        "--run-dir", str(run), *TINY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "reward/mean" in rows[-1]
    config = json.loads((run / "config.json").read_text())
    assert (config["env"], config["algo"]) == ("echo_plugin.tasks:me/Echo-v0", "echo_plugin.algos:maecho")
    # Echo declares no `split`: the default eval_env_kwargs ({"split": "eval"}) is dropped with a note
    assert "takes no `split`: held-out evaluation plays its training items" in " ".join(done.stderr.split())


def test_entry_points_register_tasks_and_algorithms_and_help_lists_them(plugin, tmp_path):
    helped = textzoo(plugin, "train", "--help")
    assert helped.returncode == 0, helped.stderr[-3000:]
    listed = " ".join(helped.stdout.split())  # rich wraps the lines
    assert "me/EchoEP-v0" in listed and "maecho_ep" in listed and "magrpo" in listed and "textzoo/Debate-v0" in listed
    run = tmp_path / "run"
    done = textzoo(plugin, "train", "--env", "me/EchoEP-v0", "--algo", "maecho_ep", "--run-dir", str(run), *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
    bad = textzoo(plugin, "train", "--env", "echo_plugin.nowhere:me/Echo-v0", "--run-dir", str(run), *TINY)
    assert bad.returncode == 2 and "cannot import module 'echo_plugin.nowhere'" in bad.stderr


def test_an_estimator_and_an_aggregation_join_their_one_registry():
    import torch

    from textzoo.algorithms import rlmath, settings
    from textzoo.algorithms.reinforce.config import ReinforceConfig
    from textzoo.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown estimator 'half'; choose one of grpo, rloo, remax, reinforce"):
        settings.check_estimator("half", 4)
    with pytest.raises(ConfigError, match="reinforce.loss_aggregation 'double' is not registered"):
        ReinforceConfig(loss_aggregation="double")
    returns = torch.tensor([[1.0, 3.0], [2.0, 2.0]]).view(2, 2, 1, 1)  # [B, G, A, T]
    mask = torch.ones_like(returns)
    try:
        settings.register_estimator("half", lambda r, m, greedy, running: r / 2)
        settings.register_aggregation("double", lambda token_loss, m, n: 2 * (token_loss * m).sum(-1))
        settings.check_estimator("half", 1)  # config validation sees it: no group needed
        assert ReinforceConfig(loss_aggregation="double").loss_aggregation == "double"
        adv = rlmath.advantages(returns, mask, "half", scale="none")
        assert adv.flatten().tolist() == [0.5, 1.5, 1.0, 1.0]
        norm = rlmath.BatchNorm(2, 3, 4)
        assert rlmath.aggregation_of("double")(torch.ones(2, 3), torch.ones(2, 3), norm).tolist() == [6.0, 6.0]
        with pytest.raises(ConfigError, match="already registered"):
            settings.register_estimator("grpo", lambda *a: None)
    finally:
        settings.ESTIMATORS.pop("half", None)
        settings.AGGREGATIONS.pop("double", None)
    # the built-ins through the registry are the hand-computed baselines: grpo centres each group
    assert rlmath.advantages(returns, mask, "grpo", scale="none").flatten().tolist() == [-1.0, 1.0, 0.0, 0.0]


def test_templates_and_recipes_use_public_names_only():
    """No import of a private module (a path part starting with "_") in the task template, the family
    template or the CONTRIBUTING recipes: what they show is what a user may rely on."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs" / "templates").rglob("*.py")}
    guide = (ROOT / "CONTRIBUTING.md").read_text()
    for i, block in enumerate(guide.split("```python\n")[1:]):
        sources[f"CONTRIBUTING.md block {i}"] = textwrap.dedent(block.split("```")[0])
    assert "docs/templates/task_v0.py" in sources and len(sources) >= 5
    for where, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
            private = [n for n in names if n != "__future__" and any(p.startswith("_") for p in n.split("."))]
            assert not private, (where, private)
