"""The paged-KV engine (docs/design.md "Engine").

`LLM` and the model runner need torch; the block pool, prefix cache, scheduler,
sequence and sampling parameters do not, and importing them (or this package)
never imports torch. Hence the lazy attributes below.

    llm.py               LLM: the offline API (vLLM's shape)
    llm_engine.py        LLMEngine: add_request, step / step_deltas, stats
    config.py            EngineConfig, validated
    sampling_params.py   SamplingParams (vLLM's names)
    outputs.py           RequestOutput, CompletionOutput, RequestDelta
    admission.py         can a request ever finish, and with how many new tokens
    scheduler.py         which sequences run in the next forward pass (token budget, preemption)
    waiting_queue.py     the waiting queue, fair across request groups
    forks.py             n > 1: samples that wait for sample 0's prompt
    sequence.py          Sequence, ScheduledSeq, SampleOutput: what scheduler and runner share
    kv_cache_manager.py  per-sequence block allocation with the prefix cache
    block_pool.py        fixed-size blocks, the O(1) LRU free queue, the hash -> block map
    kv_events.py         KVEventLog: the cache feed's stored/removed events
    model_runner.py      one forward pass over a scheduled batch (torch)
    runner_setup.py      what the runner decides before it builds: device, attention backend, decode mode
    kv_pool.py           the KV pool's size (a share of free memory) and its tensors
    model_config.py      what the runner reads from config.json
    host_memory.py       host memory an allocation can still take (MemAvailable, the cgroup limit)
    loader.py            builds the decoder and loads safetensors or GGUF weights
    cache_lock.py        one process at a time making a cache entry (GGUF conversion, kernel timings)
    native_decode.py     decode steps as one call into our C++ kernels (the CPU's GGUF default path)
    decode_capture.py    decode steps as one captured program (torch.compile / CUDA graphs)
    inductor_cache.py    Inductor's cache for that program: portable code, the image's warm copy
    sampler.py           logits -> tokens (greedy, temperature, top-k/p, min-p)
    penalties.py         repetition, presence and frequency penalties, logit bias
    output_processor.py  tokens -> text, stop strings, logprobs
    tokenizer_source.py  which tokenizer files an engine serves (torch-free: the HTTP process reads them too)
    cli.py               registers the `generate`, `serve` and `download` subcommands
    generate_cli.py      `pagedkube generate`
    download_cli.py      `pagedkube download`: a Hub model into the cache, ready to serve
    serve_worker_cli.py  `pagedkube serve-worker`: a worker node of a multi-node engine
    attention/           paged attention: torch reference and Triton kernels
    layers/              RMSNorm, rotary embedding, gated activation
    models/              the decoder (Llama, Qwen2, Qwen3, Mistral)
    quant/               packed int8/int4 weights and their matmuls
    distributed/         tensor parallelism: sharded layers, worker processes, collectives
    lora/                LoRA adapters: PEFT files, per-slot deltas batched in one step
    structured/          structured outputs: grammar bitmasks over the logits (xgrammar)
    gguf/                GGUF files: metadata, tensors, tokenizer
    server/              `pagedkube serve`: the OpenAI-compatible server
"""
from __future__ import annotations

from typing import Any

from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.structured.params import StructuredOutputsParams

__all__ = ["LLM", "LoRARequest", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "Logprob"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from pagedkube.engine.llm import LLM
        return LLM
    if name in ("RequestOutput", "CompletionOutput", "Logprob"):
        from pagedkube.engine import outputs
        return getattr(outputs, name)
    raise AttributeError(f"module 'pagedkube.engine' has no attribute {name!r}")
