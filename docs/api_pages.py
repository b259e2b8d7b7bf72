"""Write the API reference: one page per public module of textzoo, found by walking the package.

Run by mkdocs-gen-files during `mkdocs build` (mkdocs.yml); the pages exist only in the build. A module is
public unless a part of its dotted name starts with an underscore (`__init__` gives the package's page).
"""

import ast
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "textzoo"


def public_modules() -> list[tuple[tuple[str, ...], Path]]:
    """(dotted-name parts, source file) of every public module and package under textzoo, sorted by name."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            found.append((parts, path))
    return sorted(found)


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (empty without one)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".") + "." if first else ""


nav = mkdocs_gen_files.Nav()
nav["Overview"] = "index.md"
groups: dict[str, list[str]] = {}  # the top-level package or module -> its rows in the overview
for parts, path in public_modules():
    page = Path(*parts, "index.md") if path.name == "__init__.py" else Path(*parts).with_suffix(".md")
    nav[parts] = page.as_posix()
    in_subpackage = len(parts) > 1 and ROOT.joinpath(*parts[:2]).is_dir()
    group = ".".join(parts[:2]) if in_subpackage else parts[0]  # textzoo's own modules, then each subpackage
    name = ".".join(parts[1:]) or parts[0]
    groups.setdefault(group, []).append(f"| [`{name}`]({page.as_posix()}) | {summary(path).replace('|', '/')} |")
    with mkdocs_gen_files.open(Path("reference", page), "w") as out:
        out.write(f"::: {'.'.join(parts)}\n")
    mkdocs_gen_files.set_edit_path(Path("reference", page), path.relative_to(ROOT))

with mkdocs_gen_files.open("reference/index.md", "w") as out:
    out.write(
        "# API reference\n\nOne page per public module, written from its docstrings. The layers and the direction"
        " of their imports: [Package layout](../concepts/design.md).\n"
    )
    for group, rows in groups.items():
        table = "| module | what |\n| --- | --- |\n" + "\n".join(rows)
        out.write(f'\n## `{group}`\n\n<div class="api-index" markdown>\n\n{table}\n\n</div>\n')
with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as out:
    out.writelines(nav.build_literate_nav())
