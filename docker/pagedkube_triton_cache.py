"""Triton cache manager of the engine image: prebuilt files first, then the normal cache.

Dockerfile.engine compiles Triton's CUDA launcher at build time
(docker/triton_prebuild.py) into PAGEDKUBE_TRITON_PREBUILT_DIR, a read-only folder
of the image, because the final stage has no C compiler. Kubernetes pods often run
with a read-only root filesystem and an arbitrary UID, so that folder cannot be
Triton's writable cache (compiled kernels go there). Selected with
TRITON_CACHE_MANAGER=pagedkube_triton_cache:PrebuiltFirstCacheManager, this manager
answers lookups from the prebuilt folder when it has the file and otherwise behaves
exactly like Triton's FileCacheManager on TRITON_CACHE_DIR (default ~/.triton/cache).

It lives outside site-packages (/opt/pagedkube/python, on PYTHONPATH in the image)
because it belongs to the image, not to the pagedkube package.
"""
from __future__ import annotations

import os

from triton.runtime.cache import FileCacheManager

PREBUILT_ENV = "PAGEDKUBE_TRITON_PREBUILT_DIR"


class PrebuiltFirstCacheManager(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        root = os.environ.get(PREBUILT_ENV)
        self.prebuilt_dir = os.path.join(root, key) if root and not (override or dump) else None

    def get_file(self, filename):
        if self.prebuilt_dir is not None:
            path = os.path.join(self.prebuilt_dir, filename)
            if os.path.isfile(path):
                return path
        return super().get_file(filename)
