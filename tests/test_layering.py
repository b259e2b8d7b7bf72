"""The import graph of textzoo, read from the AST of every module: no import circles, and every arrow points
down the layers (runners -> algorithms -> models -> decoding; runners -> envs -> sandbox; configs are light data every
layer reads). `textzoo.decoding` (how tokens are made) knows nothing of agents: it imports no other textzoo layer,
only its own settings and CORE; the agents (`textzoo.models`), the families and the runners import it.

What counts as an import: every `import` / `from ... import` statement, at module level or inside a function,
and under `if TYPE_CHECKING:` (those never run, but a type annotation must not point up or close a circle
either; the circle test reports both readings).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "textzoo"

CORE = {"textzoo", "textzoo.errors", "textzoo.typecheck", "textzoo.jsonl", "textzoo.plugins"}
"""Modules of no layer: every layer may import them, and they import only each other."""
LAYERS = {
    "textzoo.sandbox": set(),
    "textzoo.envs": {"textzoo.sandbox"},
    "textzoo.decoding": set(),
    "textzoo.models": {"textzoo.decoding", "textzoo.config"},
    "textzoo.algorithms": {"textzoo.models", "textzoo.decoding", "textzoo.config"},
    "textzoo.interop": {"textzoo.envs", "textzoo.models"},
    "textzoo.runners": {
        "textzoo.envs",
        "textzoo.models",
        "textzoo.decoding",
        "textzoo.algorithms",
        "textzoo.config",
        "textzoo.config_files",
    },
}
"""Package -> the packages and modules (besides itself and CORE) its modules may import."""
DATA = {
    "textzoo.decoding.settings",
    "textzoo.models.settings",
    "textzoo.algorithms.settings",
    "textzoo.algorithms.algorithm",
}
"""With every family's `config` and `entries` module, the registry and `textzoo.config` itself: the light data
modules (`textzoo.config` may import only them; `textzoo.config_files` only them and CORE)."""


def module_names() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under `if TYPE_CHECKING:`."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                out.update(id(n) for n in ast.walk(sub))
    return out


def import_graph(with_types: bool) -> dict[str, set[str]]:
    """Module -> the textzoo modules it imports (a name imported from a package counts as its submodule
    when there is one, else as the package)."""
    modules = module_names()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = set() if with_types else _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


def is_data(module: str) -> bool:
    parts = module.split(".")
    family_data = parts[:2] == ["textzoo", "algorithms"] and len(parts) == 4 and parts[3] in ("config", "entries")
    return module in DATA or module == "textzoo.algorithms.registry" or family_data or module == "textzoo.config"


def arrows_against_the_layers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for source, targets in graph.items():
        for target in targets:
            if target in CORE or layer(target) == layer(source) and source != "textzoo.config":
                continue
            if source in CORE:
                ok = False
            elif source in ("textzoo.config", "textzoo.config_files"):
                ok = is_data(target)
            else:
                allowed = LAYERS.get(layer(source), set())
                ok = layer(target) in allowed or target in allowed
            if not ok:
                bad.append((source, target))
    return sorted(bad)


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_among_textzoo_modules():
    graph = import_graph(with_types=False)
    assert len(graph) > 80 and sum(map(len, graph.values())) > 250  # the whole package was read
    assert circles(graph) == []
    assert circles(import_graph(with_types=True)) == []  # not even through type annotations


def test_every_arrow_points_down_the_layers():
    graph = import_graph(with_types=True)
    assert arrows_against_the_layers(graph) == []
    # the check can fail: an arrow from a model up to a family, or from the config to a family's torch code
    assert arrows_against_the_layers({"textzoo.models.policy": {"textzoo.algorithms.rlmath"}})
    assert arrows_against_the_layers({"textzoo.decoding.engine": {"textzoo.models.policy"}})
    assert arrows_against_the_layers({"textzoo.decoding.settings": {"textzoo.config"}})
    assert not arrows_against_the_layers({"textzoo.models.policy": {"textzoo.decoding.fastlm"}})
    assert arrows_against_the_layers({"textzoo.config": {"textzoo.algorithms.reinforce.family"}})
    assert arrows_against_the_layers({"textzoo.envs.base": {"textzoo.runners.trainer"}})


def module_level_imports(module: str) -> set[str]:
    """The textzoo modules `module` imports when it is imported (not in functions, not for types only)."""
    modules = module_names()
    tree = ast.parse(modules[module].read_text())
    skip = _type_only(tree)
    out = set()
    for statement in tree.body:
        for node in ast.walk(statement) if not isinstance(statement, (ast.FunctionDef, ast.ClassDef)) else ():
            if id(node) in skip or not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            out.update(n for n in names if n and n.startswith("textzoo"))
    return out


def test_the_config_and_the_registry_import_only_light_data_modules():
    data = ["textzoo.config_files", *(m for m in module_names() if is_data(m))]
    assert "textzoo.algorithms.reinforce.entries" in data and "textzoo.algorithms.preference.config" in data
    for module in data:
        heavy = {t for t in module_level_imports(module) if t not in CORE and t != "textzoo.config" and not is_data(t)}
        assert heavy == set(), module  # the builders import their family inside a function, when a run builds one
