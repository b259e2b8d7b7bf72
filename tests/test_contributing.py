"""Every Python block of CONTRIBUTING.md (the recipes) runs as written, in a scratch directory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "CONTRIBUTING.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_guide_has_the_task_and_algorithm_recipes():
    assert len(BLOCKS) == 2 and "register(" in BLOCKS[0] and "register_algorithm(" in BLOCKS[1]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_recipe_runs(index, tmp_path):
    script = tmp_path / "recipe.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + BLOCKS[index])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 0.0 <= float(done.stdout.strip().splitlines()[-1]) <= 1.0  # the trained run's reward
