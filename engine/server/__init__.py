"""The engine server, `pagedkube serve` (docs/design.md "Engine server"): an OpenAI-compatible API
over one LLMEngine, with vLLM's metric names and the cache feed for the gateway.

    config.py         ServerConfig
    app.py            create_app(config) -> FastAPI; health, ready, metrics, API key
    state.py          ServerState: what one app's handlers share (app.state.server)
    errors.py         APIError and its FastAPI handlers (the shape: pagedkube/openai_errors.py)
    engine_client.py  EngineClient, the protocol the server depends on; EngineInfo
    core_client.py    EngineCoreClient: drives the engine core over a pipe (two threads)
    engine_core.py    the engine core (own process, or a thread): owns the LLMEngine
    core_launch.py    the core's process started first, importing torch while the CLI starts
    core_messages.py  the typed messages between the two (RequestDelta per step)
    streams.py        per-request output streams (on the event loop)
    text_check.py     a 400 naming the field for text that is not Unicode (a lone surrogate)
    protocol.py       request bodies (pydantic; vLLM's extension fields, unknown ones ignored)
    prepare.py        body -> Prepared: tokenize, check limits, the constraint, SamplingParams
    generation.py     Generation: submit, stream the deltas, collect; abort on disconnect
    constraints.py    response_format / structured_outputs / guided_* -> one checked constraint
    tools.py          tools and tool_choice (OpenAI's shapes); what required/named constrain
    tool_parsers.py   tool calls out of a model's text (hermes, llama3_json, mistral; torch-free)
    tool_stream.py    tool calls as OpenAI's message and delta.tool_calls stream chunks
    responses.py      OpenAI response and stream-chunk shapes
    sampling_defaults.py  --generation-config: the model's sampling settings as request defaults
    openai_routes.py  /v1/completions, /v1/chat/completions, /v1/models, /tokenize
    lora_routes.py    LoRA adapters by name: /v1/load_lora_adapter, /v1/unload_lora_adapter, model cards
    lora_file.py      --lora-modules-file: the adapters a file lists, followed while running
    cache_feed.py     /v1/cache/config, /v1/cache/events, /v1/cache/tokenizer
    metrics.py        vLLM's metric names and buckets
    http_counting.py  every HTTP response counted once, by route and status
    access_log.py     the access-log line and spans of each completion request
    draining.py       SIGTERM drain
    engine_flags.py   the engine's flags, shared by `serve` and `pagedkube up`
    serve_cli.py      the `serve` subcommand (torch-free at import)
"""
