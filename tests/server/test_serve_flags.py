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
