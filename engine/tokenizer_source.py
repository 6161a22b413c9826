"""Which tokenizer an engine serves: the files of the model's tokenizer, or --tokenizer's, with
--chat-template's template when given. Torch-free: the engine reads them at build, and the
server's HTTP process reads them too, to make its tokenizer while the core process loads
(engine/server/core_client.py); the core's copy, sent when it is ready, stays the one that
counts: the HTTP side keeps its own only where the two are the same files."""
from __future__ import annotations

from pathlib import Path

from pagedkube.engine.config import EngineConfig
from pagedkube.model_source import hub_model_of, resolve_model_source
from pagedkube.tokenizer import CHAT_TEMPLATE_JINJA, load_chat_template, tokenizer_files


def engine_tokenizer_files(config: EngineConfig, model_dir: str | Path) -> dict[str, str] | None:
    """The files, by name (None: the model has no tokenizer.json and none was asked for);
    ValueError for a --tokenizer or --chat-template that cannot be served."""
    tokenizer_dir = Path(config.tokenizer or model_dir).expanduser()
    if not (tokenizer_dir / "tokenizer.json").is_file():
        if config.tokenizer is not None:
            raise ValueError(f"tokenizer {config.tokenizer!r}: no tokenizer.json in that directory")
        if config.chat_template is not None:
            raise ValueError("chat_template needs a tokenizer, and the model has no tokenizer.json")
        return None
    files = tokenizer_files(tokenizer_dir)
    if config.chat_template is not None:   # in every copy of the files: the HTTP process and the gateway render with it
        files[CHAT_TEMPLATE_JINJA] = load_chat_template(config.chat_template)
    return files


def local_tokenizer_files(config: EngineConfig) -> dict[str, str] | None:
    """engine_tokenizer_files for a model found without fetching, hashing or converting
    anything: a local or packaged directory or GGUF whose conversion the cache already holds.
    None otherwise (a Hub name, a first conversion, no tokenizer, an error)."""
    from pagedkube.engine.gguf.prepare import converted_model_dir

    if config.tokenizer is None and hub_model_of(config.model) is not None:
        return None
    try:
        path = resolve_model_source(config.model).path
        model_dir = converted_model_dir(path) if path.is_file() else path
        return engine_tokenizer_files(config, model_dir) if model_dir is not None else None
    except (ValueError, OSError):
        return None
