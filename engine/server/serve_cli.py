"""`pagedkube serve`: flags and start-up (the SIGTERM drain is in draining.py).

This module imports no torch, fastapi or uvicorn at import time (`pagedkube
--help` must work in the torch-free images); they load inside `run_serve`.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import socket
from pathlib import Path
from typing import Any

from pagedkube.defaults import default_of
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.server.config import ServerConfig
from pagedkube.engine.server.core_launch import CoreLaunch
from pagedkube.engine.server.engine_core import build_engine, spawn_core
from pagedkube.engine.server.engine_flags import add_engine_args, parse_bytes
from pagedkube.http_head_limits import add_head_limit_args, head_limits_from_args
from pagedkube.engine.server.sampling_defaults import read_generation_config
from pagedkube.model_source import hub_model_of, with_revision
from pagedkube.observability import add_observability_args, observability_from_args
from pagedkube.tokenizer import load_chat_template

logger = logging.getLogger("pagedkube.serve")


def _server(name: str) -> Any:
    """ServerConfig's default for a field: the flags' defaults are the config's."""
    return default_of(ServerConfig, name)


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible engine server",
                              description="Serve a model with the paged-KV engine over an OpenAI-compatible API.")
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="the model to serve, as `vllm serve MODEL` takes it (the same as --model)")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default=_server("host"))
    g.add_argument("--port", type=int, default=_server("port"))
    g.add_argument("--api-key", default=os.environ.get("PAGEDKUBE_API_KEY"),
                   help="require `Authorization: Bearer KEY` (default: $PAGEDKUBE_API_KEY)")
    g.add_argument("--hash-seed", default=os.environ.get("PAGEDKUBE_HASH_SEED", ""),
                   help="secret seed of the prefix-cache block hashes (default: $PAGEDKUBE_HASH_SEED, else none)")
    g.add_argument("--max-request-tokens", type=int, default=None,
                   help="cap on prompt tokens + n x max_tokens over one request's prompts (400 above; default: none, "
                        "a request is already capped at --max-num-seqs sequences)")
    g.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    t = p.add_argument_group("tuning (the defaults suit most deployments)")
    t.add_argument("--max-body-bytes", type=parse_bytes, default=_server("max_body_bytes"),
                   help=f"largest request body; 413 above (default {_server('max_body_bytes') >> 20}MiB)")
    t.add_argument("--body-read-timeout", type=float, default=_server("body_read_timeout"),
                   help=f"seconds a client has to send its whole body; 408 after (default {_server('body_read_timeout'):g})")
    t.add_argument("--heartbeat-timeout", type=float, default=_server("heartbeat_timeout"),
                   help="seconds without word from the engine core after which /health fails "
                        f"(default {_server('heartbeat_timeout'):g})")
    t.add_argument("--engine-in-process", action="store_true",
                   help="step the engine in a thread of the HTTP process instead of its own process (debugging)")
    t.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"),
                   help="the event loop (default auto: uvloop when installed, as uvicorn picks)")
    add_head_limit_args(p)
    add_observability_args(p)
    p.set_defaults(func=run_serve)
    return p


def build_config(args: argparse.Namespace) -> ServerConfig:
    if args.model_tag and args.model and args.model_tag != args.model:
        raise ValueError(f"the model is given twice: {args.model_tag!r} and --model {args.model!r}")
    # The template's text from here on: a missing file is found now, not after the model loads,
    # and the engine does not read the file again.
    chat_template = load_chat_template(args.chat_template) if args.chat_template is not None else None
    read_generation_config(args.generation_config)
    engine = EngineConfig(
        model=with_revision(args.model_tag or args.model, args.revision), device=args.device, dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=args.enable_prefix_caching,
        tokenizer=args.tokenizer, chat_template=chat_template,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, seed=args.seed, hash_seed=args.hash_seed, quantization=args.quantization,
        decode_capture=args.decode_capture, decode_capture_sizes=args.decode_capture_sizes,
        structured_outputs_backend=args.structured_outputs_backend,
        grammar_compile_timeout=args.grammar_compile_timeout, tensor_parallel_size=args.tensor_parallel_size,
        nnodes=args.nnodes, master_port=args.master_port, distributed_timeout=args.distributed_timeout,
        enable_lora=bool(args.enable_lora), max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras)
    return ServerConfig(engine=engine, served_model_name=args.served_model_name, host=args.host, port=args.port,
                        api_key=args.api_key or None,
                        max_waiting=None if args.max_waiting is not None and args.max_waiting < 0 else args.max_waiting,
                        drain_timeout=args.drain_timeout, engine_in_process=args.engine_in_process,
                        max_request_tokens=args.max_request_tokens, heartbeat_timeout=args.heartbeat_timeout,
                        max_body_bytes=args.max_body_bytes, body_read_timeout=args.body_read_timeout,
                        head_limits=head_limits_from_args(args), observability=observability_from_args(args),
                        tool_call_parser=args.tool_call_parser, generation_config=args.generation_config,
                        lora_modules=tuple(args.lora_modules or ()), lora_modules_file=args.lora_modules_file,
                        allow_runtime_lora_updating=bool(args.allow_runtime_lora_updating))


def check_parallel_sizes(engine: EngineConfig) -> None:
    """A --tensor-parallel-size (x --nnodes) that cannot split the model: ValueError before anything starts."""
    if engine.world_size == 1:
        return
    from pagedkube.engine.distributed.checks import check_tensor_parallel
    from pagedkube.engine.model_config import ModelConfig
    from pagedkube.model_source import resolve_model_source

    model_dir = resolve_model_source(engine.model).path
    check_tensor_parallel(ModelConfig.from_pretrained(model_dir), engine.tensor_parallel_size, engine.nnodes)


def port_unavailable(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on (in use, no such address), or None when it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    for family, kind, proto, _, address in infos[:1]:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds
            try:
                probe.bind(address)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def resolve_model(model: str | None) -> Path:
    """--model resolved in the CLI's process, before the engine starts: a Hub model is downloaded
    (or found in the cache; the engine core then finds it there without a Hub request,
    pagedkube/hub_download.py) and a GGUF's architecture read, so that one that cannot be served
    ends with one line and exit code 2 before anything loads. Its local path."""
    from pagedkube.engine.gguf.config import check_gguf_architecture, gguf_config
    from pagedkube.engine.gguf.reader import GGUFFile
    from pagedkube.engine.model_config import check_hub_config
    from pagedkube.model_source import resolve_model_source

    source = resolve_model_source(model, check_hub_config, check_gguf_architecture)
    if source.is_gguf:
        gguf_config(GGUFFile(source.path))
    return source.path


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":   # huggingface_hub's client logs every request at info
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"pagedkube serve: error: {exc}", flush=True)
        return 2
    busy = port_unavailable(config.host, config.port)
    if busy:   # before the model loads (or downloads), not a minute later
        print(f"pagedkube serve: error: cannot listen on {config.host}:{config.port}: {busy}", flush=True)
        return 2
    try:
        if hub_model_of(config.engine.model) is not None:   # local paths: the engine's build says (one line)
            resolve_model(config.engine.model)
        check_parallel_sizes(config.engine)     # reads the model's config (a Hub one: from the cache now)
    except ValueError as exc:
        if args.log_level == "debug":
            logger.exception("the model cannot be served")
        print(f"pagedkube serve: error: {exc}", flush=True)
        return 2
    factory = functools.partial(build_engine, config.engine)
    # The core imports torch and loads the model while this process imports the HTTP stack;
    # `pagedkube serve` started its process before its flags were read (pagedkube/cli.py).
    launch: CoreLaunch | None = getattr(args, "core_launch", None)
    if config.engine_in_process:
        launched = None
    elif launch is not None:
        launched = launch.serve(factory, logging.getLogger().level)
    else:
        launched = spawn_core(factory)
    import uvicorn

    from pagedkube.engine.server.app import create_app
    from pagedkube.engine.server.draining import DrainingServer
    from pagedkube.engine.server.errors import error_body
    from pagedkube.http_head_limits import limited_http_protocol

    app = create_app(config, factory, launched)
    http = limited_http_protocol(config.head_limits, lambda status, message, code: error_body(status, message, code=code))
    state = app.state.server
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5, access_log=False, loop=args.loop, http=http),
                            state)
    quiet = _QuietStartupFailure(state)
    if args.log_level != "debug":       # uvicorn logs the lifespan's traceback on uvicorn.error
        logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        server.run()
    except SystemExit:                  # uvicorn's exit when start-up failed
        pass
    finally:
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    if state.startup_error is not None:
        print(f"pagedkube serve: error: {state.startup_error}", flush=True)
        return 2
    if not server.started:
        return 1
    return state.exit_code


class _QuietStartupFailure(logging.Filter):
    """Drops uvicorn's traceback and "startup failed" lines once the engine failed to build by
    the user's mistake: that ends in one line of ours (`--log-level debug` keeps them)."""

    def __init__(self, state: Any):
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        return self.state.startup_error is None
