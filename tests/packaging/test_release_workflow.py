"""The release workflow publishes exactly what the operator, the chart and the README install:
the two images under the names the operator defaults to, tagged with the project version, and
the chart at the OCI address the README gives (actionlint checks the file's syntax in the e2e
lint tier)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from pagedkube import __version__
from pagedkube.operator.naming import ENGINE_IMAGE, GATEWAY_IMAGE

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())


def test_a_version_tag_starts_it():
    on = WORKFLOW[True] if True in WORKFLOW else WORKFLOW["on"]    # YAML 1.1 reads `on` as true
    assert on == {"push": {"tags": ["v*.*.*"]}}


def test_it_pushes_both_images_under_the_operators_default_names():
    job = WORKFLOW["jobs"]["images"]
    built = {row["image"]: row["platforms"] for row in job["strategy"]["matrix"]["include"]}
    assert set(built) == {"engine", "gateway"}
    for image in built:
        assert (ROOT / f"Dockerfile.{image}").is_file()
    build = next(step for step in job["steps"] if step.get("uses", "").startswith("docker/build-push-action"))
    tag = build["with"]["tags"].replace("${{ matrix.image }}", "{}").replace(
        "${{ needs.version.outputs.version }}", __version__)
    assert {tag.format(image) for image in built} == {ENGINE_IMAGE, GATEWAY_IMAGE}
    assert build["with"]["push"] is True and build["with"]["sbom"] is True
    assert build["with"]["provenance"] == "mode=max"
    assert "linux/arm64" in built["gateway"]


def test_the_chart_goes_where_the_readme_installs_it_from():
    script = next(step["run"] for step in WORKFLOW["jobs"]["chart"]["steps"] if "run" in step)
    assert "helm push" in script and "oci://ghcr.io/pagedkube/charts" in script
    assert '--app-version "$VERSION"' in script
    assert WORKFLOW["jobs"]["chart"]["needs"] == ["version", "images"]
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"helm install pagedkube oci://ghcr\.io/pagedkube/charts/pagedkube --version "
                     + re.escape(__version__), readme)
