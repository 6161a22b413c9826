"""The repository stands alone: no file points at a document or a path outside it.

Design notes live in docs/design.md; a comment that cites a file kept elsewhere (a shared
design folder, a path on one machine) leaves the next reader with a dead reference. Every
tracked file, and every untracked one git does not ignore, is read as text:

* no mention of design notes kept outside the repository, by name;
* no absolute path into a workspace;
* every relative path (`../x`, a Markdown link) resolves inside the repository;
* every page named as `docs/<page>.md` anywhere exists.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Spelled in pieces so that this file does not match itself.
OUTSIDE_NOTES = re.compile("|".join([
    r"\bDESIGN" + r"(\.md|\s*§)", r"\bPITFALLS" + r"\b", r"\bSTYLE" + r"\.md", r"\.\./" + r"shared\b",
    r"\bCPU-" + r"FACTS\b", r"\bREAL-" + r"NODE\b",
    r"/" + r"work/",
]))
RELATIVE_PATH = re.compile(r"(?<![\w.$/])((?:\.\./)+[\w.-][\w./-]*)")
MARKDOWN_LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)")
DOCS_PATH = re.compile(r"\bdocs/[\w-]+\.md\b")


def _files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the file list comes from git")
    paths = [ROOT / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.is_file() and p.stat().st_size < 2_000_000]


def _texts() -> list[tuple[Path, str]]:
    texts = []
    for path in _files():
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts.append((path, data.decode()))
        except UnicodeDecodeError:
            continue
    return texts


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def _inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def test_no_file_cites_notes_or_paths_outside_the_repository() -> None:
    found = [f"{_where(p, t, m.start())}: {m.group(0)!r}" for p, t in _texts() for m in OUTSIDE_NOTES.finditer(t)]
    assert found == [], "cite docs/design.md instead:\n" + "\n".join(found)


def test_relative_paths_and_links_stay_inside_the_repository() -> None:
    escaping = []
    for path, text in _texts():
        for pattern in (RELATIVE_PATH, MARKDOWN_LINK):
            for m in pattern.finditer(text):
                target = (path.parent / m.group(1)).resolve()
                if not _inside(target):
                    escaping.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert escaping == []


def test_every_docs_page_named_exists() -> None:
    missing = [f"{_where(p, t, m.start())}: {m.group(0)}" for p, t in _texts() for m in DOCS_PATH.finditer(t)
               if not (ROOT / m.group(0)).is_file()]
    assert missing == []


def test_markdown_links_resolve() -> None:
    broken = []
    for path, text in _texts():
        if path.suffix != ".md":
            continue
        for m in MARKDOWN_LINK.finditer(text):
            if not (path.parent / m.group(1)).exists():
                broken.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert broken == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The patterns themselves: a citation of outside notes, a workspace path and an escaping
    relative path are each found, and ordinary repository references are not."""
    assert OUTSIDE_NOTES.search("see " + "DESIGN" + ".md §6") and OUTSIDE_NOTES.search("PIT" + "FALLS: x")
    assert OUTSIDE_NOTES.search("/" + "work/shared/x") and OUTSIDE_NOTES.search("../" + "shared/STYLE")
    assert not OUTSIDE_NOTES.search('docs/design.md "Gateway"; DESIGN_NOTES = 1')
    up = "../" * 3
    assert [m.group(1) for m in RELATIVE_PATH.finditer(f"a {up}etc/x and ./b and $here/../..")] == [f"{up}etc/x"]
    assert not _inside(ROOT / "docs" / ".." / ".." / "elsewhere")
