"""Replays a Dockerfile's build stage on this machine, in a folder standing in for `/`.

There is no Docker engine in CI, but the claim "the packages the image installs
import" should be checked the way the image installs them. This reads the
Dockerfile, takes its build stage (the one named `build`, after the stages it is
built FROM, such as Dockerfile.engine's `deps`), and runs their WORKDIR, ENV, COPY
and RUN instructions in order, with the container's absolute paths rewritten into
`root` (so `/opt/venv` becomes `<root>/opt/venv`) and `python` being this
machine's interpreter (the same minor version as the image's). Each venv the
steps create is fresh (`python -m venv`), so nothing leaks in from the dev venv.

Not replayed, and said so in `skipped`: `apt-get` lines (system packages of the
base image: this machine is the same Debian release and has them).
`PIP_NO_CACHE_DIR` is dropped, so pip's cache speeds up repeated replays; it
changes no installed file.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class Instruction:
    keyword: str
    args: str


@dataclass(slots=True)
class Replay:
    root: Path
    env: dict[str, str]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def path(self, container_path: str) -> Path:
        """Where a container path lives in the replay."""
        return self.root / container_path.lstrip("/")


def parse(dockerfile: Path) -> list[list[Instruction]]:
    """Returns the instructions of each stage (a stage starts at FROM)."""
    text = dockerfile.read_text()
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    stages: list[list[Instruction]] = []
    for line in lines:
        keyword, _, args = line.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def stage_chain(stages: list[list[Instruction]], name: str = "build") -> list[list[Instruction]]:
    """The named stage after the stages it is built FROM, oldest first."""
    named = {}
    for stage in stages:
        words = stage[0].args.split()
        if len(words) == 3 and words[1].upper() == "AS":
            named[words[2]] = stage
    if name not in named:
        raise ValueError(f"no stage named {name!r}")
    chain = [named[name]]
    while (parent := chain[0][0].args.split()[0]) in named:
        chain.insert(0, named[parent])
    return chain


def _parse_env(args: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(args))


def _rewrite(command: str, replay: Replay, prefixes: tuple[str, ...]) -> str:
    """Rewrites container absolute paths (/opt/..., /src...) into the replay root."""
    for prefix in prefixes:
        command = re.sub(rf"(?<![\w./-]){re.escape(prefix)}(?=[/\s\"']|$)",
                         str(replay.path(prefix)), command)
    return command


def replay_build_stage(dockerfile: Path, context: Path, root: Path, timeout: float = 1800) -> Replay:
    stage = [i for s in stage_chain(parse(dockerfile)) for i in s]
    root, context = root.resolve(), context.resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shim = root / ".replay-bin"
    shim.mkdir()
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    (shim / "python").symlink_to(base_python)
    # This machine's pip settings (index, certificates) stay; the dev venv does not leak in.
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_NO_CACHE_DIR", "PIP_REQUIRE_VIRTUALENV")}
    env["PATH"] = f"{shim}:/usr/local/bin:/usr/bin:/bin"
    replay = Replay(root=root, env=env)
    # Every absolute container path the stage mentions in WORKDIR, ENV, COPY or `venv`.
    prefixes = sorted({m for i in stage for m in re.findall(r"(?<![\w.:-])/(?:opt|src|tmp/build)[\w.-]*", i.args)},
                      key=len, reverse=True)
    cwd = root
    for instruction in stage:
        kw, args = instruction.keyword, instruction.args
        if kw in ("FROM", "ARG", "LABEL", "EXPOSE"):
            continue
        if kw == "WORKDIR":
            cwd = replay.path(args)
            cwd.mkdir(parents=True, exist_ok=True)
        elif kw == "ENV":
            for key, value in _parse_env(args).items():
                if key == "PIP_NO_CACHE_DIR":
                    replay.skipped.append("ENV PIP_NO_CACHE_DIR (pip's cache only speeds the replay up)")
                    continue
                replay.env[key] = _rewrite(value, replay, tuple(prefixes))
        elif kw == "COPY":
            parts = shlex.split(args)
            if any(p.startswith("--") for p in parts):
                raise ValueError(f"COPY flags are not replayed in a build stage: {args}")
            *sources, dest = parts
            target = cwd / dest if not dest.startswith("/") else replay.path(dest)
            for source in sources:
                src = context / source.rstrip("/")
                if src.is_dir():
                    shutil.copytree(src, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
                else:
                    into = target / src.name if dest.endswith("/") else target
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, into)
        elif kw == "RUN":
            if "apt-get" in args:
                replay.skipped.append(f"RUN {args[:60]}... (system packages of the base image)")
                continue
            command = _rewrite(args, replay, tuple(prefixes))
            subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=replay.env,
                           check=True, timeout=timeout)
            replay.ran.append(command)
        else:
            raise ValueError(f"instruction {kw} is not replayed in a build stage; teach dockerfile_replay.py")
    return replay
