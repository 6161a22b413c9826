"""What the load-time kernel calibration measures and picks (engine/quant/calibrate.py), for the
default model's projection shapes, in both activation classes: bfloat16 (what a CPU with native
bf16 runs) and float32 (what every other CPU runs). Ratios are against dense float32 in the same run.

    python bench/cpu_kernels.py [--threads 2]

No cache is read or written: every number is measured now. Prints a markdown table and the plan
(the plan from the calibration's own timings, on calibrate.MEASURE_THREADS thread(s)); --threads
other than that times the candidates at that thread count, to compare the ranking.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import torch

from pagedkube.engine.quant import calibrate
from pagedkube.engine.quant.calibrate import KernelCalibration, Shape

# SmolLM2-135M: qkv (576 + 2 x 192 rows), o, gate_up (2 x 1536), down; 30 layers each
SHAPES = {Shape("int4", 960, 576, 32): 30, Shape("int4", 576, 576, 32): 30,
          Shape("int4", 3072, 576, 32): 30, Shape("int4", 576, 1536, 32): 30}
FILE_PROJECTION_BYTES = 66_355_200     # the Q4_1 file's projection tensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{calibrate.cpu_model()}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{time.strftime('%Y-%m-%d')}, load average {os.getloadavg()[0]:.2f} ({platform.machine()})")
    for dtype in (torch.bfloat16, torch.float32):
        print(f"\n{dtype} activations\n\n| shape | candidate | 1 row (us) | 64 rows (us) | MiB (x30) |\n|---|---|---|---|---|")
        for shape in SHAPES:
            names = calibrate.candidates_for(shape, dtype)
            measure = calibrate.measure if args.threads == calibrate.MEASURE_THREADS else calibrate._measure
            for c, t in measure(shape, names, dtype).items():
                print(f"| {shape} | {c} | {t.decode_s * 1e6:.0f} | {t.prefill_s * 1e6:.0f} | "
                      f"{30 * t.bytes / 2**20:.1f} |")
        with tempfile.TemporaryDirectory() as tmp:
            cal = KernelCalibration(SHAPES, dtype, int(calibrate.MEMORY_FACTOR * FILE_PROJECTION_BYTES), tmp)
        print("\nchosen: " + "; ".join(f"{s}: {c.decode} / {c.prefill}" for s, c in sorted(cal.choices.items()))
              + f" ({cal.used / 2**20:.0f} of {cal.budget / 2**20:.0f} MiB)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
