"""The command line as a vLLM user expects it: `pagedkube serve MODEL`, every default in --help,
a mistyped flag answered with the subcommand's usage, and a busy port found before the model
loads (real processes of the installed `pagedkube` command)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from pagedkube.cli import build_parser
from pagedkube.engine.server.serve_cli import build_config

PAGEDKUBE = [sys.executable, "-m", "pagedkube"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PAGEDKUBE, *args], capture_output=True, text=True, timeout=120)


def test_the_model_is_positional_as_in_vllm_serve():
    parser = build_parser()
    assert build_config(parser.parse_args(["serve", "builtin://tiny"])).engine.model == "builtin://tiny"
    assert build_config(parser.parse_args(["serve", "--model", "builtin://tiny"])).engine.model == "builtin://tiny"
    with pytest.raises(ValueError, match="given twice"):
        build_config(parser.parse_args(["serve", "a.gguf", "--model", "b.gguf"]))


@pytest.mark.parametrize("command", ["serve", "gateway", "up", "generate"])
def test_help_shows_every_options_default(command):
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions).choices[command]
    formatter = sub._get_formatter()
    missing = [a.option_strings[0] for a in sub._actions
               if a.option_strings and a.default is not None and a.default is not False
               and a.default != "==SUPPRESS==" and "default" not in (formatter._get_help_string(a) or "").lower()]
    assert missing == [], f"{command}: no default shown for {missing}"
    if command == "serve":
        assert "--block-size BLOCK_SIZE\n                        (default: 16)" in sub.format_help()


def test_a_bad_flag_prints_the_subcommands_usage():
    r = run("serve", "--max-num-seq", "8")      # not taken as an abbreviation of --max-num-seqs
    assert r.returncode == 2
    assert r.stderr.startswith("usage: pagedkube serve") and "unrecognized arguments: --max-num-seq" in r.stderr


def test_a_busy_port_is_found_before_the_model_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run("serve", "builtin://tiny", "--port", str(port))
    assert r.returncode == 2
    assert r.stdout.strip() == f"pagedkube serve: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "Traceback" not in r.stdout + r.stderr and "engine ready" not in r.stdout + r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, message", [
    (["/nonexistent/model"], "model '/nonexistent/model' is not a model name"),
    (["builtin://tiny", "--max-model-len", "100000"],
     "max_model_len 100000 exceeds the model's max_position_embeddings (2048)"),
])
def test_a_model_the_engine_cannot_build_ends_in_one_line_and_exit_2(argv, message):
    """Found while the engine builds (in its own process): no traceback, the last line says why."""
    r = run("serve", *argv, "--port", str(free_port()))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert r.stdout.strip().splitlines()[-1].startswith(f"pagedkube serve: error: {message}"), out
    assert "Traceback" not in out and "startup failed" not in out


def test_log_level_debug_keeps_the_traceback():
    r = run("serve", "/nonexistent/model", "--port", str(free_port()), "--log-level", "debug")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" in out
    assert r.stdout.strip().splitlines()[-1].startswith("pagedkube serve: error: model '/nonexistent/model'"), out
