"""A bounded schemathesis run over the server's OpenAPI schema: no input gets a 5xx."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    # A short context keeps every generated request cheap on a CPU.
    proc = ServerProcess(tmp_path_factory.mktemp("fuzz"), "--max-model-len", "16", "--max-waiting", "-1",
                         name="fuzz").start()
    yield proc
    proc.stop()


def test_openapi_schema_lists_the_api(fuzz_server):
    paths = httpx.get(f"{fuzz_server.url}/openapi.json").json()["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                 "/v1/cache/config", "/v1/cache/events", "/v1/cache/tokenizer", "/health", "/ready", "/metrics"):
        assert path in paths, path


def test_fuzz_no_server_errors(fuzz_server, tmp_path):
    schemathesis = Path(sys.executable).with_name("schemathesis")
    cmd = [str(schemathesis), "run", f"{fuzz_server.url}/openapi.json", "--checks", "not_a_server_error",
           "--max-examples", "50", "--seed", "1", "--workers", "1", "--generation-database", "none",
           "--phases", "examples,fuzzing", "--request-timeout", "120", "--no-color", "--max-time", "150"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:] + "\n--- server log ---\n" + fuzz_server.log()[-4000:]
    generated = re.search(r"(\d+) generated", output)
    assert generated and int(generated.group(1)) >= 200, output[-3000:]
    assert "Traceback" not in fuzz_server.log()
