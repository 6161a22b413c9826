"""Process-wide test setup shared by every test module."""
import os

# Triton picks interpret-vs-compile when triton is first imported (triton.language's own
# @jit helpers are decorated then), and transformers imports triton, so this must happen
# before any test module is collected. Without a GPU nothing can run compiled Triton, so
# every Triton kernel runs in the interpreter (tests/engine/test_triton_*.py rely on it). On a GPU
# machine the kernels compile and the same tests run them on CUDA.
if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# An engine left at --decode-capture auto compiles its decode buckets on a background thread
# (engine/decode_capture.py): minutes of CPU per engine on this suite's 2-core machines, for the
# dozens of short-lived engines here. The suite's engines and servers (which inherit this
# environment) run eagerly; the tests of that default remove this variable for their engine
# (tests/engine/test_decode_capture.py, tests/server/test_stress.py).
os.environ.setdefault("PAGEDKUBE_DECODE_CAPTURE", "off")
