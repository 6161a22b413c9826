"""docs/interfaces.md against the code: every signature it shows is the code's.

Each ```python block of the page is parsed as Python. A `class` or `def` whose line carries a
`# path/to/file.py` comment names where it lives (engine/llm_engine.py is
pagedkube.engine.llm_engine); for a class, each method shown must have the same parameters
(names, kinds, annotations and defaults) and return annotation as the code's, and each field
shown (`name: type [= default]`) must be a field of the code's dataclass, in the same order,
with the same annotation and default. Annotations are compared as text (every module
has `from __future__ import annotations`); defaults by value.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "interfaces.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
WHERE = re.compile(r"#\s*([\w/]+\.py)")
MAPPED = {"engine": "pagedkube.engine", "gateway": "pagedkube.gateway", "operator": "pagedkube.operator",
          "pagedkube": "pagedkube"}


def module_of(path: str) -> str:
    top, *rest = path[:-len(".py")].split("/")
    return ".".join([MAPPED[top], *rest])


def documented(page: str) -> list[tuple[str, ast.AST, str]]:
    """(module, node, source line) for every class and function the page places in a file."""
    out = []
    for block in BLOCK.findall(page):
        lines = block.splitlines()
        for node in ast.parse(block).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                span = " ".join(lines[node.lineno - 1:node.end_lineno])
                where = WHERE.search(span)
                assert where, f"docs/interfaces.md: {node.name} names no file (`# path/to/file.py`)"
                out.append((module_of(where.group(1)), node, span))
    return out


def _text(annotation: ast.expr | str | None) -> str | None:
    if annotation is None or annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        annotation = ast.parse(annotation, mode="eval").body
    return ast.unparse(annotation)


def _value(expr: ast.expr, namespace: dict[str, Any]) -> Any:
    try:
        return ast.literal_eval(expr)
    except ValueError:
        return eval(compile(ast.Expression(expr), "<docs/interfaces.md>", "eval"), namespace)  # noqa: S307


def doc_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, namespace: dict[str, Any]) -> list[tuple]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(p.arg, "POSITIONAL_OR_KEYWORD" if p in a.args else "POSITIONAL_ONLY", _text(p.annotation),
               None if d is None else _value(d, namespace)) for p, d in zip(positional, defaults, strict=True)]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", _text(a.vararg.annotation), None))
    params += [(p.arg, "KEYWORD_ONLY", _text(p.annotation), None if d is None else _value(d, namespace))
               for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", _text(a.kwarg.annotation), None))
    return [*params, ("return", _text(fn.returns))]


def code_signature(obj: Any) -> list[tuple]:
    sig = inspect.signature(obj)
    params = [(p.name, p.kind.name, _text(p.annotation), None if p.default is p.empty else p.default)
              for p in sig.parameters.values()]
    return [*params, ("return", _text(sig.return_annotation))]


def doc_fields(cls: ast.ClassDef, namespace: dict[str, Any]) -> list[tuple]:
    return [(s.target.id, _text(s.annotation), None if s.value is None else ast.unparse(s.value))
            for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def code_fields(cls: type) -> list[tuple]:
    out = []
    for f in dataclasses.fields(cls):
        default = None
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = f"field(default_factory={f.default_factory.__name__})"
        out.append((f.name, _text(f.type), default))
    return out


def mismatches(module: str, node: ast.AST) -> list[str]:
    mod = importlib.import_module(module)
    namespace = vars(mod)
    real = getattr(mod, node.name, None)
    if real is None:
        return [f"{module}.{node.name}: not in the code"]
    if not isinstance(node, ast.ClassDef):
        doc, code = doc_signature(node, namespace), code_signature(real)
        return [] if doc == code else [f"{module}.{node.name}:\n  docs: {doc}\n  code: {code}"]
    found = []
    fields = doc_fields(node, namespace)
    if fields and dataclasses.is_dataclass(real):
        code = [f for f in code_fields(real) if f[0] in {d[0] for d in fields}]
        if fields != code:
            found.append(f"{module}.{node.name} fields:\n  docs: {fields}\n  code: {code}")
    elif fields:   # a Protocol's or a plain class's annotated attributes
        annotations = inspect.get_annotations(real)
        code = [(name, _text(annotations.get(name)), None) for name, _, _ in fields]
        if [(n, t, None) for n, t, _ in fields] != code:
            found.append(f"{module}.{node.name} attributes:\n  docs: {fields}\n  code: {code}")
    for fn in node.body:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            method = inspect.getattr_static(real, fn.name, None)
            if method is None:
                found.append(f"{module}.{node.name}.{fn.name}: not in the code")
                continue
            doc, code = doc_signature(fn, namespace), code_signature(getattr(real, fn.name))
            if doc != code:
                found.append(f"{module}.{node.name}.{fn.name}:\n  docs: {doc}\n  code: {code}")
    return found


DOCUMENTED = documented(PAGE.read_text())


def test_the_page_documents_the_main_seams() -> None:
    names = {node.name for _, node, _ in DOCUMENTED}
    assert {"LLMEngine", "ModelRunner", "EngineClient", "NewRequest", "StepMessage", "KVEventLog",
            "block_hashes", "paged_attention"} <= names


@pytest.mark.parametrize(("module", "node"), [(m, n) for m, n, _ in DOCUMENTED],
                         ids=[f"{m}.{n.name}" for m, n, _ in DOCUMENTED])
def test_documented_signature_is_the_codes(module: str, node: ast.AST) -> None:
    assert mismatches(module, node) == []


def test_a_changed_signature_is_caught() -> None:
    """The comparison itself: the page's add_request with one parameter renamed, one
    default changed and the return annotation of the old page (`-> None`) each fail."""
    page = PAGE.read_text()
    module, node = next((m, n) for m, n, _ in DOCUMENTED if n.name == "LLMEngine")
    assert mismatches(module, node) == []
    for old, new in [("*, cache_salt: str | None = None", "*, salt: str | None = None"),
                     ("group: str | None = None,", "group: str | None = '',"),
                     ("LoRARequest | None = None) -> list[int]: ...\n    def add_lora",
                      "LoRARequest | None = None) -> None: ...\n    def add_lora")]:
        assert page.count(old) == 1, old
        changed = next(n for _, n, _ in documented(page.replace(old, new)) if n.name == "LLMEngine")
        assert any("add_request" in m for m in mismatches(module, changed)), new
