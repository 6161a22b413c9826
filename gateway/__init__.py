"""pagedkube.gateway (torch-free): the cache-aware router, its autoscaler and `pagedkube up`.

    cli.py             `pagedkube gateway`: flags -> GatewayConfig -> create_app
    config.py          GatewayConfig, validated
    app.py             create_app(config): the ASGI app and the Gateway that owns the pieces
    fast_path.py       the two proxied routes, served straight from ASGI
    validation.py      reads and checks a request body before any engine sees it
    auth.py            API keys, per-key rate limits, per-tenant cache salts
    prompt.py          request body -> RoutingInput, hashing as the engine does
    proxy.py           forwards a request along a routing decision; retries before the first byte
    engine_api.py      /v1/models/{id}, /tokenize, /detokenize, /version through the gateway
    hold.py            holds requests while no engine is ready (scale from zero)
    endpoints.py       EndpointSet: the engines, their state and load
    discovery.py       engines from a static list or a Service's EndpointSlices
    engine_watch.py    follows each engine: cache feed, /metrics, /ready, tokenizer
    adapter_status.py  writes status.adapters of the LLMService (which LoRA adapters the engines serve)
    engine_metrics.py  the three numbers read from an engine's /metrics
    errors.py          GatewayError (the shape: pagedkube/openai_errors.py)
    metrics.py         pagedkube_gateway_* metrics
    feed_metrics.py    the cache feed's age per engine
    counting.py        every response counted once
    access_log.py      the access-log line and spans of each proxied request
    openapi.py         the OpenAPI document
    routing/           the routing pieces (pure): ring, bound, prefix index, picker
    autoscaler/        queue-depth autoscaling of the engine fleet
    local/             `pagedkube up`: engines and the gateway on one machine
"""
