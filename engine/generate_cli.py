"""`pagedkube generate`: one completion from the command line (torch loads in the handler)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from pagedkube.defaults import default_of
from pagedkube.engine.config import DEVICES, DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, EngineConfig
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.server.engine_flags import add_decode_capture_args
from pagedkube.model_source import MODEL_FLAG_HELP


def _sampling(name: str) -> Any:
    """SamplingParams' default (the sampling flags not chosen differently below)."""
    return default_of(SamplingParams, name)


def add_generate_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate a completion offline (no server)",
                              description="Run the paged-KV engine once on a prompt and print the completion.")
    p.add_argument("--prompt", required=True, help="the prompt text (the user message with --chat)")
    p.add_argument("--model", default=None, help=MODEL_FLAG_HELP)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    p.add_argument("--max-tokens", type=int, default=32)   # a CLI choice: a readable answer (SamplingParams: 16)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default here)")
    p.add_argument("--top-p", type=float, default=_sampling("top_p"))
    p.add_argument("--top-k", type=int, default=_sampling("top_k"))
    p.add_argument("--seed", type=int, default=_sampling("seed"))
    p.add_argument("--n", type=int, default=_sampling("n"), help="number of samples")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--device", default=default_of(EngineConfig, "device"), choices=DEVICES)
    p.add_argument("--dtype", default=default_of(EngineConfig, "dtype"), choices=DTYPES)
    p.add_argument("--kv-cache-dtype", default=default_of(EngineConfig, "kv_cache_dtype"), choices=KV_CACHE_DTYPES,
                   help="the KV cache's element type (default auto; docs/engine.md)")
    p.add_argument("--quantization", default=default_of(EngineConfig, "quantization"), choices=QUANTIZATIONS,
                   help="auto (a GGUF file's types as stored), none, int8 or int4 (default auto)")
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=default_of(EngineConfig, "tensor_parallel_size"),
                   help="ranks of the engine (worker processes it starts; docs/engine.md \"Tensor parallelism\")")
    add_decode_capture_args(p)
    p.set_defaults(func=run_generate)
    return p


def run_generate(args: argparse.Namespace) -> int:
    from pagedkube.engine.llm import LLM
    from pagedkube.hub_download import log_progress_to_stderr

    log_progress_to_stderr()
    try:
        params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                seed=args.seed, max_tokens=args.max_tokens, stop=args.stop)
        llm = LLM(args.model, device=args.device, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                  num_kv_blocks=args.num_kv_blocks,
                  quantization=args.quantization, decode_capture=args.decode_capture,
                  decode_capture_sizes=args.decode_capture_sizes, tensor_parallel_size=args.tensor_parallel_size)
        prompt: str | list[int] = args.prompt
        if args.chat:
            tokenizer = llm.get_tokenizer()
            if tokenizer is None:
                raise ValueError("--chat needs a model with a tokenizer")
            prompt = tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
        out = llm.generate(prompt, params)[0]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for completion in out.outputs:
        print(completion.text)
    return 0
