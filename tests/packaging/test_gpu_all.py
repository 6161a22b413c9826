"""bench/gpu_all.sh stops cleanly at its deadline (a lent GPU machine runs one command for at most
10 minutes): steps that no longer fit are listed as skipped and the summary is complete.

No GPU is needed: with a deadline shorter than the start-up, every step is skipped, in order.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["gpu_tests", "kernels", "quant_kernels", "engine_throughput", "decode_step", "decode_capture_tests",
         "decode_capture", "engine_throughput_smollm2", "tp_step"]


def test_a_deadline_shorter_than_the_start_up_skips_every_step_and_ends_cleanly(tmp_path):
    env = {**os.environ, "GPU_ALL_DEADLINE": "1", "OUT": str(tmp_path), "PY": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_all.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (results,) = tmp_path.glob("gpu-*")
    summary = (results / "summary.txt").read_text()
    assert re.search(r"^torch \S+ cuda \S+ triton \S+ gpu (True|False)$", summary, flags=re.M), summary
    assert "deadline 1s" in summary
    skipped = re.findall(r"^== (\w+): skipped", summary, flags=re.M)
    assert skipped == STEPS, summary
    assert not list(results.glob("*.log")), "a step ran past the deadline"
    assert summary.rstrip().endswith(f"results: {results} (exit 0)")


def test_the_step_list_above_matches_the_script():
    script = (ROOT / "bench" / "gpu_all.sh").read_text()
    run = re.findall(r"^\s*(?:model_)?step (\w+) \d+", script, flags=re.M)
    assert run == STEPS
