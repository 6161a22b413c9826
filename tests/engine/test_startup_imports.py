"""What building the default engine imports: the start-up path stays off torch's compiler
stack (Dynamo, Inductor, sympy), whose import alone took ~2.5 s of a ~5 s start
(docs/benchmarks.md, "Start-up"). Background decode capture imports them later, in its own
thread. Run in a fresh interpreter: another test's import would hide one here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
from pagedkube.engine import LLM, SamplingParams
llm = LLM()
out = llm.generate(["Hello"], SamplingParams(max_tokens=2, temperature=0.0))   # and an eager step
assert len(out[0].outputs[0].token_ids) == 2, out
print(json.dumps({name: name in sys.modules for name in ("torch._dynamo", "torch._inductor", "sympy")}))
"""


def test_building_the_default_engine_imports_no_compiler():
    env = {**os.environ, "PAGEDKUBE_DECODE_CAPTURE": "off"}
    done = subprocess.run([sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == {"torch._dynamo": False, "torch._inductor": False, "sympy": False}
