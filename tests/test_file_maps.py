"""Every package's docstring is a current map of its folder.

A newcomer opens a package's __init__.py to learn what is where. For every package of
engine/, gateway/, operator/ and pagedkube/ with more than one module, the docstring names
each module (`name.py`) and each subpackage (`name/`), and names no file that is gone.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for top in ("engine", "gateway", "operator", "pagedkube")
                  for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts)
NAMED = re.compile(r"(?<![\w/.])([a-z_][a-z0-9_]*(?:\.py|/))(?=[\s:,;)]|$)", re.MULTILINE)


def _entries(package: Path) -> set[str]:
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    subpackages = {f"{p.parent.name}/" for p in package.glob("*/__init__.py")}
    return modules | subpackages


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(ROOT)) for p in PACKAGES])
def test_package_docstring_maps_its_folder(package: Path) -> None:
    entries = _entries(package)
    if len(entries) < 2:
        return
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = {m.group(1) for m in NAMED.finditer(doc)}
    assert sorted(entries - named) == [], f"{package.relative_to(ROOT)}/__init__.py does not map these"
    local = {n for n in named if n.endswith("/") or (package / n).parent == package}
    gone = sorted(n for n in local if n.endswith(".py") and not (package / n).exists()
                  and not any((p / n).exists() for p in PACKAGES))
    assert gone == [], f"{package.relative_to(ROOT)}/__init__.py names files that do not exist"
