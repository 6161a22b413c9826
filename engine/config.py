"""Engine configuration: one validated dataclass (CONTRIBUTING.md "Conventions": config)."""
from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
# auto: a GGUF file's types as stored, a float checkpoint as float; none: all dense (the
# reference); int8 / int4: projections quantized at load (docs/engine.md "Quantization")
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# How decode steps run: "on" = whole-step capture (engine/decode_capture.py): torch.compile on
# CPU (every bucket before serving), CUDA graphs on CUDA; "native" = one call a step into our C++
# library (engine/native_decode.py; the CPU's GGUF default path); "off" = eager (vLLM's
# --enforce-eager); "auto" = the engine's choice: native where it applies, else compiled in the
# background on CPU where it can be, CUDA graphs captured at start on CUDA
# (runner_setup.resolve_decode_capture; measured: docs/benchmarks.md "One call a decode step",
# "Whole decode-step capture" and "GPU (Triton)")
DECODE_CAPTURES = ("auto", "on", "native", "off")
# The KV cache's element type (vLLM's --kv-cache-dtype): auto = float16 on the CPU's exact
# packed path (a GGUF file's Q4/Q8 weights, --quantization and --dtype auto, our float32 Q4
# kernel: a float16 cache gave the same greedy ids on all 32 quality chats at half the
# memory), else the activation dtype (engine/loader.py resolve_kv_cache_dtype)
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
DECODE_CAPTURE_ENV = "PAGEDKUBE_DECODE_CAPTURE"   # replaces an "auto" setting (a deployment's default)
# Batch-size buckets of captured decode steps: vLLM captures 1, 2, 4, 8 and then steps of 8; past 8
# sequences a step's per-op cost is spread over the batch, and each CPU bucket compiles for a
# minute or more on a 2-core machine. At most 8: Dynamo's default recompile_limit.
DEFAULT_DECODE_CAPTURE_SIZES = (1, 2, 4, 8)
# Structured outputs (engine/structured/): auto = xgrammar, chosen by measurement over llguidance
# (docs/benchmarks.md "Structured outputs: backend"); the only one built in for now.
STRUCTURED_OUTPUTS_BACKENDS = ("auto", "xgrammar")
MAX_DECODE_CAPTURE_SIZES = 8
# vLLM's default of 10 minutes for an NCCL collective, halved: a CPU prefill chunk of 2,048 tokens
# on a 70B model is the longest step we expect, and a hung worker should fail its requests sooner
DEFAULT_DISTRIBUTED_TIMEOUT_S = 300.0
# The leader's TCPStore port when ranks join from other pods: torch.distributed's MASTER_PORT default
DEFAULT_MASTER_PORT = 29500


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None            # a Hugging Face directory, a GGUF file or a model name (pagedkube.model_source); None = smollm2-135m-instruct
    device: str = "auto"                # auto = cuda when available, else cpu
    dtype: str = "auto"                 # auto = the checkpoint's torch_dtype on CUDA, float32 on CPU
    kv_cache_dtype: str = "auto"        # one of KV_CACHE_DTYPES
    block_size: int = 16                # tokens per KV block (vLLM's default)
    num_kv_blocks: int | None = None    # None = sized from kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for the KV pool; None = runner's default for the device
    # vLLM's --gpu-memory-utilization: the fraction of the device's memory this engine may use
    # (CUDA: of the GPU's total, weights included; CPU: of the memory available at start-up, after
    # the weights). None = the runner's default for the device (engine/kv_pool.py num_kv_blocks).
    gpu_memory_utilization: float | None = None
    tokenizer: str | None = None        # a directory with tokenizer.json; None = the model's
    chat_template: str | None = None    # a template file or the template's text; None = the tokenizer's
    max_num_seqs: int = 256             # vLLM's default cap on running sequences
    max_num_batched_tokens: int = 2048  # per-step token budget (vLLM's default for chunked prefill)
    max_model_len: int | None = None    # None = the model's max_position_embeddings
    enable_prefix_caching: bool = True
    seed: int = 0                       # seeds the sampler stream of requests without their own seed
    attention_backend: str = "auto"     # auto = triton on CUDA, torch elsewhere
    hash_seed: str = ""                 # seed of the chained block hash (pagedkube.hashing)
    quantization: str = "auto"          # one of QUANTIZATIONS; auto = GGUF types as stored, float checkpoints as float
    decode_capture: str = "auto"        # one of DECODE_CAPTURES
    decode_capture_sizes: tuple[int, ...] = DEFAULT_DECODE_CAPTURE_SIZES
    # A structured-outputs constraint that has not compiled within this many seconds fails its
    # request (a form-sized schema compiles in ~10 ms, the largest accepted one in ~2 s here:
    # docs/benchmarks.md "Structured outputs").
    grammar_compile_timeout: float = 10.0
    structured_outputs_backend: str = "auto"   # one of STRUCTURED_OUTPUTS_BACKENDS
    # Ranks of one tensor-parallel engine (engine/distributed/): this process and N - 1 workers it starts
    tensor_parallel_size: int = 1
    # A collective of a tensor-parallel step that waits longer than this fails the engine (a hung
    # worker); generous, because the first step after start-up also waits for the slowest rank
    distributed_timeout: float = DEFAULT_DISTRIBUTED_TIMEOUT_S
    # Pods (nodes) of one engine, each running tensor_parallel_size ranks: the world is
    # tensor_parallel_size x nnodes ranks. This process is node 0 (the leader); nodes 1..nnodes-1
    # are `pagedkube serve-worker` processes that join through the leader's TCPStore on master_port
    # (engine/distributed/node.py), and must do so within distributed_timeout.
    nnodes: int = 1
    master_port: int = DEFAULT_MASTER_PORT
    # LoRA adapters (engine/lora/): vLLM's flags and defaults, except the rank cap: 64 (vLLM: 16)
    # covers the ranks published fine-tunes use (8-64) at (in + out) x 64 floats per projection and slot
    enable_lora: bool = False
    max_loras: int = 1                  # adapters resident in one step's slots (vLLM's default)
    max_lora_rank: int = 64
    max_cpu_loras: int | None = None    # adapters kept in host memory (LRU); None = max_loras, as vLLM

    @property
    def world_size(self) -> int:
        """Ranks of the engine over all its nodes; each holds 1/world_size of every layer."""
        return self.tensor_parallel_size * self.nnodes

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.decode_capture not in DECODE_CAPTURES:
            raise ValueError(f"decode_capture must be one of {DECODE_CAPTURES}, got {self.decode_capture!r}")
        sizes = self.decode_capture_sizes
        if (not isinstance(sizes, (tuple, list)) or not sizes or len(sizes) > MAX_DECODE_CAPTURE_SIZES
                or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes)):
            raise ValueError(f"decode_capture_sizes must be 1 to {MAX_DECODE_CAPTURE_SIZES} positive batch sizes, "
                             f"got {sizes!r}")
        self.decode_capture_sizes = tuple(sorted(set(sizes)))
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if sum(x is not None for x in (self.num_kv_blocks, self.kv_cache_memory, self.gpu_memory_utilization)) > 1:
            raise ValueError("give at most one of num_kv_blocks, kv_cache_memory and gpu_memory_utilization")
        u = self.gpu_memory_utilization
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization must be a fraction in (0, 1], got {u!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.structured_outputs_backend not in STRUCTURED_OUTPUTS_BACKENDS:
            raise ValueError(f"structured_outputs_backend must be one of {STRUCTURED_OUTPUTS_BACKENDS}, "
                             f"got {self.structured_outputs_backend!r}")
        if not isinstance(self.grammar_compile_timeout, (int, float)) or not self.grammar_compile_timeout > 0:
            raise ValueError(f"grammar_compile_timeout must be > 0 seconds, got {self.grammar_compile_timeout!r}")
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_cpu_loras is not None and (not isinstance(self.max_cpu_loras, int)
                                               or self.max_cpu_loras < self.max_loras):
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras!r}) must be >= max_loras ({self.max_loras})")
        if self.enable_lora and self.decode_capture in ("on", "native"):
            raise ValueError(f"decode_capture {self.decode_capture!r} does not run LoRA steps yet: "
                             "use it without enable_lora")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}")
        if not isinstance(self.distributed_timeout, (int, float)) or not self.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout must be > 0 seconds, got {self.distributed_timeout!r}")
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ValueError(f"nnodes must be an integer >= 1, got {self.nnodes!r}")
        if isinstance(self.master_port, bool) or not isinstance(self.master_port, int) \
                or not 1 <= self.master_port <= 65535:
            raise ValueError(f"master_port must be a TCP port (1-65535), got {self.master_port!r}")
        if self.enable_lora and self.world_size > 1:
            raise ValueError("LoRA adapters are not sharded for tensor parallelism yet: use enable_lora with "
                             "tensor_parallel_size 1")
