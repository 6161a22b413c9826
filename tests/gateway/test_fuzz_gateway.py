"""A bounded schemathesis run over the gateway's OpenAPI document (the proxied
routes included, gateway/openapi.py) in front of a real engine: no input gets
a 5xx. (tests/server/test_fuzz.py does the same for the engine alone.)"""
from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_gateway(module_processes, engine_model_args, wait_until):
    # A short context keeps every generated request cheap on a CPU; no queue limit, so no 503s.
    engine = module_processes.engine(*engine_model_args, "--max-model-len", "16", "--max-waiting", "-1")
    module_processes.wait_ready(engine)
    gw = module_processes.gateway([engine.url], "--max-body-bytes", "65536")
    module_processes.wait_ready(gw)
    wait_until(lambda: httpx.get(gw.url + "/v1/models").json()["data"], timeout=30)
    return gw


def test_openapi_lists_the_proxied_routes(fuzz_gateway):
    paths = httpx.get(f"{fuzz_gateway.url}/openapi.json").json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics"} <= set(paths)
    assert set(paths["/v1/completions"]) == {"post"}
    body = paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == ["tiny"]   # the engines' models, as now known


def test_fuzz_no_server_errors(fuzz_gateway):
    cmd = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()",
           "run", f"{fuzz_gateway.url}/openapi.json", "--checks", "not_a_server_error",
           "--max-examples", "15", "--seed", "1", "--workers", "1", "--generation-database", "none",
           "--phases", "examples,fuzzing", "--request-timeout", "120", "--no-color", "--max-time", "120"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:] + "\n--- gateway log ---\n" + fuzz_gateway.log_tail(80)
    generated = re.search(r"(\d+) generated", output)
    assert generated and int(generated.group(1)) >= 100, output[-3000:]
    assert "Traceback" not in fuzz_gateway.log.read_text(errors="replace")
