"""The engine's flags, defined once for `pagedkube serve` and for `pagedkube up`, which passes
them through to every engine it starts.

    add_engine_args(parser)                    serve: defaults from EngineConfig / ServerConfig
    add_engine_args(parser, passthrough=True)  up: default None (only what the user gave is
                                               passed on), each value checked now but kept as
                                               typed, so an engine parses the same text

Torch-free at import (`pagedkube --help` runs in the torch-free images).
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Callable

from pagedkube.defaults import default_of
from pagedkube.engine.config import (DECODE_CAPTURES, DEVICES, DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS,
                                     STRUCTURED_OUTPUTS_BACKENDS, EngineConfig)
from pagedkube.engine.server.config import ServerConfig
from pagedkube.engine.server.tool_parsers import PARSER_NAMES
from pagedkube.model_source import MODEL_FLAG_HELP

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


def parse_fraction(text: str) -> float:
    """"0.9" -> 0.9, a fraction in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] like 0.9, got {text!r}")
    return value


def parse_sizes(text: str) -> tuple[int, ...]:
    """"1,2,4,8" -> (1, 2, 4, 8)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes like 1,2,4,8, got {text!r}") from None


def _server(name: str) -> Any:
    """ServerConfig's default for a field: the flags' defaults are the config's."""
    return default_of(ServerConfig, name)


def _engine(name: str) -> Any:
    return default_of(EngineConfig, name)


def _as_typed(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """`parse` checks the text (argparse reports its error), and the text itself is kept."""
    def check(text: str) -> str:
        parse(text)
        return text
    check.__name__ = parse.__name__
    return check


def add_decode_capture_args(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                            passthrough: bool = False) -> list[argparse.Action]:
    """--decode-capture and --decode-capture-sizes (in add_engine_args, and `pagedkube generate`)."""
    sizes = _engine("decode_capture_sizes")
    return [
        p.add_argument("--decode-capture", default=None if passthrough else _engine("decode_capture"),
                       choices=DECODE_CAPTURES,
                       help="how decode-only steps run: native = one call a step into pagedkube's C++ "
                            "kernels (CPU, a GGUF model on the default path); on = one captured program per "
                            "batch bucket, torch.compile on CPU (each bucket compiles at start, a minute or "
                            "more), CUDA graphs on CUDA; off = eager; auto (default) = native where it applies, "
                            "else on CPU with a C++ toolchain compiled in the background while steps run "
                            "eagerly; on CUDA, graphs captured at start; eager with LoRA or tensor "
                            "parallelism; $PAGEDKUBE_DECODE_CAPTURE replaces auto (docs/engine.md)"),
        p.add_argument("--decode-capture-sizes", type=_as_typed(parse_sizes) if passthrough else parse_sizes,
                       default=None if passthrough else sizes,
                       help="batch-size buckets to capture, comma-separated (default "
                            f"{','.join(map(str, sizes))}); bigger decode batches run eager"),
    ]


def add_engine_args(p: argparse.ArgumentParser, *, passthrough: bool = False,
                    title: str = "model and engine") -> list[str]:
    """Adds the engine's flags to `p` in one group; returns them (`--model`, ...) in order."""
    def default(value: Any) -> Any:
        return None if passthrough else value

    def typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        return _as_typed(parse) if passthrough else parse

    g = p.add_argument_group(title)
    added = [
        g.add_argument("--model", default=None, help=MODEL_FLAG_HELP),
        g.add_argument("--served-model-name", default=None, help="model name in the API (default: directory name)"),
        g.add_argument("--device", default=default(_engine("device")), choices=DEVICES),
        g.add_argument("--dtype", default=default(_engine("dtype")), choices=DTYPES),
        g.add_argument("--kv-cache-dtype", default=default(_engine("kv_cache_dtype")), choices=KV_CACHE_DTYPES,
                       help="the KV cache's element type: auto (default) = float16 on CPU beside packed (GGUF "
                            "Q4/Q8) weights run by the exact float32 kernels (--quantization and --dtype auto), "
                            "else the activation dtype; on CUDA only the activation dtype"),
        g.add_argument("--quantization", default=default(_engine("quantization")), choices=QUANTIZATIONS,
                       help="weights: auto = a GGUF file's types as stored, a float model as float; none = all "
                            "dense; int8 / int4 = quantize the projections at load (default auto)"),
        *add_decode_capture_args(g, passthrough=passthrough),
        g.add_argument("--tensor-parallel-size", "-tp", type=int, default=default(_engine("tensor_parallel_size")),
                       help="ranks of one engine, each holding 1/N of every layer (gloo on CPU, NCCL on CUDA); "
                            "N must divide the model's attention heads, KV heads and MLP size "
                            f"(default {_engine('tensor_parallel_size')})"),
        g.add_argument("--nnodes", type=int, default=default(_engine("nnodes")),
                       help="nodes (pods) of one engine, each running --tensor-parallel-size ranks; this process "
                            "is node 0 and the others join with `pagedkube serve-worker --master-addr THIS_HOST "
                            f"--node-rank K` (default {_engine('nnodes')})"),
        g.add_argument("--master-port", type=int, default=default(_engine("master_port")),
                       help="with --nnodes > 1: the port the other nodes join on "
                            f"(default {_engine('master_port')})"),
        g.add_argument("--distributed-timeout", type=float, default=default(_engine("distributed_timeout")),
                       help="seconds a tensor-parallel collective, or another node's joining at start-up, may "
                            "take before the engine fails (a hung or missing rank) "
                            f"(default {_engine('distributed_timeout'):g})"),
        g.add_argument("--block-size", type=int, default=default(_engine("block_size"))),
    ]
    kv = g.add_mutually_exclusive_group()
    added += [
        kv.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks in the pool"),
        kv.add_argument("--kv-cache-memory", type=typed(parse_bytes), default=None,
                        help="bytes for the KV pool (e.g. 4GiB)"),
        kv.add_argument("--gpu-memory-utilization", type=typed(parse_fraction), default=None,
                        help="fraction of memory this engine may use, as vLLM's: on CUDA of the GPU's total "
                             "(weights included), on CPU of the memory available after the weights; the KV pool "
                             "takes the rest (default: 0.9 of the GPU's free memory; on CPU 0.5 of the memory available, cgroup limit included)"),
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=default(_engine("enable_prefix_caching")),
                       help="reuse the KV blocks of earlier prompts' shared prefixes"),
        g.add_argument("--revision", default=None,
                       help="a Hub model's branch, tag or commit (the same as MODEL@REV; default: the repo's "
                            "default branch)"),
        g.add_argument("--tokenizer", default=None,
                       help="a directory with tokenizer.json to use instead of the model's (default: the model's)"),
        g.add_argument("--chat-template", default=None,
                       help="the chat template: a file or the template's text (default: the tokenizer's)"),
        g.add_argument("--generation-config", default=default(_server("generation_config")),
                       help="sampling settings a request leaves out: auto = the model's generation_config.json, vllm = none "
                            "(the API's), or a folder with a generation_config.json; a request's own fields win"),
        g.add_argument("--max-num-seqs", type=int, default=default(_engine("max_num_seqs"))),
        g.add_argument("--max-num-batched-tokens", type=int, default=default(_engine("max_num_batched_tokens"))),
        g.add_argument("--max-model-len", type=int, default=None),
        g.add_argument("--max-waiting", type=int, default=default(_server("max_waiting")),
                       help="waiting sequences (n x prompts) beyond which new requests get 503 "
                            f"(default {_server('max_waiting')}: 16 x the default max-num-seqs; -1 = unbounded)"),
        g.add_argument("--drain-timeout", type=float, default=default(_server("drain_timeout")),
                       help=f"seconds in-flight requests may run after SIGTERM (default {_server('drain_timeout'):g})"),
        g.add_argument("--seed", type=int, default=default(_engine("seed"))),
    ]
    added += add_structured_outputs_args(p, passthrough=passthrough)
    added += add_lora_args(p, passthrough=passthrough)
    return [action.option_strings[0] for action in added]


def add_lora_args(p: argparse.ArgumentParser, *, passthrough: bool = False) -> list[argparse.Action]:
    """LoRA adapters, with vLLM's flags (docs/server.md "LoRA adapters")."""
    def default(value: Any) -> Any:
        return None if passthrough else value

    g = p.add_argument_group("LoRA adapters")
    return [
        g.add_argument("--enable-lora", action="store_const", const=True, default=default(False),
                       help="serve LoRA adapters: a request's `model` names one"),
        g.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                       type=_as_typed(_lora_module) if passthrough else _lora_module,
                       help="adapters served from start-up: name=path or JSON "
                            "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}' (PEFT directories)"),
        g.add_argument("--lora-modules-file", default=None, metavar="FILE",
                       help="a JSON list of --lora-modules objects: served from start-up and followed while "
                            "running (adapters it adds are loaded, those it drops unloaded; the LLMService "
                            "operator's spec.adapters)"),
        g.add_argument("--max-loras", type=int, default=default(_engine("max_loras")),
                       help=f"adapters one step may run (device slots; default {_engine('max_loras')})"),
        g.add_argument("--max-lora-rank", type=int, default=default(_engine("max_lora_rank")),
                       help=f"largest adapter rank accepted (default {_engine('max_lora_rank')})"),
        g.add_argument("--max-cpu-loras", type=int, default=None,
                       help="adapters kept in host memory, LRU (default: --max-loras)"),
        g.add_argument("--allow-runtime-lora-updating", action="store_const", const=True, default=default(False),
                       help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter (off: loading a "
                            "path on the server is a privileged act)"),
    ]


def _lora_module(text: str):
    from pagedkube.engine.lora.modules import parse_lora_module

    try:
        return parse_lora_module(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_structured_outputs_args(p: argparse.ArgumentParser, *, passthrough: bool = False) -> list[argparse.Action]:
    """Structured outputs and tool calling (docs/server.md "Structured outputs and tool calling")."""
    def default(value: Any) -> Any:
        return None if passthrough else value

    g = p.add_argument_group("structured outputs and tool calling")
    return [
        g.add_argument("--tool-call-parser", default=default(_server("tool_call_parser")), choices=PARSER_NAMES,
                       help="reads tool calls out of tool_choice=auto answers: hermes (Qwen2.5/Qwen3), "
                            "llama3_json, mistral; auto = the one the chat template's format calls for; none = off "
                            f"(default {_server('tool_call_parser')})"),
        g.add_argument("--enable-auto-tool-choice", action="store_const", const=True, default=default(False),
                       help="accepted for vLLM compatibility: tool_choice=auto is on whenever a parser is set or "
                            "detected (default: on then)"),
        g.add_argument("--structured-outputs-backend", default=default(_engine("structured_outputs_backend")),
                       choices=STRUCTURED_OUTPUTS_BACKENDS,
                       help="grammar library for response_format / structured_outputs / guided_* and forced tool "
                            f"calls: auto = xgrammar (default {_engine('structured_outputs_backend')})"),
        g.add_argument("--grammar-compile-timeout", type=float, default=default(_engine("grammar_compile_timeout")),
                       help="seconds a constraint may take to compile before its request fails with 400 "
                            f"(default {_engine('grammar_compile_timeout'):g})"),
    ]


def passthrough_argv(args: argparse.Namespace, flags: list[str]) -> list[str]:
    """The flags of `flags` the user gave, as `pagedkube serve` arguments."""
    out: list[str] = []
    for flag in flags:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is True:             # a switch (--enable-auto-tool-choice, --enable-prefix-caching)
            out.append(flag)
        elif isinstance(value, list):  # nargs="+" (--lora-modules)
            out += [flag, *map(str, value)]
        elif value is False:          # a switch turned off (--no-enable-prefix-caching)
            out.append(f"--no-{flag[2:]}")
        elif value is not None:
            out += [flag, str(value)]
    return out
