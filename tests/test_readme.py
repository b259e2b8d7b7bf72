"""Every Python example of README.md and CONTRIBUTING.md runs as written (in a scratch directory)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
GUIDE = README.parent / "CONTRIBUTING.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
RECIPES = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def run_example(code: str, tmp_path: Path) -> str:
    """Run `code` as a script in `tmp_path` with one torch thread; return its stdout."""
    script = tmp_path / "example.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_readme_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    run_example(BLOCKS[index], tmp_path)


def test_the_guide_has_the_task_and_algorithm_recipes():
    assert len(RECIPES) == 2 and "register(" in RECIPES[0] and "register_algorithm(" in RECIPES[1]


def test_the_task_recipe_names_templates_and_files_that_exist():
    recipe = GUIDE.read_text().split("## Recipe 1")[1].split("## Recipe 2")[0]
    assert "@task(" in recipe and "entry_points(" in recipe
    for path in ("docs/templates/task_v0.py", "tests/test_task_template.py", "textzoo/envs/__init__.py"):
        assert path in recipe and (README.parent / path).is_file(), path


@pytest.mark.parametrize("index", range(len(RECIPES)))
def test_contributing_recipe_runs(index, tmp_path):
    assert 0.0 <= float(run_example(RECIPES[index], tmp_path).strip().splitlines()[-1]) <= 1.0  # the run's reward


def test_the_math_table_names_functions_and_tests_that_exist():
    import textzoo.algorithms.rlmath as rlmath

    table = README.read_text().split("<!-- math table")[1].split("\n\n")[0]
    rows = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| `") or line.startswith("| every")]
    tests = (README.parent / "tests" / "test_rlmath.py").read_text()
    assert len(rows) == 11
    for _, functions, checks in rows:
        named = re.findall(r"`([A-Za-z_]\w*)[`(]", functions)  # identifiers and calls; flags start with --
        assert named and all(hasattr(rlmath, f) for f in named), (functions, named)
        test_names = re.findall(r"`(test_\w+)`", checks)
        assert test_names and all(f"def {t}(" in tests for t in test_names), checks
