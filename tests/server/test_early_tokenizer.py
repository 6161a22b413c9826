"""The HTTP process makes its tokenizer while the engine core loads (engine/tokenizer_source.py,
EngineCoreClient): from the files it reads itself, kept only where they are the core's files."""
from __future__ import annotations

import asyncio
import functools

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.server.core_client import EngineCoreClient
from pagedkube.engine.server.engine_core import build_engine
from pagedkube.engine.tokenizer_source import local_tokenizer_files
from pagedkube.tokenizer import Tokenizer

TINY = dict(model="builtin://tiny", device="cpu", dtype="float32", num_kv_blocks=16)
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def test_the_files_read_ahead_are_the_engines():
    for config in (EngineConfig(**TINY), EngineConfig(**TINY, chat_template=TEMPLATE)):
        engine = build_engine(config)
        ahead = local_tokenizer_files(config)
        assert ahead is not None and ahead == engine.tokenizer_files
        assert ("chat_template.jinja" in ahead) == (config.chat_template is not None)
        engine.shutdown()
    assert local_tokenizer_files(EngineConfig(model="some-org/some-model")) is None     # a Hub name: not fetched
    assert local_tokenizer_files(EngineConfig(model="/no/such/model")) is None


def _started(tokenizer_files) -> EngineCoreClient:
    client = EngineCoreClient(functools.partial(build_engine, EngineConfig(**TINY)), in_process=True,
                              tokenizer_files=tokenizer_files)
    asyncio.run(client.start())
    return client


def test_the_cores_files_decide():
    core_files = local_tokenizer_files(EngineConfig(**TINY))
    assert core_files is not None
    cases = {
        "same": lambda: dict(core_files),
        "other template": lambda: {**core_files, "chat_template.jinja": TEMPLATE},   # not the core's: dropped
        "unreadable": lambda: (_ for _ in ()).throw(OSError("gone")),
        "broken": lambda: {**core_files, "tokenizer.json": "{not json"},
        "none": lambda: None,
    }
    for name, files in cases.items():
        client = _started(files)
        try:
            tokenizer = client.info.tokenizer
            assert tokenizer is not None and tokenizer.files == core_files, name
            assert tokenizer.chat_template != TEMPLATE, name
            assert tokenizer.encode("hello world") == Tokenizer(core_files).encode("hello world"), name
        finally:
            client.shutdown()
