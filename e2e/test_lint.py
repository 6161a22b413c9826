"""The e2e and CI scripts pass shellcheck; the GitHub workflows pass actionlint
(pinned in e2e/cluster/versions.env, built by build.sh; it runs shellcheck on
each `run:` block too). .ci/run installs shellcheck from Debian."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kubeutil import ROOT

SCRIPTS = sorted((ROOT / "e2e").rglob("*.sh")) + [ROOT / ".ci" / "run"]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def shellcheck() -> str:
    found = shutil.which("shellcheck")
    assert found, "shellcheck is not installed (apt-get install -y shellcheck; .ci/run does it)"
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck(script: Path) -> None:
    p = subprocess.run([shellcheck(), "-x", str(script)], capture_output=True, text=True, cwd=script.parent)
    assert p.returncode == 0, p.stdout + p.stderr


def test_shellcheck_really_reports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text('#!/usr/bin/env bash\nrm -rf $1/*\n')
    p = subprocess.run([shellcheck(), str(bad)], capture_output=True, text=True)
    assert p.returncode == 1 and "SC2086" in p.stdout


def test_workflows_exist() -> None:
    assert [w.name for w in WORKFLOWS] == ["ci.yml", "release.yml"]


def test_actionlint(k8s_bin: Path) -> None:
    shellcheck()
    p = subprocess.run([str(k8s_bin / "actionlint"), *map(str, WORKFLOWS)], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr


def test_actionlint_really_reports(k8s_bin: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ github.nope }}\n")
    p = subprocess.run([str(k8s_bin / "actionlint"), str(bad)], capture_output=True, text=True)
    assert p.returncode == 1 and "nope" in p.stdout, p.stdout
