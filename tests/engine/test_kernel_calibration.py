"""Projection kernels chosen by measurement (engine/quant/calibrate.py).

The plan and the cache are tested with timings given by a stand-in `measure` (the real
one times real kernels, whose numbers no test may assert); the real measurement runs in
the last tests, on the default model, with our exact float32 Q4 kernel built (only exact
candidates) and without it (the bf16 ones let in, with a warning). The CPU class (AVX-512
bf16 or AVX2) is the process's: run under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
for the other.
"""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from pagedkube.engine.quant import calibrate
from pagedkube.engine.quant.calibrate import CACHE_FILE, Choice, KernelCalibration, Shape, Timing, plan
from pagedkube.engine.quant.linear import DenseKernel, Int4PackKernel, QuantLinear, SplitKernel
from pagedkube.engine.quant.quantize import quantize_int4

QKV = Shape("int4", 960, 576, 32)
DOWN = Shape("int4", 576, 1536, 32)
# candidate -> (decode s, prefill s, bytes): int4 is fastest at decode, dense bf16 at prefill
TIMES = {
    QKV: {"int4-bf16": (30e-6, 4e-3, 100), "int4-f32": (900e-6, 9e-3, 120),
          "dense-bf16": (90e-6, 4e-4, 400), "dense-f32": (80e-6, 6e-4, 800)},
    DOWN: {"int4-bf16": (20e-6, 7e-3, 100), "int4-f32": (800e-6, 9e-3, 120),
           "dense-bf16": (30e-6, 3e-4, 400), "dense-f32": (10e-6, 5e-4, 800)},
}


class FakeMeasure:
    def __init__(self):
        self.calls: list[tuple[Shape, str]] = []

    def __call__(self, shape: Shape, candidates: tuple[str, ...], dtype: torch.dtype) -> dict[str, Timing]:
        self.calls += [(shape, c) for c in candidates]
        return {c: Timing(*TIMES[shape][c]) for c in candidates}


def timings(shapes) -> dict[Shape, dict[str, Timing]]:
    return {s: {c: Timing(*t) for c, t in TIMES[s].items()} for s in shapes}


def test_plan_takes_the_fastest_decode_kernel_per_byte_then_prefill_kernels_that_fit():
    counts = {QKV: 30, DOWN: 30}
    # everything int4 (6,000 B); DOWN dense-f32 saves 300 us for 21,000 more: fits 30,000
    assert plan(counts, timings(counts), 30_000) == {
        QKV: Choice("int4-bf16", "int4-bf16"), DOWN: Choice("dense-f32", "dense-f32")}
    # a roomier budget also takes a dense-bf16 copy for QKV's prefill
    assert plan(counts, timings(counts), 40_000) == {
        QKV: Choice("int4-bf16", "dense-bf16"), DOWN: Choice("dense-f32", "dense-f32")}
    # no room beyond the smallest form: int4 for both batches
    assert plan(counts, timings(counts), 6_000) == {
        QKV: Choice("int4-bf16", "int4-bf16"), DOWN: Choice("int4-bf16", "int4-bf16")}


def test_candidates_follow_the_activation_dtype_and_what_the_kernel_takes():
    assert calibrate.candidates_for(QKV, torch.float32) == ("int4-bf16", "int4-f32", "dense-bf16", "dense-f32")
    assert calibrate.candidates_for(QKV, torch.bfloat16) == ("int4-bf16", "dense-bf16")
    assert calibrate.candidates_for(Shape("int4", 100, 576, 32), torch.float32) == ("dense-bf16", "dense-f32")
    assert calibrate.candidates_for(Shape("int8", 960, 576, 32), torch.bfloat16) == ("dense-bf16",)
    # with our fused Q4 kernel built, float32 activations time exact candidates only, less
    # tinygemm's float32 form (10-20x our kernels)
    fused = object()
    assert calibrate.candidates_for(QKV, torch.float32, fused) == ("q4fused-f32", "q4i16-f32", "q4deq-f32",
                                                                  "dense-f32")
    assert calibrate.candidates_for(Shape("int4", 100, 576, 32), torch.float32, fused) == (
        "q4fused-f32", "q4i16-f32", "q4deq-f32", "dense-f32")
    assert calibrate.candidates_for(QKV, torch.bfloat16, fused) == ("int4-bf16", "dense-bf16")
    assert calibrate.candidates_for(Shape("int8", 960, 576, 32), torch.float32, fused) == ("dense-bf16", "dense-f32")


def test_bf16_kernels_are_chosen_only_with_a_warning_that_says_the_cost(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pagedkube.engine.quant.calibrate"):
        KernelCalibration({QKV: 30}, torch.float32, 30_000, tmp_path, FakeMeasure())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "['dense-bf16', 'int4-bf16']" in warnings[0]
    assert calibrate.BF16_FIDELITY in warnings[0]
    caplog.clear()
    exact = {QKV: {"q4fused-f32": (40e-6, 6e-3, 120), "q4i16-f32": (50e-6, 6e-3, 120), "q4deq-f32": (140e-6, 5e-4, 120),
                   "int4-f32": (900e-6, 9e-3, 120), "dense-f32": (30e-6, 4e-4, 800)}}
    with caplog.at_level(logging.WARNING, logger="pagedkube.engine.quant.calibrate"):
        cal = KernelCalibration({QKV: 30}, torch.float32, 6_000, tmp_path,
                                lambda shape, names, dtype: {c: Timing(*exact[shape][c]) for c in names}, object())
    # one copy of the weight serves all of our kernels: the prefill one costs no budget
    assert cal.choices == {QKV: Choice("q4fused-f32", "q4deq-f32")} and cal.used == 30 * 120
    assert not caplog.records
    # the near-exact int16 kernel where it is faster, with no warning: it rounds to 16 bits, not bf16
    exact[QKV]["q4i16-f32"] = (25e-6, 6e-3, 120)
    with caplog.at_level(logging.WARNING, logger="pagedkube.engine.quant.calibrate"):
        cal = KernelCalibration({QKV: 30}, torch.float32, 6_000, tmp_path / "again",
                                lambda shape, names, dtype: {c: Timing(*exact[shape][c]) for c in names}, object())
    assert cal.choices == {QKV: Choice("q4i16-f32", "q4deq-f32")} and cal.used == 30 * 120
    assert not caplog.records


def test_calibration_is_deterministic_given_its_cache_file(tmp_path):
    counts = {QKV: 30, DOWN: 30}
    first = FakeMeasure()
    a = KernelCalibration(counts, torch.float32, 30_000, tmp_path, first)
    assert sorted(first.calls) == sorted((s, c) for s in counts for c in TIMES[s])
    data = json.loads((tmp_path / CACHE_FILE).read_text())
    assert data["version"] == calibrate.CACHE_VERSION and len(data["entries"]) == 2
    again = FakeMeasure()
    b = KernelCalibration(counts, torch.float32, 30_000, tmp_path, again)
    assert again.calls == []                     # the restart measures nothing
    assert a.choices == b.choices == {QKV: Choice("int4-bf16", "int4-bf16"), DOWN: Choice("dense-f32", "dense-f32")}
    # other activations are another key: measured once more, the first entries kept
    KernelCalibration(counts, torch.bfloat16, 30_000, tmp_path, again)
    assert len(again.calls) == 4 and len(json.loads((tmp_path / CACHE_FILE).read_text())["entries"]) == 4


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 1, "entries": {"k": {"c": [1]}}}),
                                     json.dumps([1, 2])])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
    (tmp_path / CACHE_FILE).write_text(content)
    measure = FakeMeasure()
    with caplog.at_level(logging.WARNING, logger="pagedkube.engine.quant.calibrate"):
        cal = KernelCalibration({QKV: 30}, torch.float32, 30_000, tmp_path, measure)
    assert any("ignoring the kernel timing cache" in r.getMessage() for r in caplog.records)
    assert len(measure.calls) == 4 and cal.choices == {QKV: Choice("int4-bf16", "dense-bf16")}
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())["entries"]) == 1


def test_the_chosen_kernels_compute_the_weight_and_split_by_rows(tmp_path):
    torch.manual_seed(0)
    w = quantize_int4(torch.randn(960, 576))
    cal = KernelCalibration({QKV: 30}, torch.float32, 40_000, tmp_path, FakeMeasure())
    kernel, label = cal.kernel(w)
    assert label == "int4-bf16/dense-bf16"
    assert isinstance(kernel, SplitKernel) and isinstance(kernel.decode, Int4PackKernel)
    assert isinstance(kernel.prefill, DenseKernel) and kernel.prefill.weight.dtype == torch.bfloat16
    ref = calibrate.dequantize(w)
    for rows in (1, calibrate.MAX_DECODE_ROWS, calibrate.MAX_DECODE_ROWS + 1, 64):
        x = torch.randn(rows, 576)
        y = kernel(x)
        assert y.dtype == torch.float32 and y.shape == (rows, 960)
        expected = x @ ref.T
        assert float((y - expected).norm() / expected.norm()) < 0.01     # bf16 inputs: ~2^-9 relative
    assert cal.kernel(quantize_int4(torch.randn(576, 1536))) == (None, None)   # a shape not calibrated


def test_real_measurement_times_every_candidate_and_counts_the_kernel_bytes():
    shape = Shape("int4", 64, 64, 32)
    names = calibrate.candidates_for(shape, torch.float32)
    times = calibrate.measure(shape, names, torch.float32)
    assert list(times) == list(names) and all(t.decode_s > 0 and t.prefill_s > 0 for t in times.values())
    packed = calibrate.build("int4-bf16", calibrate.synthetic_weight(shape))
    assert times["int4-bf16"].bytes == calibrate.kernel_bytes(packed) == sum(
        x.numel() * x.element_size() for x in (packed.packed, packed.scale_zeros))
    assert times["dense-f32"].bytes == 64 * 64 * 4 and times["dense-bf16"].bytes == 64 * 64 * 2


# ---- on the default model: the engine's side ------------------------------------------------------------

def _default_model_or_skip():
    from default_model import require_default_model
    require_default_model()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty kernel cache beside the real converted GGUF folder (no reconversion)."""
    from pagedkube.engine.gguf.prepare import CACHE_ENV, cache_root
    gguf = cache_root() / "gguf"
    if gguf.is_dir():
        shutil.copytree(gguf, tmp_path / "gguf", symlinks=True)
    from pagedkube.engine.quant.q4_fused import q4_ext
    if q4_ext(cache_root()) is not None:        # built once in the user's cache, as the engine does
        (tmp_path / "cpu-ext").symlink_to(cache_root() / "cpu-ext")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def _runner(**kw):
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.model_runner import ModelRunner
    return ModelRunner(EngineConfig(device="cpu", attention_backend="torch", num_kv_blocks=8, **kw))


def _kernels(runner) -> set[str]:
    return {type(m.kernel).__name__ for m in runner.model.modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("kw", [dict(quantization="none", dtype="float32"), dict(dtype="float32"),
                                dict(quantization="int4")])
def test_explicit_flags_bypass_calibration(cache_dir, kw):
    _default_model_or_skip()
    runner = _runner(**kw)
    assert not (cache_dir / CACHE_FILE).exists()
    if kw.get("quantization") == "none":
        assert _kernels(runner) == set()                      # nn.Linear everywhere
    else:
        assert _kernels(runner) == {"Int4PackKernel"}         # make_kernel's choice, unmeasured


@pytest.mark.parametrize("built", [True, False])
def test_auto_calibrates_with_and_without_the_exact_kernel(cache_dir, monkeypatch, caplog, built):
    _default_model_or_skip()
    if built and not (cache_dir / "cpu-ext").exists():
        pytest.skip("no C++ toolchain: the exact kernel cannot be built here")
    if not built:
        monkeypatch.setattr("pagedkube.engine.loader.q4_ext", lambda cache: None)
    with caplog.at_level(logging.INFO, logger="pagedkube.engine.quant.calibrate"):
        runner = _runner()
    assert runner.dtype == torch.float32             # whatever the CPU (engine/loader.py resolve_dtype)
    lines = [r.getMessage() for r in caplog.records if "chosen by measurement" in r.getMessage()]
    assert len(lines) == 1 and "measured 4 shape(s)" in lines[0]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "bf16" in r.getMessage()]
    entries = json.loads((cache_dir / CACHE_FILE).read_text())["entries"]
    assert sorted(k.split("|")[4] for k in entries) == [
        "int4 3072x576 g32", "int4 576x1536 g32", "int4 576x576 g32", "int4 960x576 g32"]
    assert all(k.split("|")[3] == "float32" for k in entries)
    candidates = {c for k in entries for c in k.split("|")[5].split(",")}
    if built:
        assert candidates <= calibrate.EXACT | calibrate.NEAR_EXACT and not warned
        assert _kernels(runner) <= {"Q4FusedKernel", "Q4Int16Kernel", "Q4DequantKernel", "Int4PackKernel",
                                    "DenseKernel", "SplitKernel"}
        from pagedkube.engine.quant.packed_vocab import PackedEmbedding, PackedLMHead   # the file's Q8_0
        assert isinstance(runner.model.lm_head, PackedLMHead)
        assert isinstance(runner.model.model.embed_tokens, PackedEmbedding)
    else:
        assert "int4-bf16" in candidates and "q4fused-f32" not in candidates
        assert isinstance(runner.model.lm_head, torch.nn.Linear)     # dense float32, as loaded
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pagedkube.engine.quant.calibrate"):
        again = _runner()
    assert any("(cached, " in r.getMessage() for r in caplog.records)
    assert [type(m.kernel) for m in again.model.modules() if isinstance(m, QuantLinear)] == \
        [type(m.kernel) for m in runner.model.modules() if isinstance(m, QuantLinear)]
