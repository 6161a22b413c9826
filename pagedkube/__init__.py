"""pagedkube: Kubernetes-native LLM serving.

The root package holds only torch-free code shared by the parts. The parts live in
pagedkube.engine, pagedkube.gateway and pagedkube.operator (folders engine/, gateway/
and operator/ in the repository; docs/design.md "Layout").

    cli.py             the `pagedkube` command line
    __main__.py        `python -m pagedkube`
    hashing.py         chained block hashes: the engine and the gateway must agree
    tokenizer.py       tokenizer and chat template as Hugging Face renders them
    chat_messages.py   OpenAI messages and tools as a chat template reads them (engine and gateway)
    piece_cache.py     tokenization with a cache of the text between added tokens
    model_source.py    what a --model value names
    hub_model.py       a Hugging Face Hub model by name (ORG/NAME, ORG/NAME:QUANT) and the files the engine reads
    hub_download.py    those files from huggingface_hub's cache, or downloaded into it (progress, one-line errors)
    openai_errors.py   OpenAI's error shape and our codes (engine and gateway)
    llmservice.py      the LLMService's group, version, kind, plural (operator and autoscaler)
    defaults.py        default_of(Config, "field"): flag defaults read from the config dataclasses
    http_limits.py     BodyLimits: body size and read deadline (engine and gateway)
    http_head_limits.py HeadLimits: header size, count, read deadline, open connections (both servers)
    unicode_text.py    where a JSON body holds a lone UTF-16 surrogate (400s at both servers)
    echo.py            a client's string as an error message may repeat it (bounded, encodable)
    access_log.py      the request id and the access-log line
    observability.py   --access-log, --otlp-traces-endpoint
    tracing.py         OpenTelemetry spans, optional
    response_status.py how an ASGI response ended, for middlewares
    kube_call.py       one raw Kubernetes API call
    parent_death.py    a child process dies with its parent
    builtin/           the 4 MB toy model, builtin://tiny
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    """`from pagedkube import LLM, SamplingParams`, as `from vllm import LLM, SamplingParams`;
    imported on first use, so `import pagedkube` stays torch-free."""
    if name in ("LLM", "SamplingParams"):
        from pagedkube import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'pagedkube' has no attribute {name!r}")
