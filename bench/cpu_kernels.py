"""What the load-time kernel calibration measures and picks (engine/quant/calibrate.py), for the
default model's projection shapes, in both activation dtypes: float32 (the default on every CPU,
where the calibration times only the exact candidates when our Q4 kernel is built) and bfloat16
(--dtype bfloat16). Every candidate is timed here, exact or not, to show what fidelity costs;
`chosen` is the calibration's own pick. For the other CPU class on an AVX-512 machine run it under
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2.

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
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.quant.calibrate import KernelCalibration, Shape
from pagedkube.engine.quant.q4_fused import q4_ext

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
    fused = q4_ext(cache_root())
    for dtype in (torch.bfloat16, torch.float32):
        print(f"\n{dtype} activations\n\n| shape | candidate | 1 row (us) | 64 rows (us) | MiB (x30) |\n|---|---|---|---|---|")
        for shape in SHAPES:
            names = tuple(dict.fromkeys(calibrate.candidates_for(shape, dtype, fused) + calibrate.candidates_for(shape, dtype)))
            measure = calibrate.measure if args.threads == calibrate.MEASURE_THREADS else calibrate._measure
            for c, t in measure(shape, names, dtype, fused).items():
                print(f"| {shape} | {c} | {t.decode_s * 1e6:.0f} | {t.prefill_s * 1e6:.0f} | "
                      f"{30 * t.bytes / 2**20:.1f} |")
        with tempfile.TemporaryDirectory() as tmp:
            cal = KernelCalibration(SHAPES, dtype, int(calibrate.MEMORY_FACTOR * FILE_PROJECTION_BYTES), tmp,
                                    fused=fused)
        print("\nchosen: " + "; ".join(f"{s}: {c.decode} / {c.prefill}" for s, c in sorted(cal.choices.items()))
              + f" ({cal.used / 2**20:.0f} of {cal.budget / 2**20:.0f} MiB)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
