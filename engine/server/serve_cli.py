"""`pagedkube serve`: flags and start-up (the SIGTERM drain is in draining.py).

This module imports no torch, fastapi or uvicorn at import time (`pagedkube
--help` must work in the torch-free images); they load inside `run_serve`.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
from typing import Any

from pagedkube.defaults import default_of
from pagedkube.engine.config import DECODE_CAPTURES, DEVICES, DTYPES, QUANTIZATIONS, EngineConfig
from pagedkube.engine.server.config import ServerConfig
from pagedkube.http_head_limits import add_head_limit_args, head_limits_from_args
from pagedkube.model_source import MODEL_FLAG_HELP
from pagedkube.observability import add_observability_args, observability_from_args

logger = logging.getLogger("pagedkube.serve")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '2G' (powers of 1000 without the i) -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 2GiB, 512MiB, 1000000)")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    value = int(float(number) * base ** " kmgt".index(unit.lower() or " "))
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def _server(name: str) -> Any:
    """ServerConfig's default for a field: the flags' defaults are the config's."""
    return default_of(ServerConfig, name)


def _engine(name: str) -> Any:
    return default_of(EngineConfig, name)


def parse_sizes(text: str) -> tuple[int, ...]:
    """"1,2,4,8" -> (1, 2, 4, 8)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes like 1,2,4,8, got {text!r}") from None


def add_decode_capture_args(p: argparse.ArgumentParser) -> None:
    """--decode-capture and --decode-capture-sizes (serve and generate)."""
    p.add_argument("--decode-capture", default=_engine("decode_capture"), choices=DECODE_CAPTURES,
                   help="run decode-only steps as one captured program per batch bucket: on = torch.compile "
                        "on CPU (each bucket compiles at start, a minute or more), CUDA graphs on CUDA; "
                        "off = eager; auto (default) = eager for now: capture is opt-in (docs/engine.md)")
    p.add_argument("--decode-capture-sizes", type=parse_sizes, default=_engine("decode_capture_sizes"),
                   help="batch-size buckets to capture, comma-separated (default "
                        f"{','.join(map(str, _engine('decode_capture_sizes')))}); bigger decode batches run eager")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible engine server",
                              description="Serve a model with the paged-KV engine over an OpenAI-compatible API.")
    p.add_argument("--model", default=None, help=MODEL_FLAG_HELP)
    p.add_argument("--served-model-name", default=None, help="model name in the API (default: directory name)")
    p.add_argument("--host", default=_server("host"))
    p.add_argument("--port", type=int, default=_server("port"))
    p.add_argument("--device", default=_engine("device"), choices=DEVICES)
    p.add_argument("--dtype", default=_engine("dtype"), choices=DTYPES)
    p.add_argument("--quantization", default=_engine("quantization"), choices=QUANTIZATIONS,
                   help="weights: auto = a GGUF file's types as stored, a float model as float; none = all dense; "
                        "int8 / int4 = quantize the projections at load (default auto)")
    add_decode_capture_args(p)
    p.add_argument("--block-size", type=int, default=_engine("block_size"))
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks in the pool")
    kv.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="bytes for the KV pool (e.g. 4GiB)")
    p.add_argument("--max-num-seqs", type=int, default=_engine("max_num_seqs"))
    p.add_argument("--max-num-batched-tokens", type=int, default=_engine("max_num_batched_tokens"))
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-waiting", type=int, default=_server("max_waiting"),
                   help="waiting sequences (n x prompts) beyond which new requests get 503 "
                        f"(default {_server('max_waiting')}: 16 x the default max-num-seqs; -1 = unbounded)")
    p.add_argument("--max-request-tokens", type=int, default=None,
                   help="cap on prompt tokens + n x max_tokens over one request's prompts (400 above; default: none, "
                        "a request is already capped at --max-num-seqs sequences)")
    p.add_argument("--max-body-bytes", type=parse_bytes, default=_server("max_body_bytes"),
                   help=f"largest request body; 413 above (default {_server('max_body_bytes') >> 20}MiB)")
    p.add_argument("--body-read-timeout", type=float, default=_server("body_read_timeout"),
                   help=f"seconds a client has to send its whole body; 408 after (default {_server('body_read_timeout'):g})")
    p.add_argument("--heartbeat-timeout", type=float, default=_server("heartbeat_timeout"),
                   help="seconds without word from the engine core after which /health fails "
                        f"(default {_server('heartbeat_timeout'):g})")
    p.add_argument("--api-key", default=os.environ.get("PAGEDKUBE_API_KEY"),
                   help="require `Authorization: Bearer KEY` (default: $PAGEDKUBE_API_KEY)")
    p.add_argument("--hash-seed", default=os.environ.get("PAGEDKUBE_HASH_SEED", ""),
                   help="secret seed of the prefix-cache block hashes (default: $PAGEDKUBE_HASH_SEED, else none)")
    p.add_argument("--drain-timeout", type=float, default=_server("drain_timeout"),
                   help=f"seconds in-flight requests may run after SIGTERM (default {_server('drain_timeout'):g})")
    p.add_argument("--seed", type=int, default=_engine("seed"))
    p.add_argument("--engine-in-process", action="store_true",
                   help="step the engine in a thread of the HTTP process instead of its own process (debugging)")
    p.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"),
                   help="the event loop (default auto: uvloop when installed, as uvicorn picks)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_head_limit_args(p)
    add_observability_args(p)
    p.set_defaults(func=run_serve)
    return p


def build_config(args: argparse.Namespace) -> ServerConfig:
    engine = EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, seed=args.seed, hash_seed=args.hash_seed, quantization=args.quantization,
        decode_capture=args.decode_capture, decode_capture_sizes=args.decode_capture_sizes)
    return ServerConfig(engine=engine, served_model_name=args.served_model_name, host=args.host, port=args.port,
                        api_key=args.api_key or None,
                        max_waiting=None if args.max_waiting is not None and args.max_waiting < 0 else args.max_waiting,
                        drain_timeout=args.drain_timeout, engine_in_process=args.engine_in_process,
                        max_request_tokens=args.max_request_tokens, heartbeat_timeout=args.heartbeat_timeout,
                        max_body_bytes=args.max_body_bytes, body_read_timeout=args.body_read_timeout,
                        head_limits=head_limits_from_args(args), observability=observability_from_args(args))


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"pagedkube serve: error: {exc}", flush=True)
        return 2
    import uvicorn

    from pagedkube.engine.server.app import create_app
    from pagedkube.engine.server.draining import DrainingServer
    from pagedkube.engine.server.errors import error_body
    from pagedkube.http_head_limits import limited_http_protocol

    app = create_app(config)
    http = limited_http_protocol(config.head_limits, lambda status, message, code: error_body(status, message, code=code))
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5, access_log=False, loop=args.loop, http=http),
                            app.state.server)
    server.run()
    if not server.started:
        return 1
    return app.state.server.exit_code
