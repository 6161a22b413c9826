"""Maps the repository's top-level folders into the `pagedkube` namespace.

engine/, gateway/ and operator/ sit at the repository root (docs/design.md "Layout") but
install as pagedkube.engine, pagedkube.gateway and pagedkube.operator, so no
bare `operator` (a stdlib module) or `engine`/`gateway` lands in site-packages.
Subpackages are discovered, so a new folder with an __init__.py needs no edit here.
"""
from setuptools import find_packages, setup

PACKAGE_DIRS = {
    "pagedkube": "pagedkube",
    "pagedkube.engine": "engine",
    "pagedkube.gateway": "gateway",
    "pagedkube.operator": "operator",
}

packages = []
for name, folder in PACKAGE_DIRS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]
# find_packages("pagedkube") also reports nothing for engine/... because those
# live elsewhere; drop duplicates while keeping order.
packages = list(dict.fromkeys(packages))

setup(packages=packages, package_dir=PACKAGE_DIRS)
