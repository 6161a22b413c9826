"""What building the default engine imports: the start-up path stays off torch's compiler
stack (Dynamo, Inductor, sympy), whose import alone took ~2.5 s of a ~5 s start
(docs/benchmarks.md, "Start-up"). At the product's default (`--decode-capture auto`) the
default model decodes natively (engine/native_decode.py) and never imports them; background
decode capture, for other models, imports them later in its own thread. Run in a fresh
interpreter: another test's import would hide one here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedkube.engine.quant import q4_fused

SCRIPT = """
import json, sys
from pagedkube.engine import LLM, SamplingParams
llm = LLM()
out = llm.generate(["Hello"], SamplingParams(max_tokens=2, temperature=0.0))   # and an eager step
assert len(out[0].outputs[0].token_ids) == 2, out
imported = {name: name in sys.modules for name in ("torch._dynamo", "torch._inductor", "sympy")}
print(json.dumps({**imported, "decode": type(llm.engine.runner.decode_capture).__name__}))
"""


@pytest.mark.parametrize("capture", ["off", "auto"])
def test_building_the_default_engine_imports_no_compiler(capture):
    env = {**os.environ, "PAGEDKUBE_DECODE_CAPTURE": capture}
    done = subprocess.run([sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    decode = imported.pop("decode")
    assert imported == {"torch._dynamo": False, "torch._inductor": False, "sympy": False}
    if capture == "off":
        assert decode == "NoneType"
    elif q4_fused._toolchain():          # our kernels build here: the default model decodes natively
        assert decode == "NativeDecode"
