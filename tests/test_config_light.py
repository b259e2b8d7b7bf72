"""The config modules are plain data: importing them (what `textzoo train --help` and a config error need)
loads neither torch nor transformers, and their name lists match the modules that do the work."""

import subprocess
import sys

import pytest

FAMILIES = ("reinforce", "actor_critic", "preference")

LIGHT = (
    "textzoo.config",
    "textzoo.config_files",
    "textzoo.typecheck",
    "textzoo.plugins",
    "textzoo.models.settings",
    "textzoo.decoding.settings",
    "textzoo.algorithms.settings",
    "textzoo.algorithms.algorithm",
    "textzoo.algorithms.registry",
    *(f"textzoo.algorithms.{family}.{part}" for family in FAMILIES for part in ("config", "entries")),
    "textzoo.runners.cli",
    "textzoo.runners.commands",
)


@pytest.mark.parametrize("module", LIGHT)
def test_importing_a_config_module_loads_no_torch(module):
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} imported {out}"


def test_a_bad_config_fails_without_torch(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('algo = "magrpo"\nsteps = "x"\n')
    code = (
        "import sys\n"
        "from textzoo.errors import ConfigError\n"
        "from textzoo.config import TrainConfig\n"
        "from textzoo.config_files import load_config\n"
        "from textzoo.algorithms.registry import configure\n"
        "configure(TrainConfig(algo='ippo'))  # an algorithm's defaults and rules, without its family\n"
        f"try:\n    load_config({str(path)!r})\nexcept ConfigError as e:\n    print(e)\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["steps must be an int, got 'x' (str)", "False"]


def test_the_name_lists_match_what_they_name():
    from textzoo.algorithms import rlmath
    from textzoo.algorithms import settings as learning
    from textzoo.decoding import precision
    from textzoo.decoding import settings as decoding
    from textzoo.models import joint, prompting, settings

    # every built-in estimator and aggregation names a function of rlmath (loaded when a run computes with it)
    assert all(learning.load(e.fn).__module__ == rlmath.__name__ for e in learning.ESTIMATORS.values())
    assert all(learning.load(ref).__module__ == rlmath.__name__ for ref in learning.AGGREGATIONS.values())
    assert decoding.PRECISION_NAMES == (decoding.AUTO, *precision.PRECISIONS)
    assert settings.PROMPT_STYLES == prompting.STYLES and joint.JOINT_FORMATS == settings.JOINT_FORMATS
    assert set(decoding.LEGACY_DTYPES.values()) <= set(decoding.PRECISION_NAMES)
