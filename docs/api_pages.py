"""Write the API reference: one page per public module of textzoo, found by walking the package.

Run by mkdocs-gen-files during `mkdocs build` (mkdocs.yml); the pages exist only in the build. A module is
public unless a part of its dotted name starts with an underscore (`__init__` gives the package's page).
"""

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "textzoo"


def public_modules() -> list[tuple[str, ...]]:
    """The dotted-name parts of every public module and package under textzoo, sorted."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        found.append(parts)
    return sorted(found)


nav = mkdocs_gen_files.Nav()
for parts in public_modules():
    is_package = (ROOT.joinpath(*parts) / "__init__.py").is_file()
    page = Path(*parts, "index.md") if is_package else Path(*parts).with_suffix(".md")
    nav[parts] = page.as_posix()
    with mkdocs_gen_files.open(Path("reference", page), "w") as out:
        out.write(f"::: {'.'.join(parts)}\n")
    mkdocs_gen_files.set_edit_path(Path("reference", page), ROOT.joinpath(*parts).with_suffix(".py"))

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as out:
    out.writelines(nav.build_literate_nav())
