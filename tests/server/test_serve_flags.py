"""`pagedkube serve --hash-seed` / $PAGEDKUBE_HASH_SEED reach EngineConfig.hash_seed (the
operator sets the variable from each LLMService's generated Secret; docs/operator.md)."""
from __future__ import annotations

from pagedkube.cli import build_parser
from pagedkube.engine.server.serve_cli import build_config


def engine_config(*argv: str):
    return build_config(build_parser().parse_args(["serve", *argv])).engine


def test_hash_seed_from_the_flag_the_environment_or_none(monkeypatch) -> None:
    monkeypatch.delenv("PAGEDKUBE_HASH_SEED", raising=False)
    assert engine_config().hash_seed == ""
    assert engine_config("--hash-seed", "s3cret").hash_seed == "s3cret"
    monkeypatch.setenv("PAGEDKUBE_HASH_SEED", "from-env")
    assert engine_config().hash_seed == "from-env"
    assert engine_config("--hash-seed", "flag-wins").hash_seed == "flag-wins"


def test_decode_capture_flags_reach_the_engine_config() -> None:
    assert (engine_config().decode_capture, engine_config().decode_capture_sizes) == ("auto", (1, 2, 4, 8))
    config = engine_config("--decode-capture", "on", "--decode-capture-sizes", "8,1,4")
    assert (config.decode_capture, config.decode_capture_sizes) == ("on", (1, 4, 8))


def test_up_passes_decode_capture_to_every_engine() -> None:
    from pagedkube.gateway.local.cli import engine_args
    args = build_parser().parse_args(["up", "--decode-capture", "on", "--decode-capture-sizes", "1,2"])
    assert engine_args(args) == ["--decode-capture", "on", "--decode-capture-sizes", "1,2"]


# One value for every engine flag `up` passes through (engine/server/engine_flags.py).
EVERY_ENGINE_FLAG = ["--model", "builtin://tiny", "--served-model-name", "m", "--device", "cpu", "--dtype", "float32",
                     "--kv-cache-dtype", "float16", "--quantization", "none", "--decode-capture", "off",
                     "--decode-capture-sizes", "1,2",
                     "--block-size", "32", "--kv-cache-memory", "512MiB", "--max-num-seqs", "8",
                     "--max-num-batched-tokens", "512", "--max-model-len", "256", "--max-waiting", "-1",
                     "--drain-timeout", "2.5", "--seed", "7", "--access-log", "json"]


def test_up_passes_every_engine_flag_as_serve_parses_it() -> None:
    """`pagedkube up` declares no engine flag of its own: what it passes to its engines
    configures each exactly as the same words given to `pagedkube serve`."""
    from pagedkube.gateway.local.cli import engine_args
    up = build_parser().parse_args(["up", *EVERY_ENGINE_FLAG])
    passed = engine_args(up)
    assert passed == EVERY_ENGINE_FLAG
    via_up = build_config(build_parser().parse_args(["serve", *passed]))
    direct = build_config(build_parser().parse_args(["serve", *EVERY_ENGINE_FLAG]))
    assert via_up == direct
    assert (via_up.engine.kv_cache_memory, via_up.engine.decode_capture_sizes, via_up.max_waiting,
            via_up.engine.kv_cache_dtype) == (512 << 20, (1, 2), None, "float16")


def test_up_checks_engine_values_before_starting_anything(capsys) -> None:
    import pytest
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--kv-cache-memory", "lots"])
    assert "not a size in bytes: 'lots'" in capsys.readouterr().err
