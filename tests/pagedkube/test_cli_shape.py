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
