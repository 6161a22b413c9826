"""The warm Inductor cache the engine image ships (engine/inductor_cache.py): copied into a
process's own cache before its buckets compile, it turns the compile into cache hits, on another
folder, KV pool size and thread count than the ones that built it, with the same tokens."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from toolchain import require_cxx

from pagedkube.engine import inductor_cache

# One engine, its buckets compiled before it serves; prints its greedy tokens and the caches' counts.
COMPILE = """
import json, logging, sys, torch
logging.basicConfig(level=logging.INFO)
torch.set_num_threads(int(sys.argv[2]))
from pagedkube.engine import inductor_cache
from pagedkube.engine.llm import LLM
from pagedkube.engine.sampling_params import SamplingParams
llm = LLM(model="builtin://tiny", device="cpu", dtype="float32", block_size=16,
          num_kv_blocks=int(sys.argv[1]), decode_capture="on", decode_capture_sizes=(1,))
out = llm.generate([[5, 9, 200, 41, 7]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
print(json.dumps({"tokens": out[0].outputs[0].token_ids, "counts": inductor_cache.cache_counts(),
                  "captured": llm.engine.runner.decode_capture.num_captured_steps}))
"""


def compile_in(cache: Path, blocks: int, threads: int, seed: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PAGEDKUBE_DECODE_CAPTURE", inductor_cache.SEED_ENV)}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    if seed is not None:
        env[inductor_cache.SEED_ENV] = str(seed)
    out = subprocess.run([sys.executable, "-c", COMPILE, str(blocks), str(threads)], env=env,
                         capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "log": out.stderr}


def test_a_seeded_cache_turns_the_compile_into_hits_on_another_folder_pool_size_and_thread_count(tmp_path):
    require_cxx()
    (tmp_path / "empty").mkdir()        # a cache built to be shared (the image's `warm`): seeded by nothing
    cold = compile_in(tmp_path / "built", blocks=6, threads=1, seed=tmp_path / "empty")
    assert cold["counts"]["fxgraph_cache_miss"] == 1 and cold["counts"]["fxgraph_cache_hit"] == 0, cold["counts"]
    assert cold["captured"] > 0
    warm = compile_in(tmp_path / "pod", blocks=9, threads=2, seed=tmp_path / "built")
    assert "warm Inductor cache file(s) copied" in warm["log"], warm["log"][-3000:]
    counts = warm["counts"]
    assert counts["autograd_cache_hit"] + counts["fxgraph_cache_hit"] >= 1, counts
    assert counts["autograd_cache_miss"] == 0 and counts["fxgraph_cache_miss"] == 0, counts
    assert warm["tokens"] == cold["tokens"] and warm["captured"] == cold["captured"]


def test_seed_copies_what_the_cache_lacks_and_keeps_what_it_has(tmp_path):
    src, dest = tmp_path / "image", tmp_path / "cache"
    for rel, text in {"ab/abc.py": "image code", "fxgraph/x/y": "entry", "locks/ab.lock": "", "cd/own.so": "image so"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (dest / "cd").mkdir(parents=True)
    (dest / "cd/own.so").write_text("this machine's")
    assert inductor_cache.seed(src, dest) == 2
    assert (dest / "ab/abc.py").read_text() == "image code" and (dest / "fxgraph/x/y").read_text() == "entry"
    assert (dest / "cd/own.so").read_text() == "this machine's"
    assert not (dest / "locks").exists()
    assert inductor_cache.seed(src, dest) == 0
    assert not [p for p in dest.rglob("*.tmp")]


def test_a_seed_folder_that_is_missing_is_a_warning_not_an_error(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(inductor_cache.SEED_ENV, str(tmp_path / "nowhere"))
    inductor_cache.seed_from_env()
    assert "is not a folder" in caplog.text


def test_shared_code_targets_every_avx2_cpu_and_inductors_loops_run_on_one_thread(monkeypatch, tmp_path):
    """Inductor's default -march=native would let an AVX-512 build machine's .so carry AVX-512
    instructions into a cache an AVX2 node loads; a process with no shared cache keeps it."""
    monkeypatch.delenv(inductor_cache.SEED_ENV, raising=False)
    assert not inductor_cache.shared()
    assert inductor_cache.compile_options(inductor_cache.shared()) == {"cpp.simdlen": 256, "cpp.threads": 1}
    monkeypatch.setenv(inductor_cache.SEED_ENV, str(tmp_path))
    assert inductor_cache.shared()
    options = inductor_cache.compile_options(inductor_cache.shared())
    assert options["cpp.simdlen"] == 256 and options["cpp.threads"] == 1
    if platform.machine() not in ("x86_64", "AMD64") or not torch.cpu._is_avx2_supported():
        pytest.skip("not an x86 CPU with AVX2")
    assert options["cpp.march"] == "x86-64-v3"
