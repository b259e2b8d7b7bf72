"""Code from outside textzoo that registers tasks, algorithms, estimators or aggregations, reached the way
Gymnasium reaches it (plain data: no torch import here).

- `module:name` ids: ``--env my_pkg.tasks:me/Echo-v0`` and ``--algo my_pkg.algos:myalgo`` import
  ``my_pkg.tasks`` / ``my_pkg.algos`` first (their registrations run at import), then look the name up.
- Entry points: an installed package lists modules (or functions to call) under the groups `TASKS`
  (``textzoo.tasks``) and `ALGORITHMS` (``textzoo.algorithms``), e.g. in its pyproject.toml::

      [project.entry-points."textzoo.tasks"]
      my_pkg = "my_pkg.tasks"

  They are loaded the first time a name is not found and when `--help` lists what is registered.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from textzoo.errors import TextzooError

logger = logging.getLogger(__name__)

TASKS = "textzoo.tasks"
"""The entry-point group of packages that register tasks (`textzoo.envs.register`)."""
ALGORITHMS = "textzoo.algorithms"
"""The entry-point group of packages that register algorithms, estimators or aggregations."""

_loaded: set[str] = set()


def load_entry_points(group: str, error: type[TextzooError]) -> list[str]:
    """Load every entry point of `group` once per process (importing its module; calling it when it is a
    function) and return their names; a plugin that fails to load raises `error` naming it."""
    if group in _loaded:
        return []
    _loaded.add(group)
    names = []
    for ep in entry_points(group=group):
        try:
            target = ep.load()
            if callable(target):
                target()
        except Exception as e:
            raise error(f"the {group} entry point {ep.name!r} ({ep.value}) failed to load: {e}") from e
        logger.info("loaded the %s entry point %s (%s)", group, ep.name, ep.value)
        names.append(ep.name)
    return names


def split_module(name: str, error: type[TextzooError], what: str) -> str:
    """`name` without its `module:` prefix, that module imported first (Gymnasium's ``module:id``); a name
    without a prefix is returned as it is."""
    module, sep, rest = name.partition(":")
    if not sep:
        return name
    if not module or not rest:
        raise error(f"{what} {name!r}: write MODULE:NAME, e.g. my_pkg.tasks:me/Echo-v0")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise error(f"{what} {name!r}: cannot import module {module!r} ({e}); is it installed or on PYTHONPATH?") from e
    return rest
