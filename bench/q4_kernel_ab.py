"""Two versions of our Q4 CPU kernel (engine/quant/q4_linear.cpp) timed against each other in one
process: this checkout's source and the one at --against REV, built side by side.

A pass is what one decode step asks of the kernels on the default model: every projection of 30
layers (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536), each layer its own weight, so
the weights stream from memory as in a real step (~80 MB of codes, scales and mins), and the
Q8_0 lm_head (49,152 x 576, q8_linear). The two builds take turns, one pass each per round, with
a third contender: this build's dequantize-then-matmul for the projections (q4deq, what the
engine runs for prefill-sized batches where it is faster); each reports its fastest pass, and
the ratios are to this build. Outputs are compared too: the max relative difference between the
two builds' results.

    .venv/bin/python bench/q4_kernel_ab.py --against HEAD~1 [--rows 1,8] [--rounds 30]
    ATEN_CPU_CAPABILITY=avx2 ...   # has no effect on our kernel (built for AVX2/FMA either way)

Builds go to a temporary folder (~1 min each on 2 cores); nothing in the cache is touched.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedkube.engine.quant import q4_fused

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
VOCAB = 49152                # the lm_head's outputs (its inputs: the hidden size, 576)
REPO = Path(__file__).resolve().parent.parent


def build(sources: list[Path], name: str, folder: Path):
    from torch.utils.cpp_extension import load
    folder.mkdir(parents=True, exist_ok=True)
    return load(name, [str(s) for s in sources], extra_cflags=q4_fused._cflags(),
                extra_ldflags=q4_fused.ldflags(q4_fused._cflags()), build_directory=str(folder), verbose=False)


def sources_at(rev: str, folder: Path) -> list[Path]:
    """The library's sources (q4_fused.SOURCES) as they were at `rev`, those that existed then
    (the attention kernel joined the library later), written into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for source in q4_fused.SOURCES:
        relative = source.resolve().relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "show", f"{rev}:{relative}"], cwd=REPO, capture_output=True, text=True)
        if shown.returncode == 0:
            out.append(folder / source.name)
            out[-1].write_text(shown.stdout)
    return out


def weights(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(LAYERS):
        for n, k in SHAPES:
            q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
            scales = torch.rand(n, k // 32, generator=gen) / 64 + 1e-3
            out.append((q, scales, -8 * scales + torch.rand(n, k // 32, generator=gen) / 256))
    return out


def lm_head(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-127, 128, (VOCAB, SHAPES[0][1]), generator=gen, dtype=torch.int8),
            torch.rand(VOCAB, SHAPES[0][1] // 32, generator=gen) / 64 + 1e-3)


def one_pass(ext, ws, head, xs: dict[int, torch.Tensor], dequant: bool = False) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    if dequant:
        ys = [F.linear(xs[q.shape[1] * 2], ext.q4_dequantize(q, s, m)) for q, s, m in ws]
    else:
        ys = [ext.q4_linear(xs[q.shape[1] * 2], q, s, m) for q, s, m in ws]
    ys.append(ext.q8_linear(xs[SHAPES[0][1]], *head))
    return time.perf_counter() - start, ys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help="git revision of the other kernel source")
    ap.add_argument("--rows", default="1,8", help="comma list of activation rows (decode batch sizes)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="q4-ab-"))
    builds = {"this": build(list(q4_fused.SOURCES), "q4_ab_this", tmp / "this"),
              args.against: build(sources_at(args.against, tmp / "old-src"), "q4_ab_old", tmp / "old")}
    ws, head = weights(), lm_head()
    print(f"torch {torch.__version__}, {args.threads} thread(s), cflags {q4_fused._cflags()}, "
          f"{sum(q.numel() + 8 * s.numel() for q, s, _ in ws) / 1e6:.1f} MB per pass")
    for rows in map(int, args.rows.split(",")):
        gen = torch.Generator().manual_seed(rows)
        xs = {k: torch.randn(rows, k, generator=gen) for k in {k for _, k in SHAPES}}
        runs = {**{name: (ext, False) for name, ext in builds.items()}, "q4deq": (builds["this"], True)}
        best = {name: float("inf") for name in runs}
        outs = {}
        with torch.inference_mode():
            for name, (ext, dequant) in runs.items():
                _, outs[name] = one_pass(ext, ws, head, xs, dequant)   # first call: page faults, allocator
            for _ in range(args.rounds):
                for name, (ext, dequant) in runs.items():
                    seconds, _ = one_pass(ext, ws, head, xs, dequant)
                    best[name] = min(best[name], seconds)
        diff = max(float(((a - b).abs().max() / b.abs().max())) for a, b in zip(outs["this"], outs[args.against]))
        times = " ".join(f"{name} {1e3 * s:.3f} ms" for name, s in best.items())
        print(f"rows {rows}: {times}; {args.against} / this {best[args.against] / best['this']:.3f}x, "
              f"q4deq / this {best['q4deq'] / best['this']:.3f}x; max relative difference {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
