"""`make lint`'s type check: mypy over pagedkube, engine/, gateway/ and operator/ as installed.

setup.py maps engine/, gateway/ and operator/ into the pagedkube namespace (package_dir),
and an editable install carries that mapping in an import hook that mypy cannot follow.
So this lays the installed layout out as symlinks under build/typecheck/pagedkube/ (the
files of pagedkube/, plus engine, gateway and operator as subfolders), checks `-p pagedkube`
there with the settings of pyproject.toml's [tool.mypy], and prints each path as the
repository has it (pagedkube/engine/llm.py -> engine/llm.py). Exit status: mypy's.

    .venv/bin/python scripts/typecheck.py            # what `make lint` runs
    .venv/bin/python scripts/typecheck.py --no-incremental   # any extra argument goes to mypy
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
MAPPED = ("engine", "gateway", "operator")   # setup.py's PACKAGE_DIRS beyond pagedkube itself
_INSTALLED_PATH = re.compile(rf"^pagedkube/({'|'.join(MAPPED)})/", re.MULTILINE)


def lay_out_tree() -> Path:
    """build/typecheck/pagedkube: a link per entry of pagedkube/, and one per mapped folder."""
    package = TREE / "pagedkube"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "pagedkube").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in MAPPED:
        (package / folder).symlink_to(ROOT / folder)
    return TREE


def main(argv: list[str]) -> int:
    from mypy import api

    os.chdir(lay_out_tree())    # so that `pagedkube` resolves to the laid-out tree, not the repository's folder
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                "--cache-dir", str(ROOT / ".mypy_cache"), *argv, "-p", "pagedkube"])
    sys.stdout.write(_INSTALLED_PATH.sub(r"\1/", out))
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
