"""The two Dockerfiles: hadolint-clean, multi-stage, non-root, pinned, and their
build stage's install steps produce a working venv (replayed without Docker)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

DOCKERFILES = {"engine": ROOT / "Dockerfile.engine", "gateway": ROOT / "Dockerfile.gateway"}
# image -> pyproject extras it installs and the modules that must import from it
IMAGE_EXTRAS = {"engine": ("engine",), "gateway": ("gateway", "operator")}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_passes(image, hadolint):
    result = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILES[image])],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(hadolint, tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install fastapi\n")
    result = subprocess.run([str(hadolint), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_final_stage_is_small_non_root_and_healthchecked(image, dockerfile_replay):
    stages = dockerfile_replay.parse(DOCKERFILES[image])
    assert len(stages) >= 2, "multi-stage: a build stage and a final stage"
    final = stages[-1]
    keywords = [i.keyword for i in final]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users and not users[-1].startswith(("0", "root")), users
    assert "HEALTHCHECK" in keywords and "ENTRYPOINT" in keywords
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    assert not re.search(r"apt-get|pip install|gcc|build-essential", runs), runs
    copies = [i.args for i in final if i.keyword == "COPY"]
    assert all(c.startswith("--from=build") or "--from=build" in c for c in copies), copies


def test_engine_sources_are_a_thin_layer_over_the_locked_venv(dockerfile_replay):
    """The engine image's 4 GB of torch and CUDA wheels sit in a stage that reads only
    the lock, and the final image starts from it: a change to our sources must not
    invalidate (rebuild, re-ship) that layer, only the thin one with our package."""
    stages = dockerfile_replay.parse(DOCKERFILES["engine"])
    deps = dockerfile_replay.stage_chain(stages, "deps")[-1]
    copied = [i.args for i in deps if i.keyword == "COPY"]
    assert copied == ["docker/requirements-engine.txt docker/"], copied
    assert any("pip install --no-deps -r docker/requirements-engine.txt" in i.args for i in deps)
    # the final image starts from the locked venv plus the C++ compiler torch.compile needs at
    # run time (the runtime stage, a layer that copies nothing of ours), as the build stage does
    runtime = dockerfile_replay.stage_chain(stages, "runtime")
    assert runtime[0] is deps and len(runtime) == 2, "the runtime stage starts from the deps stage"
    assert [i.keyword for i in runtime[1][1:]] == ["RUN"], "the runtime stage only installs packages"
    assert "apt-get install" in runtime[1][1].args and "g++=" in runtime[1][1].args
    final = stages[-1]
    assert final[0].args == "runtime", "the final image must start from the locked venv and compiler"
    sources = [i.args.split()[1] for i in final if i.keyword == "COPY"]
    assert "/opt/venv" not in sources, "copying the whole venv again re-ships 4 GB per change"
    assert dockerfile_replay.stage_chain(stages)[:2] == runtime, "the build stage installs over the same venv"


def _lock(image: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "docker" / f"requirements-{image}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"unpinned line {line!r}"
            pins[name] = version
    return pins


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_lock_satisfies_pyproject(image):
    """Every requirement pyproject states for the image's extras (and the base
    dependencies) is met by the locked version: editing a pin in pyproject
    without re-running docker/lock.py fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = {_canon(k): v for k, v in _lock(image).items()}
    requirements = list(project["dependencies"])
    for extra in IMAGE_EXTRAS[image]:
        requirements += project["optional-dependencies"][extra]
    for text in requirements:
        req = Requirement(text)
        assert _canon(req.name) in lock, f"{req.name} missing from requirements-{image}.txt"
        assert req.specifier.contains(lock[_canon(req.name)], prereleases=True), (text, lock[_canon(req.name)])


def test_gateway_lock_has_no_torch():
    lock = _lock("gateway")
    assert not {"torch", "triton", "transformers"} & set(lock)
    assert not [n for n in lock if n.startswith("nvidia-")]


def _content_key(image: str) -> str:
    """Hash of everything the build stage reads; the replay is redone when it changes."""
    digest = hashlib.sha256()
    files = [DOCKERFILES[image], ROOT / "pyproject.toml", ROOT / "setup.py", ROOT / "README.md",
             *sorted(p for p in (ROOT / "docker").glob("*") if p.is_file())]
    for folder in ("pagedkube", "engine", "gateway", "operator"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _replayed_venv(image: str, replay_mod) -> Path:
    root = ROOT / "build" / "docker-replay" / image
    stamp = root.parent / f"{image}.key"
    key = _content_key(image)
    if not (stamp.is_file() and stamp.read_text() == key and (root / "opt" / "venv").is_dir()):
        stamp.unlink(missing_ok=True)
        replay = replay_mod.replay_build_stage(DOCKERFILES[image], ROOT, root)
        assert any("pip install --no-deps -r" in c for c in replay.ran)
        stamp.write_text(key)
    return root / "opt" / "venv"


def _run_in(venv: Path, code: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([str(venv / "bin" / "python"), "-I", "-c", code], cwd="/", env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gateway_image_install_steps_give_a_torch_free_working_venv(dockerfile_replay):
    """Replays Dockerfile.gateway's build stage into a fresh venv under build/
    (network: PyPI; ~2-4 min the first time, cached by content hash after)."""
    venv = _replayed_venv("gateway", dockerfile_replay)
    result = _run_in(venv, (
        "import importlib.util, sys\n"
        "import pagedkube.gateway, pagedkube.operator, pagedkube.cli, kopf, kubernetes, fastapi, httpx\n"
        "assert importlib.util.find_spec('torch') is None, 'torch in the gateway image'\n"
        "from pagedkube.cli import build_parser\n"
        "help = build_parser().format_help()\n"
        "assert 'gateway' in help and 'operator' in help, help\n"
        "print('ok')\n"))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
    # what the final stage copies has no pip (the build stage removed it)
    assert not (venv / "bin" / "pip").exists()
    frozen = {p.name.split("-")[0].lower() for p in (venv / "lib").glob("python3*/site-packages/*.dist-info")}
    assert "torch" not in frozen and "pagedkube" in frozen


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get("PAGEDKUBE_REPLAY_ENGINE") != "1",
                    reason="downloads ~4 GB (torch + CUDA wheels); set PAGEDKUBE_REPLAY_ENGINE=1 "
                           "(CI builds the real engine image in `make test-node` instead)")
def test_engine_image_install_steps_give_a_working_venv(dockerfile_replay):
    venv = _replayed_venv("engine", dockerfile_replay)
    result = _run_in(venv, (
        "import torch, triton, transformers, safetensors, pagedkube.engine, pagedkube.engine.server\n"
        "from pagedkube.engine import LLM\n"
        "print(torch.__version__)\n"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().startswith(_lock("engine")["torch"])
    # the final stage's environment finds the prebuilt Triton launcher with no compiler
    root = venv.parent.parent
    lookup = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('tp', {str(ROOT / 'docker' / 'triton_prebuild.py')!r})\n"
        "tp = importlib.util.module_from_spec(spec); spec.loader.exec_module(tp)\n"
        "from triton.runtime.build import compile_so_from_file\n"
        "print(compile_so_from_file(**tp.launcher_args()))\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(root / "home"), "CC": "/nonexistent/cc",
           "PYTHONPATH": str(root / "opt" / "pagedkube" / "python"),
           "TRITON_LIBCUDA_PATH": "/opt/libcuda-stub".replace("/opt", str(root / "opt")),
           "TRITON_CACHE_MANAGER": "pagedkube_triton_cache:PrebuiltFirstCacheManager",
           "PAGEDKUBE_TRITON_PREBUILT_DIR": str(root / "opt" / "triton-prebuilt")}
    found = subprocess.run([str(venv / "bin" / "python"), "-c", lookup], cwd="/", env=env,
                           capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(root / "opt" / "triton-prebuilt")


def test_triton_launcher_prebuilt_is_found_without_a_compiler(tmp_path):
    """Dockerfile.engine's build stage runs docker/triton_prebuild.py into a folder
    that is read-only at run time; with the image's environment (the
    PrebuiltFirstCacheManager, a separate writable cache, no compiler) a later
    process gets Triton's CUDA launcher from it under the key a GPU process computes."""
    pytest.importorskip("triton")
    prebuilt, writable = tmp_path / "triton-prebuilt", tmp_path / "home-cache"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "PAGEDKUBE_"))}
    base["TRITON_LIBCUDA_PATH"] = str(tmp_path / "libcuda-stub")
    build = subprocess.run([os.sys.executable, str(ROOT / "docker" / "triton_prebuild.py")],
                           env={**base, "TRITON_CACHE_DIR": str(prebuilt)}, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    built = Path(build.stdout.strip().splitlines()[-1])
    assert built.is_file() and built.is_relative_to(prebuilt)
    needed = subprocess.run(["readelf", "-d", str(built)], capture_output=True, text=True).stdout
    assert "[libcuda.so.1]" in needed, "the launcher must load the node's libcuda.so.1"
    for path in [prebuilt, *prebuilt.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    lookup = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('tp', {str(ROOT / 'docker' / 'triton_prebuild.py')!r})\n"
        "tp = importlib.util.module_from_spec(spec); spec.loader.exec_module(tp)\n"
        "from triton.runtime.build import compile_so_from_file\n"
        "from triton.runtime.cache import get_cache_manager\n"
        "print(compile_so_from_file(**tp.launcher_args()))\n"
        "manager = get_cache_manager('ab' * 32)\n"
        "print(manager.put(b'compiled kernel', 'k.cubin', binary=True))\n")
    image_env = {**base, "CC": "/nonexistent/cc", "TRITON_CACHE_DIR": str(writable), "PYTHONDONTWRITEBYTECODE": "1",
                 "PYTHONPATH": str(ROOT / "docker"),
                 "TRITON_CACHE_MANAGER": "pagedkube_triton_cache:PrebuiltFirstCacheManager",
                 "PAGEDKUBE_TRITON_PREBUILT_DIR": str(prebuilt)}
    found = subprocess.run([os.sys.executable, "-c", lookup], env=image_env, capture_output=True, text=True,
                           timeout=300)
    assert found.returncode == 0, found.stderr
    launcher, kernel = found.stdout.split()
    assert Path(launcher) == built
    assert Path(kernel).is_relative_to(writable) and Path(kernel).read_bytes() == b"compiled kernel"
    # without the cache manager Triton would need the compiler the image does not have
    image_env.pop("TRITON_CACHE_MANAGER")
    missing = subprocess.run([os.sys.executable, "-c", lookup], env=image_env, capture_output=True, text=True,
                             timeout=300)
    assert missing.returncode != 0 and "/nonexistent/cc" in missing.stderr


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_default_command_parses_with_the_real_cli(image, dockerfile_replay):
    """ENTRYPOINT + CMD of the final stage is a command line our CLI accepts."""
    import json

    from pagedkube.cli import build_parser

    final = dockerfile_replay.parse(DOCKERFILES[image])[-1]
    entrypoint = json.loads(next(i.args for i in final if i.keyword == "ENTRYPOINT"))
    cmd = json.loads(next(i.args for i in final if i.keyword == "CMD"))
    assert entrypoint == ["pagedkube"]
    try:
        args = build_parser().parse_args(cmd)
    except SystemExit as e:  # --help
        assert e.code == 0 and cmd == ["--help"]
        return
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8000
