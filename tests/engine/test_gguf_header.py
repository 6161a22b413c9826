"""engine/gguf/header.py reads what gguf-py's GGUFReader reads, field by field and tensor by tensor.

On generated files of every supported type and architecture (tests/helpers/gguf_factory.py)
and on the default model's file (49,152 tokens, 48,900 merges: the arrays the bulk path
exists for), then malformed files, each a ValueError naming the file.
"""
from __future__ import annotations

import numpy as np
import pytest

from gguf_factory import write_tiny_gguf
from pagedkube.engine.gguf.reader import SUPPORTED_TYPES, GGUFFile

gguf = pytest.importorskip("gguf")


def _assert_same_as_gguf_py(path) -> None:
    reader = gguf.GGUFReader(str(path), "r")
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    ours = GGUFFile(path)
    assert list(ours.metadata) == list(expected)
    for key, value in expected.items():
        assert ours.metadata[key] == value and type(ours.metadata[key]) is type(value), key
        if isinstance(value, list) and value:
            assert [type(v) for v in ours.metadata[key]] == [type(v) for v in value], key
    tensors = list(ours.tensors())
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    assert ours.tensor_bytes() == {t.name: int(t.n_bytes) for t in reader.tensors}
    for t, ref in zip(tensors, reader.tensors):
        assert t.ggml_type == ref.tensor_type.name
        assert t.shape == tuple(int(d) for d in reversed(ref.shape.tolist()))
        assert t.raw.dtype == ref.data.dtype and t.raw.shape == ref.data.shape and not t.raw.flags.writeable
        assert np.array_equal(t.raw, ref.data)


@pytest.mark.parametrize("kind", SUPPORTED_TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_generated_files_read_as_gguf_py_reads_them(tmp_path, arch, kind):
    _assert_same_as_gguf_py(write_tiny_gguf(tmp_path / f"{arch}-{kind}.gguf", arch, kind))


def test_the_default_model_reads_as_gguf_py_reads_it():
    from default_model import require_default_model
    require_default_model()
    from pagedkube.model_source import resolve_model_source
    path = resolve_model_source(None).path
    _assert_same_as_gguf_py(path)
    assert len(GGUFFile(path).metadata["tokenizer.ggml.merges"]) == 48900


@pytest.mark.parametrize("cut, message", [(3, "magic"), (200, "truncated"), (-10, "past the end")])
def test_malformed_files_are_a_value_error(tmp_path, cut, message):
    good = write_tiny_gguf(tmp_path / "good.gguf", "llama", "Q4_0").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good[:cut] if cut > 3 or cut < 0 else b"GGUX" + good[4:])
    with pytest.raises(ValueError, match=f"cannot read GGUF file .*bad.gguf.*{message}"):
        GGUFFile(bad)


def test_a_version_or_value_type_we_do_not_know_is_a_value_error(tmp_path):
    good = bytearray(write_tiny_gguf(tmp_path / "good.gguf", "llama", "Q4_0").read_bytes())
    good[4:8] = (7).to_bytes(4, "little")
    (tmp_path / "v7.gguf").write_bytes(bytes(good))
    with pytest.raises(ValueError, match="version 7"):
        GGUFFile(tmp_path / "v7.gguf")
