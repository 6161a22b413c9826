"""CONTRIBUTING.md "Layout and what may import what", checked on the source.

Each module is parsed (not imported), and every import statement in it, at any depth, is
held against its package's rule. Whether the torch-free packages really import without torch
is checked by running them (scripts/check_wheel.py, tests/packaging/test_docker.py); this
catches the import that would only show up there.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "transformers", "safetensors")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _violations(folder: str, forbidden: tuple[str, ...], skip: str = "") -> list[str]:
    out = []
    for path in _modules(folder):
        rel = path.relative_to(ROOT).as_posix()
        if skip and rel.startswith(skip):
            continue
        for line, name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{rel}:{line}: {name}")
    return out


@pytest.mark.parametrize("folder", ["pagedkube", "gateway", "operator"])
def test_torch_free_packages_never_import_the_model_stack(folder: str) -> None:
    assert _violations(folder, HEAVY) == []


def test_the_gateway_imports_nothing_of_the_engine_server() -> None:
    """Shared wire facts live in pagedkube/ (openai_errors, hashing, tokenizer); only
    `pagedkube up` (gateway/local/), which runs engines, reads their flags."""
    assert _violations("gateway", ("pagedkube.engine.server",), skip="gateway/local/") == []


def test_the_root_package_imports_no_part() -> None:
    """pagedkube/cli.py finds the parts' subcommands by name (importlib) when one is chosen."""
    assert _violations("pagedkube", ("pagedkube.engine", "pagedkube.gateway", "pagedkube.operator")) == []


def test_the_engine_never_imports_the_gateway_or_the_operator() -> None:
    assert _violations("engine", ("pagedkube.gateway", "pagedkube.operator")) == []


def test_the_rules_see_an_import_at_any_depth(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pagedkube.engine.server.errors import APIError\n    import torch.nn\n")
    assert _imports(module) == [(2, "pagedkube.engine.server.errors"), (3, "torch.nn")]
