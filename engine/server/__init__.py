"""The engine server, `pagedkube serve` (DESIGN.md §5): an OpenAI-compatible API
over one LLMEngine, with vLLM's metric names and the cache feed for the gateway.

    config.py         ServerConfig
    app.py            create_app(config) -> FastAPI; health, ready, metrics, API key
    core_client.py    the engine-core process's HTTP-side client (the default)
    engine_core.py    the engine-core process: owns the LLMEngine, sends per-step deltas
    async_engine.py   the engine in a thread of the HTTP process (--engine-in-process)
    streams.py        per-request output streams (engine thread -> event loop)
    protocol.py       request bodies (pydantic, unknown fields rejected)
    serving.py        tokenize, validate, submit, collect; abort on disconnect
    responses.py      OpenAI response and stream-chunk shapes
    openai_routes.py  /v1/completions, /v1/chat/completions, /v1/models, /tokenize
    cache_feed.py     /v1/cache/config, /v1/cache/events, /v1/cache/tokenizer
    metrics.py        vLLM's metric names and buckets
    draining.py       SIGTERM drain
    serve_cli.py      the `serve` subcommand (torch-free at import)
"""
